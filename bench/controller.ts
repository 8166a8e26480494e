// Single-controller overheads: microseconds per ONE_TO_ALL no-op call on 1, 2
// and 4 ranks, and all-reduce throughput for a 16 MiB float32 buffer on 2 and 4
// ranks. Prints one JSON line. Run: node dist/bench/controller.js
// (VERL_BENCH_CALLS, VERL_BENCH_ALLREDUCE_ITERS, VERL_BENCH_CHUNK_ELEMS tune it).
// Medians over rounds / iterations, so a busy machine disturbs the figures less.
import { isMainThread } from "node:worker_threads";
import { fileURLToPath } from "node:url";
import os from "node:os";
import { ClassWithInitArgs, Dispatch, ResourcePool, Worker, WorkerGroup, register } from "../src/single_controller/index.js";
import { threadCpuMs } from "./thread_cpu.js";

export class BenchWorker extends Worker {
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  noop(): null {
    return null;
  }

  /** Milliseconds of each of `iters` all-reduces of `elems` floats, after one warm-up. */
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  allReduceLoop(elems: number, iters: number): number[] {
    return this.allReduceCpu(elems, iters).times;
  }

  /**
   * allReduceLoop's calls with the CPU ms per call of this rank's thread and of its process's main
   * thread (in a host agent: the thread that owns the ring's sockets); both include the barriers.
   */
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  allReduceCpu(elems: number, iters: number): { times: number[]; rankCpuMs: number; mainCpuMs: number } {
    // Where the trainer's flat gradient lives (DataParallelOptimizer.step): across hosts, in the bridge memory.
    const buf = (this.collective.reduceBuffer?.(elems) ?? new Float32Array(elems)).fill(this.rank + 1);
    this.collective.allReduce(buf, "mean");
    const times: number[] = [];
    const r0 = threadCpuMs(), m0 = threadCpuMs(process.pid);
    for (let i = 0; i < iters; i++) {
      this.collective.barrier();
      const t0 = performance.now();
      this.collective.allReduce(buf, "mean");
      times.push(performance.now() - t0);
    }
    return { times, rankCpuMs: (threadCpuMs() - r0) / iters, mainCpuMs: (threadCpuMs(process.pid) - m0) / iters };
  }
}

const envInt = (name: string, fallback: number): number => {
  const v = Number(process.env[name] ?? fallback);
  if (!Number.isInteger(v) || v < 1) throw new Error(`${name} must be a positive integer`);
  return v;
};

type Bound = Awaited<ReturnType<typeof WorkerGroup.create<BenchWorker>>>;

async function withGroup<T>(worldSize: number, fn: (wg: Bound) => Promise<T>): Promise<T> {
  const chunkElems = process.env.VERL_BENCH_CHUNK_ELEMS ? envInt("VERL_BENCH_CHUNK_ELEMS", 1) : undefined;
  const pool = new ResourcePool({ worldSize, ...(chunkElems ? { chunkElems } : {}) });
  try {
    const wg = await WorkerGroup.create<BenchWorker>(pool, new ClassWithInitArgs(import.meta.url, "BenchWorker"));
    return await fn(wg);
  } finally {
    await pool.destroy();
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

export async function runControllerBench(): Promise<Record<string, unknown>> {
  const calls = envInt("VERL_BENCH_CALLS", 2000);
  const iters = envInt("VERL_BENCH_ALLREDUCE_ITERS", 10);
  const callUs: Record<string, number> = {};
  for (const world of [1, 2, 4]) {
    callUs[String(world)] = await withGroup(world, async (wg) => {
      for (let i = 0; i < 100; i++) await wg.noop();
      const rounds: number[] = [];
      const perRound = Math.max(1, Math.floor(calls / 5));
      for (let k = 0; k < 5; k++) {
        const t0 = performance.now();
        for (let i = 0; i < perRound; i++) await wg.noop();
        rounds.push(((performance.now() - t0) * 1000) / perRound);
      }
      return Math.round(median(rounds));
    });
  }
  const elems = (16 * 1024 * 1024) / 4;
  const mbps: Record<string, number> = {};
  for (const world of [2, 4]) {
    mbps[String(world)] = await withGroup(world, async (wg) => {
      const perRank = await wg.allReduceLoop<number[][]>(elems, iters);
      // An all-reduce is done when the slowest rank is.
      const ms = median(perRank[0]!.map((_, i) => Math.max(...perRank.map((t) => t[i]!))));
      return Math.round((elems * 4) / 1e6 / (ms / 1000));
    });
  }
  return {
    bench: "single_controller",
    cores: os.availableParallelism(),
    one_to_all_noop_call_us: callUs,
    allreduce_16MiB_MB_per_s: mbps,
    calls,
    allreduce_iters: iters,
  };
}

// No top-level await: the pool imports this module for BenchWorker, which would wait forever on a module still evaluating.
if (isMainThread && process.argv[1] === fileURLToPath(import.meta.url)) {
  runControllerBench().then(
    (result) => process.stdout.write(`${JSON.stringify(result)}\n`),
    (err: unknown) => {
      process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
