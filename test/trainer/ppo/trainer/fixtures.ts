// A tiny PPO workspace: story-opening prompts as verl-layout parquet files, a
// custom reward function, and the overrides that point a run at them.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfig } from "../../../../src/config/index.js";
import { writeParquet } from "../../../../src/data/index.js";
import { runPpo } from "../../../../src/trainer/main_ppo.js";
import { sharedPath } from "../../../../src/utils/paths.js";

const OPENINGS = [
  "Once upon a time", "One day, a little girl", "Tom had a big red", "The cat saw a", "Lily wanted to play",
  "There was a small dog", "The sun was hot", "Ben and Mia went to", "A bird sang in the", "Mom said",
  "The boy found a", "In the park there was",
];

export interface Workspace {
  dir: string;
  overrides: string[];
}

/** Prompts in verl's row layout; reward = share of letters 'e' in the response (dense enough to learn from). */
export async function makeWorkspace(): Promise<Workspace> {
  const dir = mkdtempSync(join(tmpdir(), "verl-ppo-"));
  const rows = (split: string, texts: string[]) => texts.map((t, i) => ({
    data_source: "stories",
    prompt: [{ role: "user", content: t }],
    ability: "story",
    reward_model: { style: "rule", ground_truth: "e" },
    extra_info: { split, index: i },
  }));
  await writeParquet(join(dir, "train.parquet"), rows("train", OPENINGS.slice(0, 8)));
  await writeParquet(join(dir, "val.parquet"), rows("test", OPENINGS.slice(8)));
  writeFileSync(join(dir, "reward.mjs"), [
    "export function compute_score(dataSource, solution, groundTruth) {",
    "  const letters = solution.replace(/[^a-z]/gi, '');",
    "  if (letters.length === 0) return 0;",
    "  return letters.split(groundTruth).length - 1 === 0 ? 0 : (letters.split(groundTruth).length - 1) / letters.length;",
    "}",
  ].join("\n"));
  return {
    dir,
    overrides: [
      `data.train_files=${join(dir, "train.parquet")}`, `data.val_files=${join(dir, "val.parquet")}`,
      `custom_reward_function.path=${join(dir, "reward.mjs")}`,
      "data.max_prompt_length=12", "data.max_response_length=12", "data.train_batch_size=4", "data.shuffle=true", "data.seed=3",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
      "critic.ppo_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.actor.optim.lr=0.001", "critic.optim.lr=0.001",
      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.seed_per_sample=true",
      "trainer.device=wasm", "trainer.logger=[console,file]", "trainer.val_before_train=false",
      `trainer.default_local_dir=${join(dir, "ckpt")}`, "trainer.project_name=t", "trainer.experiment_name=e",
    ],
  };
}

/** `verl train` in process with `world` ranks and no logger: each step's metrics. */
export async function trainCurves(overrides: string[], world: number): Promise<Record<string, number>[]> {
  const config = loadConfig({ configName: "ppo_trainer", overrides: [...overrides, `trainer.n_gpus_per_node=${world}`, "trainer.logger=[]"] });
  const res = await runPpo(config);
  return res.history.map((h) => h.metrics);
}

/** A from-scratch Llama with a character tokenizer (prompts are longer in characters, hence max_prompt_length 24). */
export function scratchModel(hiddenSize: number, layers: number): string[] {
  return [
    "actor_rollout_ref.model.path=scratch",
    "actor_rollout_ref.model.tokenizer_path=char:abcdefghijklmnopqrstuvwxyz ,.ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    `+actor_rollout_ref.model.override_config.hidden_size=${hiddenSize}`, `+actor_rollout_ref.model.override_config.num_hidden_layers=${layers}`,
    "+actor_rollout_ref.model.override_config.num_attention_heads=2", "data.max_prompt_length=24",
  ];
}

export const stories = (): string | undefined => sharedPath("models", "stories260K", "stories260K.bin");

export const CLI = fileURLToPath(new URL("../../../../src/cli/main.js", import.meta.url));

export interface CliRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs `verl train` in a child process; `onOutput` sees stdout as it arrives (and may kill the child).
 * A child still running after `limitMs` is killed (the run then ends with signal SIGKILL).
 */
export function runTrain(overrides: string[], env: Record<string, string>, onOutput?: (text: string, kill: () => void) => void, limitMs?: number): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, "train", ...overrides], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    const limit = limitMs === undefined ? undefined : setTimeout(() => child.kill("SIGKILL"), limitMs);
    child.on("close", () => clearTimeout(limit));
    let stdout = "", stderr = "";
    child.stdout.on("data", (b: Buffer) => {
      stdout += b.toString();
      onOutput?.(stdout, () => child.kill("SIGKILL"));
    });
    child.stderr.on("data", (b: Buffer) => { stderr += b.toString(); });
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
}

/** The `file` logger's lines, keyed by step (the last line wins). */
export function metricsByStep(jsonl: string): Map<number, Record<string, number>> {
  const out = new Map<number, Record<string, number>>();
  for (const line of jsonl.split("\n")) {
    if (!line.trim()) continue;
    const rec = JSON.parse(line) as { step: number; data: Record<string, number> };
    out.set(rec.step, { ...(out.get(rec.step) ?? {}), ...rec.data });
  }
  return out;
}

/** MFU on the CPU: a fraction of the promised FLOPs, above 0 and at most 1. */
export function assertMfu(m: Record<string, number>, key: string, what: string): void {
  const v = m[key];
  assert.ok(typeof v === "number" && Number.isFinite(v) && v > 0 && v <= 1, `${what}: ${key} = ${v}`);
}

export function assertMemory(m: Record<string, number>, what: string): void {
  for (const k of ["perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb"]) {
    const v = m[k];
    assert.ok(typeof v === "number" && Number.isFinite(v) && v > 0, `${what}: ${k} = ${v}`);
  }
  // wasm: the heap holds every tensor, so what it reserves is at least the tensors' peak
  assert.ok(m["perf/max_memory_reserved_gb"]! >= m["perf/max_memory_allocated_gb"]!, `${what}: reserved < allocated`);
}
