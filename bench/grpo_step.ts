// One whole GRPO training step of the stories260K recipe (recipes/stories_grpo/run.sh,
// its full-size settings: 16 prompts x n=8 responses of up to 64 tokens, KL loss
// against the reference, 2 ranks), run through runPpo (what `verl train` calls) with
// the file logger. Validation and checkpoints are off so every step is the same work;
// the first --warmup steps are not counted. Figures: timing_s/step and its breakdown
// (gen, reward, old_log_prob, ref, adv, update_actor), median/min/max over the steps.
// --optimizer replicated keeps a whole optimizer on every rank (fsdp_size=1) instead of the
// default ZeRO-1 shards (fsdp_size=-1; bench/zero_optimizer.ts compares the two).
// Run: node dist/bench/grpo_step.js [--reps 4] [--warmup 1] [--ranks 2] [--optimizer sharded|replicated]
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { resolveBackendName } from "../src/engine/index.js";
import { runPpo } from "../src/trainer/ppo/index.js";
import { packageRoot } from "../src/utils/paths.js";
import {
  emit, intFlag, loadAvg1m, OPENINGS, machine, parseBenchArgs, runMain, stats, STORIES_ABSENT, storiesConfig, storiesPath, type Stats,
} from "./common.js";

const NAME = "grpo_step";


/** The recipe's rows: story openings, every row asking for the word 'dog'. */
function writeRows(file: string, rows: number): void {
  const lines = Array.from({ length: rows }, (_, i) => JSON.stringify({
    data_source: "tinystories/mention",
    prompt: [{ role: "user", content: OPENINGS[i % OPENINGS.length] }],
    ability: "story",
    reward_model: { style: "rule", ground_truth: "dog" },
    extra_info: { index: i },
  }));
  writeFileSync(file, `${lines.join("\n")}\n`);
}

async function main(): Promise<void> {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 4 });
  const bin = storiesPath();
  if (!bin) return emit({ name: NAME, skipped: STORIES_ABSENT });
  const load0 = loadAvg1m();
  const world = intFlag(args, "ranks", 2);
  const optimizer = args.extra.get("optimizer") ?? "sharded";
  if (optimizer !== "sharded" && optimizer !== "replicated") throw new Error(`grpo_step: --optimizer must be sharded or replicated, got '${optimizer}'`);
  const steps = args.warmup + args.reps;
  const out = join(packageRoot, "outputs", "bench", "grpo_step");
  mkdirSync(join(out, "data"), { recursive: true });
  writeRows(join(out, "data", "train.jsonl"), 64);
  const metricsFile = join(out, "metrics.jsonl");
  process.env.VERL_FILE_LOGGER_PATH = metricsFile;
  const config = storiesConfig(bin, world, [
    `data.train_files=${join(out, "data", "train.jsonl")}`, `data.val_files=${join(out, "data", "train.jsonl")}`,
    "data.max_prompt_length=16", "actor_rollout_ref.actor.optim.lr=5e-4",
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.05", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
    `custom_reward_function.path=${join(packageRoot, "recipes", "stories_grpo", "reward.ts")}`, "custom_reward_function.name=compute_score",
    "trainer.logger=[file]", "trainer.project_name=verl_ts_bench", "trainer.experiment_name=grpo_step",
    `trainer.default_local_dir=${join(out, "checkpoints")}`, "trainer.resume_mode=disable",
    "data.train_batch_size=16", "data.max_response_length=64", "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    `trainer.total_training_steps=${steps}`, "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
    `actor_rollout_ref.actor.fsdp_config.fsdp_size=${optimizer === "sharded" ? -1 : 1}`,
  ]);
  const backend = await resolveBackendName(String((config.trainer as Record<string, unknown>).device));
  await runPpo(config);
  // What the file logger wrote: one JSON object per step.
  const lines = readFileSync(metricsFile, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as Record<string, unknown>);
  const stepsLogged = lines.map((l) => ((l.data ?? l) as Record<string, unknown>)).filter((m) => typeof m["timing_s/step"] === "number");
  if (stepsLogged.length !== steps) throw new Error(`grpo_step: the file logger holds ${stepsLogged.length} steps with timing_s/step, expected ${steps} (${metricsFile})`);
  const timed = stepsLogged.slice(args.warmup);
  const timing: Record<string, Stats> = {};
  for (const key of Object.keys(timed[0]!).filter((k) => k.startsWith("timing_s/")).sort()) {
    timing[key.slice("timing_s/".length)] = stats(timed.map((m) => m[key] as number));
  }
  const num = (k: string) => stats(timed.map((m) => m[k] as number));
  emit({
    name: NAME,
    config: {
      recipe: "recipes/stories_grpo/run.sh (full size)", path: "runPpo (verl train)", ranks: world, optimizer,
      prompts: 16, n: 8, max_response_length: 64, kl_loss: "low_var_kl 0.05", validation: "off", checkpoints: "off",
      steps, warmup_steps: args.warmup, metrics_file: metricsFile,
    },
    figures: {
      step_seconds: timing.step, timing_s: timing,
      response_length_mean: num("response_length/mean"), throughput_tokens_per_s_per_rank: num("perf/throughput"),
    },
    machine: machine(`${backend} (workers), cpu (driver)`, load0),
  });
}

runMain(NAME, main);
