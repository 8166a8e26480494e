// Kernels the wasm backend lacks, written in JS over the backend's heap.
// UnsortedSegmentSum is the gradient of `gather` (embedding lookups): without it
// no model with an embedding table can train on wasm.
import * as tf from "@tensorflow/tfjs";

/** The parts of tfjs-backend-wasm's BackendWasm that these kernels use. */
export interface WasmBackendLike {
  makeOutput(shape: number[], dtype: tf.DataType): tf.TensorInfo;
  typedArrayFromHeap(t: tf.TensorInfo): Float32Array | Int32Array | Uint8Array;
}

export function unsortedSegmentSumWasm(args: {
  inputs: tf.NamedTensorInfoMap;
  backend: unknown;
  attrs?: tf.NamedAttrMap;
}): tf.TensorInfo {
  const backend = args.backend as WasmBackendLike;
  const x = args.inputs["x"]!;
  const segmentIds = args.inputs["segmentIds"]!;
  const numSegments = Number(args.attrs?.["numSegments"]);
  if (!Number.isInteger(numSegments) || numSegments < 0) {
    throw new Error(`UnsortedSegmentSum: numSegments must be a non-negative integer, got ${String(args.attrs?.["numSegments"])}`);
  }
  const idRank = segmentIds.shape.length;
  for (let i = 0; i < idRank; i++) {
    if (segmentIds.shape[i] !== x.shape[i]) {
      throw new Error(`UnsortedSegmentSum: segmentIds shape [${segmentIds.shape}] must be a prefix of x shape [${x.shape}]`);
    }
  }
  const inner = x.shape.slice(idRank).reduce((a, b) => a * b, 1);
  const out = backend.makeOutput([numSegments, ...x.shape.slice(idRank)], x.dtype);
  // Views taken after makeOutput: allocating may grow (and move) the wasm heap.
  const xs = backend.typedArrayFromHeap(x);
  const ids = backend.typedArrayFromHeap(segmentIds);
  const ys = backend.typedArrayFromHeap(out);
  ys.fill(0);
  for (let r = 0; r < ids.length; r++) {
    const s = ids[r]!;
    if (s < 0 || s >= numSegments) continue; // as tfjs's cpu kernel: ids out of range contribute nothing
    const src = r * inner, dst = s * inner;
    for (let j = 0; j < inner; j++) ys[dst + j]! += xs[src + j]!;
  }
  return out;
}

let registered = false;

/** Register the missing kernels for backendName 'wasm' (idempotent). */
export function registerWasmKernels(): void {
  if (registered) return;
  if (!tf.getKernel("UnsortedSegmentSum", "wasm")) {
    tf.registerKernel({ kernelName: "UnsortedSegmentSum", backendName: "wasm", kernelFunc: unsortedSegmentSumWasm as tf.KernelFunc });
  }
  registered = true;
}
