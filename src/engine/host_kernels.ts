// Host-side buffers and dense products for the decoding engine. tfjs spends
// about 25 us of bookkeeping per op, which dominates a small model's decode step;
// the decoder therefore works on Float32Arrays and calls matrix products
// directly. On the wasm backend those products run in XNNPACK through the
// backend's own exported kernel (~30 GFLOP/s at decode shapes, 1-6 us a call);
// beside WebGPU they run there too (the wasm backend is initialised next to it); without
// wasm a plain JS loop does the work (slow, but any backend can decode).
import * as tf from "@tensorflow/tfjs";

/** A float buffer. `view()` may change after `alloc` or `matmul` (a wasm heap can grow). */
export interface HostBuffer {
  readonly size: number;
  view(): Float32Array;
}

/** A weight matrix prepared for `matmul`, stored [in, out] row-major. */
export interface HostWeight {
  readonly inF: number;
  readonly outF: number;
}

export interface HostKernels {
  readonly name: "xnnpack" | "js";
  alloc(size: number): HostBuffer;
  /** Prepare `w` given in PyTorch layout [out, in]. */
  weight(w: Float32Array, outF: number, inF: number): HostWeight;
  /** out[0:rows, 0:outF] = x[0:rows, 0:inF] @ W. */
  matmul(x: HostBuffer, rows: number, w: HostWeight, out: HostBuffer): void;
  dispose(): void;
}

export function transposeToInOut(w: Float32Array, outF: number, inF: number): Float32Array {
  const t = new Float32Array(w.length);
  for (let o = 0; o < outF; o++) for (let i = 0; i < inF; i++) t[i * outF + o] = w[o * inF + i]!;
  return t;
}

// ---- plain JS -------------------------------------------------------------

class JsBuffer implements HostBuffer {
  readonly data: Float32Array;
  constructor(readonly size: number) { this.data = new Float32Array(size); }
  view(): Float32Array { return this.data; }
}

class JsWeight implements HostWeight {
  constructor(readonly data: Float32Array, readonly inF: number, readonly outF: number) {}
}

export class JsKernels implements HostKernels {
  readonly name = "js" as const;
  alloc(size: number): HostBuffer { return new JsBuffer(size); }
  weight(w: Float32Array, outF: number, inF: number): HostWeight {
    return new JsWeight(transposeToInOut(w, outF, inF), inF, outF);
  }
  matmul(x: HostBuffer, rows: number, w: HostWeight, out: HostBuffer): void {
    const a = x.view(), y = out.view(), { data: b, inF, outF } = w as JsWeight;
    for (let r = 0; r < rows; r++) {
      const yo = r * outF, xo = r * inF;
      y.fill(0, yo, yo + outF);
      for (let i = 0; i < inF; i++) {
        const xv = a[xo + i]!, bo = i * outF;
        if (xv === 0) continue;
        for (let o = 0; o < outF; o++) y[yo + o]! += xv * b[bo + o]!;
      }
    }
  }
  dispose(): void {}
}

// ---- XNNPACK through tfjs-backend-wasm -------------------------------------

interface WasmModule {
  HEAPF32: Float32Array;
  HEAP32: Int32Array;
  _malloc(n: number): number;
  _free(p: number): void;
  _BatchMatMul(aId: number, aShape: number, aLen: number, bId: number, bShape: number, bLen: number, ta: number, tb: number, outId: number): void;
}
interface WasmBackend {
  wasm: WasmModule;
  dataIdMap: { get(dataId: object): { id: number; memoryOffset: number } | undefined };
  write(values: Float32Array, shape: number[], dtype: "float32"): object;
}

class WasmBuffer implements HostBuffer {
  private cached: Float32Array;
  constructor(readonly tensor: tf.Tensor, readonly id: number, private readonly offset: number, readonly size: number, private readonly mod: WasmModule) {
    this.cached = new Float32Array(mod.HEAPF32.buffer, offset, size);
  }
  view(): Float32Array {
    if (this.cached.buffer !== this.mod.HEAPF32.buffer) this.cached = new Float32Array(this.mod.HEAPF32.buffer, this.offset, this.size);
    return this.cached;
  }
}

class WasmWeight implements HostWeight {
  constructor(readonly buf: WasmBuffer, readonly inF: number, readonly outF: number) {}
}

export class XnnpackKernels implements HostKernels {
  readonly name = "xnnpack" as const;
  private readonly owned: tf.Tensor[] = [];
  private readonly shapePtr: number;

  constructor(private readonly backend: WasmBackend) {
    this.shapePtr = backend.wasm._malloc(24);
  }

  private make(data: Float32Array | number, shape: number[]): WasmBuffer {
    const size = shape.reduce((a, b) => a * b, 1);
    // Written on the wasm backend itself, which need not be the active one (beside WebGPU it
    // serves the host decoder); the engine tracks the tensor as it would its own.
    const dataId = this.backend.write(typeof data === "number" ? new Float32Array(size) : data, shape, "float32");
    const t = tf.engine().makeTensorFromDataId(dataId, shape, "float32", this.backend as unknown as tf.KernelBackend);
    this.owned.push(t);
    const info = this.backend.dataIdMap.get(t.dataId);
    if (!info) throw new Error("XnnpackKernels: tensor is not on the wasm backend");
    return new WasmBuffer(t, info.id, info.memoryOffset, size, this.backend.wasm);
  }

  alloc(size: number): HostBuffer { return this.make(size, [size]); }

  weight(w: Float32Array, outF: number, inF: number): HostWeight {
    // A fresh tensor per preparation: XNNPACK packs and caches weights by tensor id,
    // so writing new values into an old tensor would silently use the stale packing.
    return new WasmWeight(this.make(transposeToInOut(w, outF, inF), [1, inF, outF]), inF, outF);
  }

  matmul(x: HostBuffer, rows: number, w: HostWeight, out: HostBuffer): void {
    const a = x as WasmBuffer, b = w as WasmWeight, y = out as WasmBuffer;
    if (rows * b.inF > a.size || rows * b.outF > y.size) throw new Error(`XnnpackKernels.matmul: ${rows} rows exceed the buffers`);
    const m = this.backend.wasm, s = this.shapePtr >> 2;
    m.HEAP32[s] = 1; m.HEAP32[s + 1] = rows; m.HEAP32[s + 2] = b.inF;
    m.HEAP32[s + 3] = 1; m.HEAP32[s + 4] = b.inF; m.HEAP32[s + 5] = b.outF;
    m._BatchMatMul(a.id, this.shapePtr, 3, b.buf.id, this.shapePtr + 12, 3, 0, 0, y.id);
  }

  dispose(): void {
    tf.dispose(this.owned);
    this.owned.length = 0;
    this.backend.wasm._free(this.shapePtr);
  }
}

/**
 * XNNPACK when the wasm backend is active or initialised beside the active one (initBackend
 * sets it up next to WebGPU, whose device buys nothing at decode's batch-1 products), else plain JS.
 */
export function hostKernels(prefer: "auto" | "js" = "auto"): HostKernels {
  if (prefer === "auto") {
    const be = (tf.getBackend() === "wasm" ? tf.backend() : tf.engine().registry["wasm"]) as unknown as WasmBackend | undefined;
    if (typeof be?.wasm?._BatchMatMul === "function") return new XnnpackKernels(be);
  }
  return new JsKernels();
}
