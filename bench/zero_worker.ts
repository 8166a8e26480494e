// The pool worker of bench/zero_optimizer.ts: a flat parameter vector of `numel` values in
// transformer-like pieces, a fixed gradient accumulated once per step, and
// DataParallelOptimizer.step timed on every rank (replicated or sharded ZeRO-1).
import * as tf from "@tensorflow/tfjs";
import { loadConfig } from "../src/config/index.js";
import { initBackend } from "../src/engine/backend.js";
import { Dispatch, Worker, register } from "../src/single_controller/index.js";
import { ConfigView } from "../src/workers/config_view.js";
import { DataParallelOptimizer } from "../src/workers/dp_optimizer.js";

export interface OptimizerTiming {
  rank: number;
  backend: string;
  /** Seconds of each timed optimizer step (all-reduce or reduce-scatter, clip, AdamW, all-gather). */
  stepSeconds: number[];
  /** The two AdamW moments this rank holds. */
  stateBytes: number;
  /** The wasm backend's linear memory (it never shrinks: this case's peak); 0 elsewhere. */
  wasmHeapBytes: number;
  /** Bytes held by tensors at the end (parameters, moments). */
  tensorBytes: number;
}

/** Sizes of pieces adding up to `numel`: matrices of 1/8 of it and what is left, like a model's layers. */
function pieceSizes(numel: number): number[] {
  const big = Math.max(1, Math.floor(numel / 8)), out: number[] = [];
  let left = numel;
  while (left > 0) {
    const s = Math.min(left, out.length % 3 === 2 ? Math.max(1, Math.floor(big / 97)) : big);
    out.push(s);
    left -= s;
  }
  return out;
}

export class ZeroBenchWorker extends Worker {
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async timeSteps(spec: { backend: string; numel: number; shards: number; warmup: number; reps: number }): Promise<OptimizerTiming> {
    const backend = await initBackend(spec.backend);
    const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.actor.optim.lr=1e-4"] });
    const vars = pieceSizes(spec.numel).map((n, i) => tf.tidy(() => tf.variable(tf.randomNormal([n], 0, 0.02, "float32", i + 1), true, `zero_bench_${i}`)));
    const grads = tf.tidy(() => Object.fromEntries(vars.map((v, i) => [v.name, tf.keep(tf.randomNormal(v.shape, 0, 1e-3, "float32", 1000 + i + this.rank))])));
    const opt = new DataParallelOptimizer(vars, new ConfigView(cfg, "actor_rollout_ref.actor.optim"), 1000, this.collective, 1.0, { shards: spec.shards });
    const stepSeconds: number[] = [];
    try {
      for (let i = 0; i < spec.warmup + spec.reps; i++) {
        opt.accumulate(grads);
        // every rank starts the step together: what is timed is the step, not a late peer
        this.collective.barrier();
        const t0 = performance.now();
        await opt.step([1]);
        if (i >= spec.warmup) stepSeconds.push((performance.now() - t0) / 1000);
      }
      const be = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
      return {
        rank: this.rank, backend, stepSeconds, stateBytes: opt.optimizer.stateBytes,
        wasmHeapBytes: backend === "wasm" ? be.wasm?.HEAPU8?.buffer.byteLength ?? 0 : 0, tensorBytes: tf.memory().numBytes,
      };
    } finally {
      opt.dispose();
      tf.dispose([...vars, ...Object.values(grads)]);
    }
  }
}
