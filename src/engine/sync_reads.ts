// A check, on any backend, that a code path never reads a tensor synchronously:
// tfjs-backend-webgpu under Node has no synchronous read (its readSync needs an
// OffscreenCanvas), so a path meant for the GPU must use `await tensor.data()`.
// With VERL_FORBID_SYNC_READS=1, initBackend makes the engine's synchronous read
// (behind dataSync, arraySync, bufferSync) throw, while asynchronous reads still
// work: the CPU machines can then test the GPU paths. Kernels that read their
// inputs inside the backend (wasm's gather reads its indices) are not affected:
// they are the backend's own business, and WebGPU's kernels run on the device.
import * as tf from "@tensorflow/tfjs";

interface SyncReader {
  readSync(dataId: object): unknown;
}

let installed = false;

/** Whether forbidSyncReads is in force in this thread (code that reads a backend's memory itself then takes its GPU path too). */
export function syncReadsForbidden(): boolean {
  return installed;
}

/** Make synchronous tensor reads throw from now on, in this thread (async reads keep working). Idempotent. */
export function forbidSyncReads(): void {
  if (installed) return;
  installed = true;
  const engine = tf.engine() as unknown as SyncReader;
  engine.readSync = () => {
    throw new Error(
      "synchronous tensor read (dataSync/arraySync/bufferSync) while VERL_FORBID_SYNC_READS=1: " +
      "the WebGPU backend cannot read synchronously under Node; read with `await tensor.data()`",
    );
  };
}
