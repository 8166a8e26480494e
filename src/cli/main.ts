// The `verl` command line: subcommands that compose a config from conf/ plus
// Hydra-style overrides, print it (--cfg job) or hand it to the command module.
import { mkdirSync, realpathSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Command, CommanderError, InvalidArgumentError, Option } from "commander";
import { checkKeyKinds, ConfigError, getPath, keyReportWarning, loadConfigDetailed, toYaml, validateDevice, validatePpoConfig, type Config } from "../config/index.js";
import { packageRoot } from "../utils/paths.js";
import { setPath } from "../config/tree.js";
import { expandHome } from "../data/home_path.js";
import type { CommandContext } from "./context.js";

type Runner = (ctx: CommandContext) => Promise<void>;

/** Keys that name a model or tokenizer: a Hugging Face id there (`Qwen/Qwen2.5-0.5B-Instruct`) resolves through the HF cache. */
const MODEL_PATH_KEYS = [
  "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "critic.model.path", "critic.model.tokenizer_path",
  "reward_model.model.path", "reward_model.model.input_tokenizer", "model.path", "model.tokenizer_path", "model.partial_pretrain",
];

/** Hub ids under MODEL_PATH_KEYS replaced by their snapshot folders (cached, else downloaded), before any worker starts. */
async function resolveHubModels(config: Config): Promise<void> {
  const seen = new Map<string, Promise<string>>();
  const { resolveModelPath } = await import("../utils/hf_hub.js");
  for (const key of MODEL_PATH_KEYS) {
    const v = getPath(config, key);
    if (typeof v !== "string" || v === "" || v === "scratch" || v.startsWith("char:")) continue;
    if (!seen.has(v)) seen.set(v, resolveModelPath(v, key));
    const local = await seen.get(v)!;
    if (local !== v) setPath(config, key.split("."), local, false);
  }
}

/**
 * As Hydra does for verl's runs: the resolved config printed at start, and saved with the overrides in
 * `<trainer.default_local_dir>/.hydra/` (config.yaml, overrides.yaml), beside the checkpoints.
 */
function recordConfig(config: Config, overrides: readonly string[]): void {
  const dir = getPath(config, "trainer.default_local_dir");
  process.stdout.write(`resolved config:\n${toYaml(config)}`);
  if (typeof dir !== "string" || dir === "") return;
  const hydra = join(expandHome(dir), ".hydra");
  mkdirSync(hydra, { recursive: true });
  for (const [name, text] of [["config.yaml", toYaml(config)], ["overrides.yaml", toYaml(overrides as unknown as Config)]] as const) {
    const tmp = join(hydra, `.${name}.${process.pid}.tmp`);
    writeFileSync(tmp, text);
    renameSync(tmp, join(hydra, name));
  }
  process.stdout.write(`config saved: ${join(hydra, "config.yaml")}\n`);
}

const LOG_LEVELS = ["trace", "debug", "info", "warn", "error", "fatal", "silent"];

/** Each config-driven subcommand, its root config and what it does. */
// `example`: overrides that exist in that command's own config (the help text shows them with --cfg job).
const CONFIG_COMMANDS = [
  { name: "train", config: "ppo_trainer", summary: "RL training (PPO, GRPO, RLOO, ...) of a policy", example: "algorithm.adv_estimator=grpo trainer.log_level=debug" },
  { name: "sft", config: "sft_trainer", summary: "supervised fine-tuning on prompt/response pairs or conversations (--config-name sft_trainer_engine: verl.trainer.sft_trainer)", example: "data.train_files=train.parquet trainer.log_level=debug" },
  { name: "generate", config: "generation", summary: "offline generation: add a `responses` column to a parquet of prompts", example: "data.path=prompts.parquet data.output_path=gen.parquet" },
  { name: "eval", config: "evaluation", summary: "offline scoring of a generated parquet", example: "data.path=gen.parquet custom_reward_function.path=my_reward.mjs" },
] as const;

async function loadRunner(name: string): Promise<Runner> {
  const mod = (await import(`./commands/${name}.js`)) as { run?: Runner };
  if (typeof mod.run !== "function") throw new Error(`src/cli/commands/${name}.ts does not export run(ctx)`);
  return mod.run;
}

/** trainer.log_level, checked; undefined when the config has none. */
function logLevelOf(config: Config): string | undefined {
  const level = getPath(config, "trainer.log_level");
  if (level === undefined || level === null) return undefined;
  if (typeof level !== "string" || !LOG_LEVELS.includes(level)) {
    throw new ConfigError(`trainer.log_level is ${JSON.stringify(level)}; it must be one of ${LOG_LEVELS.join(", ")}`);
  }
  return level;
}

