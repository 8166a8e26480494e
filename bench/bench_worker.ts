// The production actor/rollout/reference worker with one extra remote method the
// benchmarks need: what each rank holds in memory. Everything else (initModel,
// generateSequences, computeLogProb, updateActor...) is ActorRolloutRefWorker's own.
import v8 from "node:v8";
import vm from "node:vm";
import * as tf from "@tensorflow/tfjs";
import { Dispatch, register } from "../src/single_controller/index.js";
import { ActorRolloutRefWorker } from "../src/workers/index.js";

export interface RankMemory {
  rank: number;
  /** tf.memory().numTensors in this rank's thread. */
  numTensors: number;
  /** Bytes held by those tensors. */
  tensorBytes: number;
  /** The wasm backend's linear memory (it never shrinks, so this is its peak); 0 on other backends. */
  wasmHeapBytes: number;
  /** This thread's V8 heap in use (JS objects; host-side arrays live outside it). */
  v8HeapUsedBytes: number;
  /** ArrayBuffer memory of this thread's isolate (typed arrays the rank allocated). */
  arrayBufferBytes: number;
  /** Resident set of the whole process (the ranks are threads of it). */
  processRssBytes: number;
}

/**
 * A full garbage collection of this thread's heap, so what is counted is what is still referenced
 * (without it, RSS also counts garbage V8 has not yet bothered to collect).
 */
export function collectGarbage(): void {
  v8.setFlagsFromString("--expose-gc");
  (vm.runInNewContext("gc") as () => void)();
}

function wasmHeapBytes(): number {
  if (tf.getBackend() !== "wasm") return 0;
  const be = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
  return be.wasm?.HEAPU8?.buffer.byteLength ?? 0;
}

export class BenchActorWorker extends ActorRolloutRefWorker {
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  memoryStats(fullGc = false): RankMemory {
    if (fullGc) collectGarbage();
    const m = tf.memory();
    const usage = process.memoryUsage();
    return {
      rank: this.rank,
      numTensors: m.numTensors,
      tensorBytes: m.numBytes,
      wasmHeapBytes: wasmHeapBytes(),
      v8HeapUsedBytes: v8.getHeapStatistics().used_heap_size,
      arrayBufferBytes: usage.arrayBuffers,
      processRssBytes: usage.rss,
    };
  }
}
