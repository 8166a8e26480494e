// Worker groups the way `verl train` builds them: a resource pool of
// trainer.n_gpus_per_node rank threads running the actor/rollout(/ref) worker,
// initialised with initModel; always torn down.
import type { Config } from "../src/config/index.js";
import { DataProto } from "../src/protocol/index.js";
import { tensor } from "../src/protocol/tensor.js";
import { ClassWithInitArgs, ResourcePool, WorkerGroup, type BoundWorkerGroup } from "../src/single_controller/index.js";
import type { ActorRole } from "../src/workers/index.js";
import { Rng } from "../src/utils/rng.js";
import type { BenchActorWorker, RankMemory } from "./bench_worker.js";

const BENCH_WORKER = new URL("./bench_worker.js", import.meta.url);

export interface ActorGroup {
  wg: BoundWorkerGroup<BenchActorWorker>;
  worldSize: number;
  backend: string;
  numParams: number;
  /** A worker call that returns a DataProto. */
  proto(method: string, data: DataProto): Promise<DataProto>;
  /** Each rank's memory figures (after a full GC in each rank thread when `fullGc`). */
  memory(fullGc?: boolean): Promise<RankMemory[]>;
}

export async function withActorGroup<T>(config: Config, role: ActorRole, fn: (g: ActorGroup) => Promise<T>): Promise<T> {
  const pool = ResourcePool.fromConfig(config, { name: "bench_pool" });
  try {
    const wg = await WorkerGroup.create<BenchActorWorker>(pool, new ClassWithInitArgs(BENCH_WORKER, "BenchActorWorker", config, role));
    const info = (await wg.call("initModel")) as { backend: string; numParams: number }[];
    const group: ActorGroup = {
      wg,
      worldSize: pool.worldSize,
      backend: info[0]!.backend,
      numParams: info[0]!.numParams,
      proto: async (method, data) => (await wg.call(method, data)) as DataProto,
      memory: async (fullGc = false) => (await wg.call("memoryStats", fullGc)) as RankMemory[],
    };
    return await fn(group);
  } finally {
    await pool.destroy();
  }
}

/**
 * B finished rollouts in verl's layout, every position valid: prompts of P tokens and
 * responses of R tokens (random ids >= 3, so no BOS/EOS), with old_log_probs and advantages
 * filled in as the trainer would before updateActor. Deterministic in `seed`.
 */
export function rolloutBatch(B: number, P: number, R: number, vocab: number, seed: number): DataProto {
  const rng = new Rng(seed);
  const T = P + R;
  const ids = Int32Array.from({ length: B * T }, () => 3 + rng.int(vocab - 3));
  const responses = new Int32Array(B * R);
  for (let b = 0; b < B; b++) responses.set(ids.subarray(b * T + P, (b + 1) * T), b * R);
  // One advantage per sequence (GRPO-like), broadcast over its response tokens.
  const advantages = new Float32Array(B * R);
  for (let b = 0; b < B; b++) advantages.fill(rng.normal(), b * R, (b + 1) * R);
  return new DataProto({
    prompts: tensor(ids.filter((_, i) => i % T < P), [B, P], "int32"),
    responses: tensor(responses, [B, R], "int32"),
    response_mask: tensor(new Int32Array(B * R).fill(1), [B, R], "int32"),
    input_ids: tensor(ids, [B, T], "int32"),
    attention_mask: tensor(new Int32Array(B * T).fill(1), [B, T], "int32"),
    position_ids: tensor(Int32Array.from({ length: B * T }, (_, i) => i % T), [B, T], "int32"),
    advantages: tensor(advantages, [B, R], "float32"),
  }, {}, { temperature: 1.0 });
}

/** Number of 1s in an int tensor column (generated tokens from response_mask). */
export function countOnes(data: DataProto, key: string): number {
  const t = data.batch[key];
  if (!t) throw new Error(`benchmark: the worker's result has no '${key}'`);
  let n = 0;
  for (const v of t.data) n += v;
  return n;
}
