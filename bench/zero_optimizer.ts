// ZeRO-1 against a replicated optimizer on the CPU (wasm ranks): per rank, the optimizer step's
// seconds (gradient reduce, clip, AdamW, and for shards the all-gather) and the bytes of AdamW
// state, for 1 rank and for 2 ranks replicated and sharded, at stories260K's size (260,032
// parameters) and a larger vector (--numel, default 16M); then whole GRPO steps of the stories
// recipe (bench/grpo_step.ts, each case in its own process) with 1 rank and 2 ranks both ways.
// Each optimizer case runs in a fresh process (the wasm heap never shrinks: its size is the case's peak).
// --backend webgpu times the optimizer part on a GPU (one rank then steps on the device; the recipe
// part is CPU only): bash scripts/gpu-run.sh node dist/bench/zero_optimizer.js --backend webgpu --parts optimizer --numel 358000000
// (two ranks there sum the gradient on their GPUs, workers/dp_device_reduce.ts; VERL_WEBGPU_DEVICE_REDUCE=0 in the
// environment, which each case's process inherits, times the host sum instead)
// Each optimizer case also reports where a rank's step goes: the phases DataParallelOptimizer.step
// marks under VERL_PROFILE_UPDATE=1 (read-back, copy-in, reduce, norm, AdamW, all-gather, upload),
// the median ms over the timed steps, per rank (phase_ms_per_rank).
// Run: node dist/bench/zero_optimizer.js [--reps 5] [--warmup 1] [--numel 16000000] [--recipe-reps 3] [--parts optimizer,recipe] [--backend wasm]
//   [--cases ranks_1,ranks_2_replicated,ranks_2_sharded] [--sizes stories,large]
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { ClassWithInitArgs, ResourcePool, WorkerGroup } from "../src/single_controller/index.js";
import { emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain, stats, type BenchArgs } from "./common.js";
import type { OptimizerTiming } from "./zero_worker.js";

const NAME = "zero_optimizer";
const STORIES_NUMEL = 260_032;
const MiB = 2 ** 20;
const CASES = [
  { name: "ranks_1", world: 1, shards: 1 },
  { name: "ranks_2_replicated", world: 2, shards: 1 },
  { name: "ranks_2_sharded", world: 2, shards: 2 },
] as const;

/** One optimizer case in this process: every rank's timings. */
async function optimizerCase(world: number, shards: number, numel: number, backend: string, args: BenchArgs): Promise<OptimizerTiming[]> {
  const pool = new ResourcePool({ worldSize: world, name: "zero_bench" });
  try {
    const wg = (await WorkerGroup.create(pool, new ClassWithInitArgs(new URL("./zero_worker.js", import.meta.url), "ZeroBenchWorker"))) as unknown as {
      timeSteps(s: { backend: string; numel: number; shards: number; warmup: number; reps: number }): Promise<OptimizerTiming[]>;
    };
    return await wg.timeSteps({ backend, numel, shards, warmup: args.warmup, reps: args.reps });
  } finally {
    await pool.destroy();
  }
}

/**
 * The phase profiles the ranks printed on stderr (one JSON line per rank and step), the warm-up
 * steps left out: per rank, each phase's median ms over the timed steps.
 */
function phaseMedians(stderr: string, warmup: number): Record<string, Record<string, number>> {
  const byRank = new Map<string, Record<string, number>[]>();
  for (const line of stderr.split("\n")) {
    const at = line.indexOf('{"profile":"optimizer.step rank ');
    if (at < 0) continue;
    const p = JSON.parse(line.slice(at)) as { profile: string; ms: Record<string, number> };
    const rank = p.profile.slice("optimizer.step ".length);
    byRank.set(rank, [...(byRank.get(rank) ?? []), p.ms]);
  }
  const out: Record<string, Record<string, number>> = {};
  for (const [rank, steps] of [...byRank].sort()) {
    const timed = steps.slice(warmup), phases = [...new Set(timed.flatMap((m) => Object.keys(m)))];
    out[rank] = Object.fromEntries(phases.map((k) => [k, Math.round(stats(timed.map((m) => m[k] ?? 0)).median * 10) / 10]));
  }
  return out;
}

function summarise(ranks: OptimizerTiming[]): Record<string, unknown> {
  // a step ends when its slowest rank ends
  const perStep = ranks[0]!.stepSeconds.map((_, i) => Math.max(...ranks.map((r) => r.stepSeconds[i]!)));
  return {
    step_seconds: stats(perStep),
    optimizer_state_mib_per_rank: ranks.map((r) => Number((r.stateBytes / MiB).toFixed(3))),
    wasm_heap_mib_per_rank: ranks.map((r) => Number((r.wasmHeapBytes / MiB).toFixed(1))),
    tensor_mib_per_rank: ranks.map((r) => Number((r.tensorBytes / MiB).toFixed(1))),
  };
}

