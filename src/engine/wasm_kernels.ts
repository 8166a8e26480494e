// Kernels the wasm backend lacks or runs slowly, written in JS over the backend's heap.
// - UnsortedSegmentSum is the gradient of `gather` (embedding lookups): without it
//   no model with an embedding table can train on wasm.
// - BatchMatMul: the stock kernel sends only untransposed, unbatched products to
//   XNNPACK; everything else (attention's batched products, matMul gradients)
//   falls to a scalar loop measured at 0.1-0.9 GFLOP/s. This replacement
//   transposes explicitly and runs each batch slice through XNNPACK (5-7 GFLOP/s
//   on attention shapes, 10-50x faster).
// - Slice and SplitV: the stock kernels copy the whole input out of the heap
//   before slicing, then copy row by row (a second for splitting a [16384, 16, 8]
//   projection); these read the heap in place and copy contiguous runs.
// - Concat: the stock kernel copies row by row through subarrays (slow for the
//   narrow rows of split gradients); this one copies short runs element-wise.
// - Identity: the stock kernel copies the data. Autograd clones every tensor it
//   saves for the backward pass, so training held each activation twice (1.6 GB
//   of copies at 64 x 256 tokens). Tensors are immutable, so the clone shares the
//   buffer by reference count, as the cpu backend's does.
import * as tf from "@tensorflow/tfjs";

