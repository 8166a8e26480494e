// verl's Python entry points and the verl-ts subcommand each maps to, for `verl run` (commands/run.ts):
// a launcher call of a verl script (`python3 -m verl.trainer.main_ppo ...`, `torchrun ... -m
// verl.trainer.fsdp_sft_trainer ...`) becomes the argv of a `verl` subcommand with the same
// --config-path/--config-name and overrides. Other entry points are refused by name.

interface EntryPoint {
  command: "train" | "sft" | "generate" | "eval";
  /** The root config verl's module composes when the call names none (the subcommand's default otherwise). */
  configName?: string;
}

/** verl's trainer modules (verl/trainer/*.py with a __main__) that verl-ts runs. */
export const ENTRY_POINTS: Readonly<Record<string, EntryPoint>> = {
  "verl.trainer.main_ppo": { command: "train" },
  "verl.trainer.fsdp_sft_trainer": { command: "sft" },
  "verl.trainer.sft_trainer": { command: "sft", configName: "sft_trainer_engine" },
  "verl.trainer.main_generation": { command: "generate" },
  "verl.trainer.main_eval": { command: "eval" },
};

/** verl's entry points that verl-ts has no counterpart for, and why. */
const REFUSED: Readonly<Record<string, string>> = {
  "verl.trainer.main_generation_server": "verl's generation server (an HTTP rollout server over Ray) is not built in verl-ts; use `verl generate`",
  "verl.trainer.sft_trainer_ray": "verl's Ray-driven SFT trainer is not built in verl-ts; `-m verl.trainer.sft_trainer` maps to `verl sft --config-name sft_trainer_engine`",
};

export interface MappedCall {
  /** argv for the `verl` CLI (subcommand first). */
  argv: string[];
  /** One line per substitution, for the user. */
  notes: string[];
}

export class EntryPointError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "EntryPointError";
  }
}

const show = (words: readonly string[]) => words.map((w) => (/^[\w./=:@,+-]*$/.test(w) && w !== "" ? w : JSON.stringify(w))).join(" ");

/** torchrun's --nproc_per_node (either spelling, `=` or a separate value), if given. */
function nprocPerNode(launcherArgs: readonly string[]): number | undefined {
  for (let i = 0; i < launcherArgs.length; i++) {
    const m = /^--nproc[_-]per[_-]node(?:=(.*))?$/.exec(launcherArgs[i]!);
    if (!m) continue;
    const v = m[1] ?? launcherArgs[i + 1];
    const n = Number(v);
    return Number.isInteger(n) && n > 0 ? n : undefined;
  }
  return undefined;
}

/**
 * The `verl` argv for one launcher call (`python3`, `python` or `torchrun` and its arguments).
 * Throws EntryPointError, naming the call, for anything that is not one of verl's trainer modules.
 */
export function mapLauncherCall(launcher: string, args: readonly string[]): MappedCall {
  const at = args.indexOf("-m");
  const call = `${launcher} ${show(args.slice(0, at >= 0 ? at + 2 : 2))}`.trim();
  if (at < 0 || at + 1 >= args.length) {
    throw new EntryPointError(`\`${call}\` runs no verl module (-m verl.trainer.<name>); verl run maps only ${Object.keys(ENTRY_POINTS).join(", ")}`);
  }
  const module = args[at + 1]!;
  if (REFUSED[module]) throw new EntryPointError(`\`${call}\`: ${REFUSED[module]}`);
  const entry = ENTRY_POINTS[module];
  if (!entry) throw new EntryPointError(`\`${call}\`: ${module} is not a verl entry point verl-ts maps (${Object.keys(ENTRY_POINTS).join(", ")})`);
  const rest: string[] = [];
  let hasConfigName = false;
  const tail = args.slice(at + 2);
  for (let i = 0; i < tail.length; i++) {
    const a = tail[i]!;
    // Hydra's flags, in the spellings verl's scripts use
    const m = /^(--config[-_]path|--config[-_]name|-cp|-cn)(?:=(.*))?$/.exec(a);
    if (m) {
      const name = m[1] === "-cp" || m[1]!.includes("path") ? "--config-path" : "--config-name";
      const value = m[2] ?? tail[++i];
      if (value === undefined) throw new EntryPointError(`\`${call}\`: ${m[1]} has no value`);
      if (name === "--config-name") hasConfigName = true;
      rest.push(name, value);
    } else if (a.trim() !== "") rest.push(a);
  }
  const argv: string[] = [entry.command];
  const notes = [`\`${call}\` -> \`verl ${entry.command}\``];
  if (entry.configName && !hasConfigName) {
    argv.push("--config-name", entry.configName);
    notes.push(`--config-name ${entry.configName} (the config ${module} composes)`);
  }
  argv.push(...rest);
  const nproc = launcher === "torchrun" ? nprocPerNode(args.slice(0, at)) : undefined;
  if (nproc !== undefined && !rest.some((o) => o.startsWith("trainer.n_gpus_per_node="))) {
    argv.push(`trainer.n_gpus_per_node=${nproc}`);
    notes.push(`trainer.n_gpus_per_node=${nproc} (torchrun --nproc_per_node: ranks are worker threads here)`);
  }
  return { argv, notes };
}