async function applyLogLevel(level: string | undefined): Promise<void> {
  if (level === undefined) return;
  // Loaded here, not at the top: --cfg and --help never need pino.
  const { setLogLevel } = await import("../utils/logger.js");
  setLogLevel(level);
}

/** Hydra's short flags -cp/-cn and its spelling of --cfg=job, as commander options. */
function normalizeArgv(argv: readonly string[]): string[] {
  return argv.map((a) => (a === "-cp" ? "--config-path" : a === "-cn" ? "--config-name" : a));
}

function rejectStrayOptions(overrides: readonly string[]): void {
  const stray = overrides.find((o) => o.startsWith("-"));
  if (stray) throw new ConfigError(`unknown option '${stray}' (overrides are written key=value; see --help)`);
}

function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(join(packageRoot, "package.json"), "utf8")) as { version?: string };
    return pkg.version ?? "0.0.0";
  } catch {
    return "0.0.0";
  }
}

export function buildProgram(): Command {
  const program = new Command("verl")
    .description("verl-ts: reinforcement learning for language models, configured like verl")
    .version(packageVersion())
    .exitOverride()
    .showSuggestionAfterError()
    // `verl run SCRIPT --flag`: options after the script are the script's (passThroughOptions)
    .enablePositionalOptions();

  for (const c of CONFIG_COMMANDS) {
    program
      .command(c.name)
      .description(`${c.summary} (config: ${c.config})`)
      .argument("[overrides...]", "Hydra-style overrides: a.b=v  +a.b=v  ++a.b=v  ~a.b  group=option")
      .option("--cfg <what>", "print the resolved config (job) as YAML and exit without running")
      .option("--config-path <dir>", "a folder of configs searched before the package's conf/ (Hydra -cp)")
      .option("--config-name <name>", "the root config (Hydra -cn)", c.config)
      .allowUnknownOption()
      .addHelpText("after", `\nExamples:\n  verl ${c.name} --cfg job\n  verl ${c.name} ${c.example} --cfg job\nSee docs/configuration.md for the override grammar.`)
      .action(async (overrides: string[], opts: { cfg?: string; configPath?: string; configName: string }) => {
        rejectStrayOptions(overrides);
        if (opts.cfg !== undefined && opts.cfg !== "job" && opts.cfg !== "all") {
          throw new ConfigError(`--cfg ${opts.cfg}: only 'job' (or 'all', the same here) is supported`);
        }
        const { config, defaults, raw } = loadConfigDetailed({ configName: opts.configName, configPath: opts.configPath, overrides });
        const level = logLevelOf(config);
        if (opts.cfg !== undefined) {
          process.stdout.write(toYaml(config));
          return;
        }
        const warning = keyReportWarning(checkKeyKinds(defaults, raw));
        if (warning) process.stderr.write(`${warning}\n`);
        validateDevice(config);
        if (c.name === "train") validatePpoConfig(config);
        await applyLogLevel(level);
        await resolveHubModels(config);
        if (c.name === "train" || c.name === "sft") recordConfig(config, overrides);
        // trainer.device=auto says here, once, why it is not using tfjs-node when that is absent.
        if ((getPath(config, "trainer.device") ?? "auto") === "auto" && getPath(config, "trainer") !== undefined) {
          await (await import("../engine/backend.js")).resolveBackendName("auto");
        }
        const run = await loadRunner(c.name);
        await run({ config, overrides, options: { ...opts } });
      });
  }

  program
    .command("run")
    .description("run one of verl's shell scripts as it is: its python3 -m verl.trainer.* calls run the matching verl subcommand")
    .argument("<script>", "the script (bash)")
    .argument("[args...]", "the script's own arguments (its \"$@\")")
    .allowUnknownOption()
    .passThroughOptions()
    .action(async (script: string, args: string[]) => {
      const run = await loadRunner("run");
      await run({ config: {}, overrides: [], options: { script, args } });
    });

  program
    .command("preprocess")
    .description("write a data set as verl-layout parquet files (train.parquet, test.parquet)")
    .argument("<dataset>", "gsm8k, arithmetic, ...")
    // verl's flags with verl's meanings (examples/data_preprocess/*.py); hyphenated spellings are hidden aliases.
    .option("--local_dataset_path <path>", "the raw data set (gsm8k: train.jsonl/test.jsonl or Hugging Face's main/*.parquet)")
    .option("--local_save_dir <dir>", "where to write train.parquet and test.parquet (default ~/data/<dataset>)")
    .option("--local_dir <dir>", "deprecated, as in verl: the same as --local_save_dir (the output)")
    .addOption(new Option("--local-dataset-path <path>").hideHelp())
    .addOption(new Option("--local-save-dir <dir>").hideHelp())
    .addOption(new Option("--local-dir <dir>").hideHelp())
    .addOption(new Option("--output-dir <dir>").hideHelp())
    .addOption(new Option("--hdfs_dir <dir>").hideHelp())
    .option("--agent", "the tool-agent variant (agent_name, tools_kwargs, interaction_kwargs)")
    .option("--num-train <n>", "rows in the train split", parseCount)
    .option("--num-test <n>", "rows in the test split", parseCount)
    .option("--seed <s>", "seed for generated or sampled rows", parseCount)
    .option("--digits <n>", "arithmetic: the largest operand's number of digits", parseCount)
    .action(async (dataset: string, opts: Record<string, unknown>) => {
      const run = await loadRunner("preprocess");
      await run({ config: {}, overrides: [], options: { dataset, ...opts } });
    });

  program
    .command("download")
    .description("fetch a Hugging Face repo into the HF cache (as `huggingface-cli download`) and print its local folder")
    .argument("<repo_id>", "e.g. karpathy/tinyllamas or openai/gsm8k")
    .option("--include <glob...>", "only these files (e.g. 'stories260K/*')")
    .option("--repo-type <type>", "model or dataset", "model")
    .option("--revision <rev>", "branch, tag or commit", "main")
    .action(async (repoId: string, opts: { include?: string[]; repoType: string; revision: string }) => {
      if (opts.repoType !== "model" && opts.repoType !== "dataset") throw new ConfigError(`--repo-type ${opts.repoType}: model or dataset`);
      const { snapshotDownload } = await import("../utils/hf_hub.js");
      process.stdout.write(`${await snapshotDownload(opts.repoType, repoId, { revision: opts.revision, allow: opts.include })}\n`);
    });

  program
    .command("export")
    .description("copy a checkpoint's actor as a Hugging Face folder that transformers loads (verl's model_merger merge)")
    .argument("<checkpoint>", "trainer.default_local_dir (its latest step), a global_step_N folder, or its actor/ folder")
    .requiredOption("--target_dir <dir>", "where to write config.json, model.safetensors and the tokenizer")
    .addOption(new Option("--target-dir <dir>").hideHelp())
    .action(async (checkpoint: string, opts: Record<string, unknown>) => {
      const run = await loadRunner("export");
      await run({ config: {}, overrides: [], options: { checkpoint, ...opts } });
    });

  program
    .command("worker")
    .description("join a run spanning hosts as this host's agent (trainer.nnodes > 1; docs/distributed.md)")
    .option("--join <host:port>", "the driver's address (default MASTER_ADDR:MASTER_PORT)")
    .option("--name <name>", "this host's name in logs and errors (default: its host name)")
    .option("--bind <addr>", "address for this host's ring endpoint (default: the one it reaches the driver from)")
    .option("--ring-port <port>", "port for this host's ring endpoint (default: any free one)")
    .option("--token-file <file>", "the run's join token (default VERL_JOIN_TOKEN, else VERL_JOIN_TOKEN_FILE or ~/.verl-ts/join_token)")
    .option("--node-rank <n>", "this host's node rank (default NODE_RANK, else the driver picks)")
    .option("--wait-s <s>", "how long to wait for the token file and the driver (default 600)")
    .action(async (opts: Record<string, unknown>) => {
      const run = await loadRunner("worker");
      await run({ config: {}, overrides: [], options: { ...opts } });
    });

  program
    .command("plot")
    .description("draw the curves of a metrics JSONL file (the `file` logger's output)")
    .argument("<metrics>", "metrics.jsonl")
    .option("--out <dir>", "where to write the plots")
    .action(async (metrics: string, opts: Record<string, unknown>) => {
      const run = await loadRunner("plot");
      await run({ config: {}, overrides: [], options: { metrics, ...opts } });
    });

  return program;
}

function parseCount(text: string): number {
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n)) throw new InvalidArgumentError("expected a non-negative integer");
  return n;
}

/** Run the CLI; resolves to the process exit code (errors are printed, not thrown). */
export async function runCli(argv: readonly string[] = process.argv): Promise<number> {
  try {
    await buildProgram().parseAsync(normalizeArgv(argv));
    return 0;
  } catch (e) {
    if (e instanceof CommanderError) return e.exitCode; // commander has printed its own message
    const err = e as { message?: string; exitCode?: unknown; stack?: string };
    process.stderr.write(`error: ${err.message ?? String(e)}\n`);
    if (process.env.VERL_DEBUG && err.stack) process.stderr.write(`${err.stack}\n`);
    return typeof err.exitCode === "number" ? err.exitCode : 1;
  }
}

function isEntryPoint(): boolean {
  const arg = process.argv[1];
  if (!arg) return false;
  try {
    return realpathSync(arg) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  // Exit explicitly: a command that leaves a worker pool or timer alive must not hang the shell.
  process.exit(await runCli());
}
