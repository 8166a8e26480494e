// Memory over many steps. A "step" here is the workers' share of a GRPO step at a
// small size: generateSequences (8 prompts x 32 new tokens), computeLogProb,
// computeRefLogProb, then updateActor (KL loss on) on the 8 responses, through a
// 2-rank WorkerGroup of ActorRolloutRefWorker (role actor_rollout_ref). After
// --warmup steps (default 20: JIT tiers and allocator pools settle first) the live
// tensor count of each rank (tf.memory().numTensors in its thread) and the memory
// figures are read, then again after --steps more steps.
// Figures: per rank tensors/bytes/wasm heap/V8 heap before and after; the process's
// RSS before, after, growth and its peak (the ranks are threads of one process, so
// resident memory is one figure for all of them plus the driver). The growth figure
// compares RSS after a full GC in the driver and every rank (what is still referenced);
// the RSS as it stands, without a GC, is reported beside it.
// Run: node dist/bench/memory.js [--steps 100] [--warmup 20] [--ranks 2]
import { leftPadPrompts } from "../src/rollout/index.js";
import { Rng } from "../src/utils/rng.js";
import { tensor } from "../src/protocol/tensor.js";
import {
  emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain, STORIES_ABSENT, storiesConfig, storiesPath,
} from "./common.js";
import { withActorGroup, type ActorGroup } from "./groups.js";
import { collectGarbage, type RankMemory } from "./bench_worker.js";

const NAME = "memory";
const MiB = 2 ** 20;

/** One worker-side GRPO step on `prompts`; returns nothing (the point is what stays behind). */
async function step(g: ActorGroup, prompts: ReturnType<typeof leftPadPrompts>, rng: Rng): Promise<void> {
  const gen = await g.proto("generateSequences", prompts);
  gen.metaInfo.temperature = 1.0;
  const old = await g.proto("computeLogProb", gen);
  const ref = await g.proto("computeRefLogProb", gen);
  const batch = gen.union(old.select(["old_log_probs"])).union(ref);
  const [B, R] = batch.batch.responses!.shape as [number, number];
  const adv = new Float32Array(B * R);
  for (let b = 0; b < B; b++) adv.fill(rng.normal(), b * R, (b + 1) * R);
  batch.batch.advantages = tensor(adv, [B, R], "float32");
  await g.proto("updateActor", batch);
}

const rssMiB = () => Number((process.memoryUsage().rss / MiB).toFixed(1));

function perRank(m: RankMemory[]) {
  return m.map((r) => ({
    rank: r.rank, num_tensors: r.numTensors, tensor_MiB: Number((r.tensorBytes / MiB).toFixed(2)),
    wasm_heap_MiB: Number((r.wasmHeapBytes / MiB).toFixed(1)), v8_heap_used_MiB: Number((r.v8HeapUsedBytes / MiB).toFixed(1)),
    array_buffers_MiB: Number((r.arrayBufferBytes / MiB).toFixed(1)),
  }));
}

async function main(): Promise<void> {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 1, warmup: 20 });
  const bin = storiesPath();
  if (!bin) return emit({ name: NAME, skipped: STORIES_ABSENT });
  const load0 = loadAvg1m();
  const steps = intFlag(args, "steps", 100), world = intFlag(args, "ranks", 2);
  const B = 8, newTokens = 32;
  const config = storiesConfig(bin, world, [
    `data.train_batch_size=${B}`, "data.max_prompt_length=8", `data.max_response_length=${newTokens}`,
    `actor_rollout_ref.actor.ppo_mini_batch_size=${B}`, `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${B / world}`,
    `actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${B / world}`, `actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=${B / world}`,
    "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.05", "actor_rollout_ref.actor.optim.lr=5e-4",
  ]);
  const openings = [[1, 403, 407, 261, 378], [1, 403], [1, 378, 261, 407], [1, 346, 280]];
  const prompts = leftPadPrompts(Array.from({ length: B }, (_, i) => openings[i % openings.length]!), 0);
  const rng = new Rng(3);
  const result = await withActorGroup(config, "actor_rollout_ref", async (g) => {
    for (let i = 0; i < args.warmup; i++) await step(g, prompts, rng);
    // Resident memory as it stands, then after a full GC in the driver and every rank (what is still referenced).
    const snapshot = async () => {
      const raw = rssMiB();
      collectGarbage();
      const ranks = await g.memory(true);
      return { raw, collected: rssMiB(), ranks, driverHeapMiB: Number((process.memoryUsage().heapUsed / MiB).toFixed(1)) };
    };
    const before = await snapshot();
    let rssPeakSampled = before.raw;
    const trajectory: number[] = [];
    const t0 = performance.now();
    for (let i = 1; i <= steps; i++) {
      await step(g, prompts, rng);
      rssPeakSampled = Math.max(rssPeakSampled, rssMiB());
      if (i % Math.max(1, Math.floor(steps / 10)) === 0 && i < steps) trajectory.push((await snapshot()).collected);
    }
    const seconds = (performance.now() - t0) / 1000;
    const after = await snapshot();
    return { backend: g.backend, before, after, rssPeakSampled, trajectory, seconds };
  });
  const growth = (a: number, b: number) => Number((((b - a) / a) * 100).toFixed(2));
  const tensorsFlat = result.before.ranks.every((b, i) => b.numTensors === result.after.ranks[i]!.numTensors);
  emit({
    name: NAME,
    config: {
      model: "stories260K", ranks: world, steps, warmup_steps: args.warmup,
      step: `generateSequences(${B} prompts x ${newTokens} tokens) + computeLogProb + computeRefLogProb + updateActor (KL loss), WorkerGroup(ActorRolloutRefWorker)`,
    },
    figures: {
      live_tensors_identical: tensorsFlat,
      // Per rank, after a full GC in its thread.
      ranks_before: perRank(result.before.ranks),
      ranks_after: perRank(result.after.ranks),
      driver_heap_used_MiB: { before: result.before.driverHeapMiB, after: result.after.driverHeapMiB },
      process_rss_MiB: {
        before: result.before.raw, after: result.after.raw, before_gc: result.before.collected, after_gc: result.after.collected,
        peak_sampled: result.rssPeakSampled, after_gc_every_tenth_of_the_steps: [...result.trajectory, result.after.collected],
      },
      // ru_maxrss: the process's peak resident set since it started (driver + all rank threads).
      process_peak_rss_MiB: Number((process.resourceUsage().maxRSS / 1024).toFixed(1)),
      // Growth of what is still referenced (after a full GC everywhere) and of RSS as it stands.
      rss_growth_pct: growth(result.before.collected, result.after.collected),
      rss_growth_no_gc_pct: growth(result.before.raw, result.after.raw),
      seconds_per_step: Number((result.seconds / steps).toFixed(4)),
    },
    machine: machine(result.backend, load0),
  });
}

runMain(NAME, main);
