// `verl export CHECKPOINT --target_dir DIR`: the actor of a `verl train`/`verl sft` checkpoint as a
// Hugging Face folder that transformers loads (what verl's `model_merger merge` makes of FSDP shards).
// Checkpoints already hold that folder (global_step_N/actor/huggingface, merged under LoRA); this finds
// it from the run folder, a step or the actor folder, checks it, and copies it via a temp folder.
import { cpSync, existsSync, readFileSync, renameSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { expandHome } from "../../data/home_path.js";
import { CliError, type CommandContext } from "../context.js";

/** The huggingface/ folder a checkpoint path names, or an error saying what was looked for. */
export function findHfExport(checkpoint: string): string {
  const root = expandHome(checkpoint);
  if (!existsSync(root)) throw new CliError(`verl export: ${root} does not exist`, 2);
  const latest = join(root, "latest_checkpointed_iteration.txt");
  const step = existsSync(latest) ? join(root, `global_step_${readFileSync(latest, "utf8").trim()}`) : root;
  const tried = [join(step, "actor", "huggingface"), join(step, "huggingface"), step];
  const found = tried.find((d) => existsSync(join(d, "config.json")) && existsSync(join(d, "model.safetensors")));
  if (!found) {
    throw new CliError(`verl export: no Hugging Face folder (config.json + model.safetensors) in ${root}; looked in ${tried.join(", ")}`, 2);
  }
  return found;
}

export async function run(ctx: CommandContext): Promise<void> {
  const { checkpoint, target_dir, targetDir } = ctx.options as Record<string, string | undefined>;
  const target = target_dir ?? targetDir;
  if (!checkpoint || !target) throw new CliError("verl export: give a checkpoint and --target_dir", 2);
  const src = findHfExport(checkpoint);
  const dest = expandHome(target);
  if (existsSync(dest)) throw new CliError(`verl export: ${dest} exists; give a new folder`, 2);
  const tmp = join(dirname(dest), `.${Date.now()}.export.tmp`);
  cpSync(src, tmp, { recursive: true, dereference: true });
  renameSync(tmp, dest);
  rmSync(tmp, { recursive: true, force: true });
  process.stdout.write(`exported ${src} -> ${dest} (load it with transformers: AutoModelForCausalLM.from_pretrained("${dest}"))\n`);
}