/** The parts of tfjs-backend-wasm's BackendWasm that these kernels use. */
export interface WasmBackendLike {
  makeOutput(shape: number[], dtype: tf.DataType): tf.TensorInfo;
  typedArrayFromHeap(t: tf.TensorInfo): Float32Array | Int32Array | Uint8Array;
  disposeData(dataId: object): boolean;
  dataIdMap: { get(dataId: object): { id: number; memoryOffset: number } | undefined };
  dataIdNextNumber: number;
  wasm: {
    HEAP32: Int32Array;
    _malloc(n: number): number;
    _BatchMatMul(aId: number, aShape: number, aLen: number, bId: number, bShape: number, bLen: number, ta: number, tb: number, outId: number): void;
    tfjs: { registerTensor(id: number, size: number, offset: number): void; disposeData(id: number): void };
  };
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

/** Per backend: three tensor ids reserved for slice views, and a scratch for two shapes. */
const scratch = new WeakMap<object, { ids: [number, number, number]; shapes: number }>();

function scratchFor(be: WasmBackendLike): { ids: [number, number, number]; shapes: number } {
  let s = scratch.get(be);
  if (!s) {
    // ids taken from the backend's own counter can never collide with its tensors
    s = { ids: [be.dataIdNextNumber++, be.dataIdNextNumber++, be.dataIdNextNumber++], shapes: be.wasm._malloc(24) };
    scratch.set(be, s);
  }
  return s;
}

function transposeLast2(x: tf.TensorInfo, backend: WasmBackendLike): tf.TensorInfo {
  const r = x.shape.length, perm = [...Array(r).keys()];
  [perm[r - 2], perm[r - 1]] = [perm[r - 1]!, perm[r - 2]!];
  const kernel = tf.getKernel("Transpose", "wasm")!;
  return kernel.kernelFunc({ inputs: { x }, backend: backend as unknown as tf.KernelBackend, attrs: { perm } }) as tf.TensorInfo;
}

let stockBatchMatMul: tf.KernelConfig | undefined;

export function batchMatMulWasm(args: { inputs: tf.NamedTensorInfoMap; backend: unknown; attrs?: tf.NamedAttrMap }): tf.TensorInfo {
  const backend = args.backend as WasmBackendLike;
  const a = args.inputs["a"]!, b = args.inputs["b"]!;
  const ta = Boolean(args.attrs?.["transposeA"]), tb = Boolean(args.attrs?.["transposeB"]);
  const ra = a.shape.length, rb = b.shape.length;
  const batchA = a.shape.slice(0, -2).reduce((x, y) => x * y, 1), batchB = b.shape.slice(0, -2).reduce((x, y) => x * y, 1);
  const sameOuter = ra === rb && a.shape.slice(0, -2).join() === b.shape.slice(0, -2).join();
  const broadcastOne = (batchA === 1 && ra <= rb) || (batchB === 1 && rb <= ra);
  if (a.dtype !== "float32" || b.dtype !== "float32" || (!sameOuter && !broadcastOne)) {
    return stockBatchMatMul!.kernelFunc(args as Parameters<tf.KernelFunc>[0]) as tf.TensorInfo; // general broadcasting: the stock kernel
  }
  const M = ta ? a.shape[ra - 1]! : a.shape[ra - 2]!, K = ta ? a.shape[ra - 2]! : a.shape[ra - 1]!;
  const K2 = tb ? b.shape[rb - 1]! : b.shape[rb - 2]!, N = tb ? b.shape[rb - 2]! : b.shape[rb - 1]!;
  if (K !== K2) throw new Error(`Error in matMul: inner shapes (${K}) and (${K2}) of Tensors with shapes ${a.shape} and ${b.shape} and transposeA=${ta} and transposeB=${tb} must match.`);
  const outer = tf.backend_util.assertAndGetBroadcastShape(a.shape.slice(0, -2), b.shape.slice(0, -2)), nb = Math.max(batchA, batchB);
  const out = backend.makeOutput([...outer, M, N], "float32");
  if (M * N * nb === 0) return out;
  if (K === 0) { backend.typedArrayFromHeap(out).fill(0); return out; }
  const A = ta ? transposeLast2(a, backend) : a, B = tb ? transposeLast2(b, backend) : b;
  try {
    const info = (t: tf.TensorInfo) => backend.dataIdMap.get(t.dataId)!;
    const s = scratchFor(backend), w = backend.wasm, sh = s.shapes >> 2;
    w.HEAP32[sh] = 1; w.HEAP32[sh + 1] = M; w.HEAP32[sh + 2] = K;
    w.HEAP32[sh + 3] = 1; w.HEAP32[sh + 4] = K; w.HEAP32[sh + 5] = N;
    if (nb === 1) {
      w._BatchMatMul(info(A).id, s.shapes, 3, info(B).id, s.shapes + 12, 3, 0, 0, info(out).id);
      return out;
    }
    // one XNNPACK product per slice, through tensor ids that view the slices in place
    const [ia, ib, io] = s.ids, oa = info(A).memoryOffset, ob = info(B).memoryOffset, oo = info(out).memoryOffset;
    for (let i = 0; i < nb; i++) {
      w.tfjs.registerTensor(ia, M * K, oa + (batchA === 1 ? 0 : i * M * K * 4));
      w.tfjs.registerTensor(ib, K * N, ob + (batchB === 1 ? 0 : i * K * N * 4));
      w.tfjs.registerTensor(io, M * N, oo + i * M * N * 4);
      w._BatchMatMul(ia, s.shapes, 3, ib, s.shapes + 12, 3, 0, 0, io);
      // disposing the ids also drops XNNPACK's packed copy of this slice's weights
      w.tfjs.disposeData(ia); w.tfjs.disposeData(ib); w.tfjs.disposeData(io);
    }
    return out;
  } finally {
    if (A !== a) backend.disposeData(A.dataId);
    if (B !== b) backend.disposeData(B.dataId);
  }
}

export function sliceWasm(args: { inputs: tf.NamedTensorInfoMap; backend: unknown; attrs?: tf.NamedAttrMap }): tf.TensorInfo {
  const backend = args.backend as WasmBackendLike;
  const x = args.inputs["x"]!;
  if (x.dtype === "string") return stockSlice!.kernelFunc(args as Parameters<tf.KernelFunc>[0]) as tf.TensorInfo;
  const [begin, size] = tf.slice_util.parseSliceParams(x as tf.Tensor, args.attrs!["begin"] as number[], args.attrs!["size"] as number[]);
  const out = backend.makeOutput(size, x.dtype);
  const n = size.reduce((a, b) => a * b, 1);
  if (n === 0) return out;
  const xs = backend.typedArrayFromHeap(x), ys = backend.typedArrayFromHeap(out); // after makeOutput: it may grow the heap
  const rank = x.shape.length, strides = tf.util.computeStrides(x.shape);
  // the innermost dimension that is not taken whole: everything right of it is one contiguous run
  let j = rank - 1;
  while (j > 0 && begin[j] === 0 && size[j] === x.shape[j]) j--;
  const run = size.slice(j).reduce((a, b) => a * b, 1);
  const stride = (i: number) => (i < rank - 1 ? strides[i]! : 1);
  const outer = size.slice(0, j), idx = new Array<number>(j).fill(0);
  for (let o = 0; o < n; o += run) {
    let src = begin[j]! * stride(j);
    for (let i = 0; i < j; i++) src += (begin[i]! + idx[i]!) * stride(i);
    if (run >= 64) ys.set(xs.subarray(src, src + run), o);
    else for (let r = 0; r < run; r++) ys[o + r] = xs[src + r]!;
    for (let i = j - 1; i >= 0; i--) { if (++idx[i]! < outer[i]!) break; idx[i] = 0; }
  }
  return out;
}

let stockSlice: tf.KernelConfig | undefined;

export function identityWasm(args: { inputs: tf.NamedTensorInfoMap; backend: unknown }): tf.TensorInfo {
  const x = args.inputs["x"]!;
  if (x.dtype === "string") return stockIdentity!.kernelFunc(args as Parameters<tf.KernelFunc>[0]) as tf.TensorInfo;
  (args.backend as { incRef(dataId: object): void }).incRef(x.dataId);
  return { dataId: x.dataId, shape: x.shape, dtype: x.dtype };
}

let stockIdentity: tf.KernelConfig | undefined;

export function concatWasm(args: { inputs: tf.NamedTensorInfoMap; backend: unknown; attrs?: tf.NamedAttrMap }): tf.TensorInfo {
  const backend = args.backend as WasmBackendLike;
  const inputs = Object.values(args.inputs) as tf.TensorInfo[];
  const nonEmpty = inputs.filter((t) => t.shape.reduce((a, b) => a * b, 1) > 0);
  if (inputs[0]!.dtype === "string" || nonEmpty.length < 2) return stockConcat!.kernelFunc(args as Parameters<tf.KernelFunc>[0]) as tf.TensorInfo;
  const axis = tf.util.parseAxisParam(args.attrs!["axis"] as number, inputs[0]!.shape)[0]!;
  tf.backend_util.assertParamsConsistent(inputs.map((t) => t.shape), axis);
  const out = backend.makeOutput(tf.backend_util.computeOutShape(inputs.map((t) => t.shape), axis), inputs[0]!.dtype);
  const outer = nonEmpty[0]!.shape.slice(0, axis).reduce((a, b) => a * b, 1);
  const inner = nonEmpty.map((t) => t.shape.slice(axis).reduce((a, b) => a * b, 1));
  const stride = inner.reduce((a, b) => a + b, 0);
  const ys = backend.typedArrayFromHeap(out), xs = nonEmpty.map((t) => backend.typedArrayFromHeap(t)); // after makeOutput
  let col = 0;
  nonEmpty.forEach((_, i) => {
    const run = inner[i]!, x = xs[i]!;
    for (let o = 0; o < outer; o++) {
      const dst = o * stride + col, src = o * run;
      if (run >= 64) ys.set(x.subarray(src, src + run), dst);
      else for (let r = 0; r < run; r++) ys[dst + r] = x[src + r]!;
    }
    col += run;
  });
  return out;
}

let stockConcat: tf.KernelConfig | undefined;

/** SplitV through the in-place slice (the stock one calls the stock slice directly). */
export function splitVWasm(args: { inputs: tf.NamedTensorInfoMap; backend: unknown; attrs?: tf.NamedAttrMap }): tf.TensorInfo[] {
  const x = args.inputs["x"]!;
  const axis = tf.util.parseAxisParam(args.attrs!["axis"] as number, x.shape)[0]!;
  const sizes = tf.backend_util.prepareSplitSize(x as tf.Tensor, args.attrs!["numOrSizeSplits"] as number[] | number, axis);
  const begin = new Array<number>(x.shape.length).fill(0);
  return sizes.map((n) => {
    const size = [...x.shape];
    size[axis] = n;
    const part = sliceWasm({ inputs: { x }, backend: args.backend, attrs: { begin: [...begin], size } });
    begin[axis]! += n;
    return part;
  });
}

/** Put `kernelFunc` in place of the stock wasm kernel, keeping its setup; returns the stock config. */
function replaceKernel(name: string, kernelFunc: tf.KernelFunc): tf.KernelConfig | undefined {
  const stock = tf.getKernel(name, "wasm");
  if (!stock || stock.kernelFunc === kernelFunc) return undefined;
  tf.unregisterKernel(name, "wasm");
  tf.registerKernel({ ...stock, kernelFunc });
  return stock;
}

let registered = false;

/** Register the missing and faster kernels for backendName 'wasm' (idempotent). */
export function registerWasmKernels(): void {
  if (registered) return;
  if (!tf.getKernel("UnsortedSegmentSum", "wasm")) {
    tf.registerKernel({ kernelName: "UnsortedSegmentSum", backendName: "wasm", kernelFunc: unsortedSegmentSumWasm as tf.KernelFunc });
  }
  // the stock setups stay: they prepare the wasm functions the fallback paths call
  stockBatchMatMul = replaceKernel("BatchMatMul", batchMatMulWasm as tf.KernelFunc) ?? stockBatchMatMul;
  stockSlice = replaceKernel("Slice", sliceWasm as tf.KernelFunc) ?? stockSlice;
  replaceKernel("SplitV", splitVWasm as unknown as tf.KernelFunc);
  stockIdentity = replaceKernel("Identity", identityWasm as tf.KernelFunc) ?? stockIdentity;
  stockConcat = replaceKernel("Concat", concatWasm as tf.KernelFunc) ?? stockConcat;
  registered = true;
}