/** Runs this file again for one case, reading its JSON line. */
function child(argv: string[], warmup: number): Record<string, unknown> {
  const env = { ...process.env, VERL_PROFILE_UPDATE: "1" };
  const res = spawnSync(process.execPath, [fileURLToPath(import.meta.url), ...argv], { encoding: "utf8", maxBuffer: 64 * MiB, env });
  const line = res.stdout.split("\n").reverse().find((l) => l.startsWith("{"));
  if (res.status !== 0 || !line) throw new Error(`${NAME} case ${argv.join(" ")} failed (exit ${res.status}): ${res.stderr.slice(-2000)}`);
  return { ...(JSON.parse(line) as Record<string, unknown>), phase_ms_per_rank: phaseMedians(res.stderr, warmup) };
}

function grpoStep(argv: string[]): Record<string, unknown> {
  const res = spawnSync(process.execPath, [fileURLToPath(new URL("./grpo_step.js", import.meta.url)), ...argv], { encoding: "utf8", maxBuffer: 64 * MiB });
  const line = res.stdout.split("\n").reverse().find((l) => l.startsWith("{"));
  if (res.status !== 0 || !line) throw new Error(`grpo_step ${argv.join(" ")} failed (exit ${res.status}): ${res.stderr.slice(-2000)}`);
  const out = JSON.parse(line) as { figures?: { step_seconds?: unknown; timing_s?: Record<string, unknown> }; skipped?: string };
  if (out.skipped) return { skipped: out.skipped };
  return { step_seconds: out.figures?.step_seconds, update_actor_seconds: out.figures?.timing_s?.update_actor };
}

async function main(): Promise<void> {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 5 });
  const caseFlag = args.extra.get("case");
  const backend = args.extra.get("backend") ?? "wasm";
  if (caseFlag) {
    // a child: one case, one JSON line
    const c = CASES.find((x) => x.name === caseFlag);
    if (!c) throw new Error(`${NAME}: unknown --case '${caseFlag}'`);
    const numel = intFlag(args, "numel", STORIES_NUMEL);
    process.stdout.write(`${JSON.stringify(summarise(await optimizerCase(c.world, c.shards, numel, backend, args)))}\n`);
    return;
  }
  const load0 = loadAvg1m();
  const parts = (args.extra.get("parts") ?? "optimizer,recipe").split(",");
  const large = intFlag(args, "numel", 16_000_000);
  const cases = (args.extra.get("cases") ?? CASES.map((c) => c.name).join(",")).split(",");
  const sizes = (args.extra.get("sizes") ?? "stories,large").split(",");
  for (const c of cases) if (!CASES.some((x) => x.name === c)) throw new Error(`${NAME}: unknown case '${c}' in --cases`);
  const figures: Record<string, unknown> = {};
  if (parts.includes("optimizer")) {
    for (const numel of [...(sizes.includes("stories") ? [STORIES_NUMEL] : []), ...(sizes.includes("large") ? [large] : [])]) {
      const row: Record<string, unknown> = {};
      for (const c of CASES.filter((x) => cases.includes(x.name))) {
        row[c.name] = child(["--case", c.name, "--numel", String(numel), "--reps", String(args.reps), "--warmup", String(args.warmup), "--backend", backend], args.warmup);
      }
      figures[`optimizer_step_numel_${numel}`] = row;
    }
  }
  if (parts.includes("recipe")) {
    const reps = String(intFlag(args, "recipe-reps", 3));
    figures.grpo_step_stories = {
      ranks_1: grpoStep(["--ranks", "1", "--reps", reps, "--warmup", "1"]),
      ranks_2_replicated: grpoStep(["--ranks", "2", "--reps", reps, "--warmup", "1", "--optimizer", "replicated"]),
      ranks_2_sharded: grpoStep(["--ranks", "2", "--reps", reps, "--warmup", "1", "--optimizer", "sharded"]),
    };
  }
  emit({
    name: NAME,
    config: {
      backend: `${backend} ranks (worker threads)`, grad_clip: 1.0, optimizer: "AdamW", reps: args.reps, warmup: args.warmup,
      cases: CASES.map((c) => `${c.name}: ${c.world} rank(s), ${c.shards} shard(s)`),
      recipe: "bench/grpo_step.ts (recipes/stories_grpo full size), seconds per whole step and in update_actor",
    },
    figures,
    machine: machine(`${backend} (ranks)`, load0),
  });
}

runMain(NAME, main);
