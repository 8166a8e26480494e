// AdamW (Loshchilov & Hutter) with decoupled weight decay and bias correction,
// matching torch.optim.AdamW. The update is fused over one flat vector: the
// parameters are concatenated, updated with a dozen element-wise ops and split
// back, so the op count per step stays constant instead of growing with the
// number of variables (the dispatch cost dominates on WebGPU). With `range` the
// optimizer owns one contiguous slice of that flat vector (a ZeRO-1 shard): its
// moments cover the slice only and a step updates the slice, returning it for the
// all-gather; the element-wise arithmetic is the same, so the slice's values are
// the bits the whole-vector update gives them. On WebGPU with the fused kernels on
// (engine/webgpu_fused.ts's switch) the element-wise chain is one kernel of three
// programs (engine/webgpu_fused_adamw.ts), in the same arithmetic order.
import * as tf from "@tensorflow/tfjs";
import { fusedLayersFor } from "../webgpu_fused.js";
import { concatFlat, splitFlat } from "../copies.js";
import { fusedAdamW, type DeviceClip } from "../webgpu_fused_adamw.js";
import { canWriteDirect, uploadTensor } from "../webgpu_transfer.js";

export interface AdamWOptions {
  lr: number;
  betas?: [number, number];
  eps?: number;
  weightDecay?: number;
  /** [start, end) of the flat parameter vector this optimizer updates (default: all of it). */
  range?: [number, number];
}

/** The saveable optimizer state: flat moment vectors in variable order. */
export interface AdamWState {
  step: number;
  expAvg: Float32Array;
  expAvgSq: Float32Array;
  /** Names and sizes of the variables, checked on load. */
  paramNames: string[];
  paramSizes: number[];
  /** The slice of the flat vector the moments cover (absent: all of it). */
  range?: [number, number];
}

/** A variable's overlap with the optimizer's slice: var-local [from, to), at `at` in the slice. */
interface Piece {
  index: number;
  from: number;
  to: number;
  at: number;
  /** The whole variable lies in the slice. */
  whole: boolean;
}

export class AdamW {
  readonly vars: tf.Variable[];
  readonly numel: number;
  lr: number;
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;
  private stepCount = 0;
  private readonly sizes: number[];
  /** [start, end) of the flat vector. */
  readonly range: [number, number];
  private readonly pieces: Piece[];
  private expAvg: tf.Variable;
  private expAvgSq: tf.Variable;

  constructor(vars: tf.Variable[], opts: AdamWOptions) {
    if (vars.length === 0) throw new Error("AdamW: no variables to optimise");
    const [b1, b2] = opts.betas ?? [0.9, 0.999];
    for (const [k, v] of [["betas[0]", b1], ["betas[1]", b2]] as const) {
      if (!(v >= 0 && v < 1)) throw new Error(`AdamW: ${k} must lie in [0, 1), got ${v}`);
    }
    if (!(opts.lr >= 0)) throw new Error(`AdamW: lr must be >= 0, got ${opts.lr}`);
    this.vars = vars;
    this.lr = opts.lr;
    this.beta1 = b1;
    this.beta2 = b2;
    this.eps = opts.eps ?? 1e-8;
    this.weightDecay = opts.weightDecay ?? 0;
    this.sizes = vars.map((v) => v.size);
    this.numel = this.sizes.reduce((a, b) => a + b, 0);
    const [start, end] = opts.range ?? [0, this.numel];
    if (!(Number.isInteger(start) && Number.isInteger(end) && start >= 0 && start <= end && end <= this.numel)) {
      throw new Error(`AdamW: range [${start}, ${end}) is not a slice of the ${this.numel} parameters`);
    }
    this.range = [start, end];
    this.pieces = [];
    let o = 0;
    this.sizes.forEach((size, index) => {
      const from = Math.max(start, o) - o, to = Math.min(end, o + size) - o;
      if (from < to) this.pieces.push({ index, from, to, at: o + from - start, whole: from === 0 && to === size });
      o += size;
    });
    // in a tidy: a variable made from a tensor leaves that tensor registered
    this.expAvg = tf.tidy(() => tf.variable(tf.zeros([end - start]), false));
    this.expAvgSq = tf.tidy(() => tf.variable(tf.zeros([end - start]), false));
  }

  /** Values in this optimizer's slice. */
  get sliceSize(): number {
    return this.range[1] - this.range[0];
  }

  /** Bytes of optimizer state (the two float32 moments of the slice). */
  get stateBytes(): number {
    return 2 * 4 * this.sliceSize;
  }

  get step(): number {
    return this.stepCount;
  }

  /**
   * One update from a flat gradient (variable order, already averaged and clipped).
   * `lr` overrides the current learning rate for this and later steps. `gradMul` = [gradScale,
   * clip]: the gradient used is (grad gradScale) clip (inside the fused kernel on WebGPU, as two
   * element-wise ops elsewhere), so the caller need not make scaled copies.
   */
  stepFlat(grad: Float32Array | tf.Tensor1D, lr: number = this.lr, gradMul?: [number, number], deviceClip?: DeviceClip): void {
    if (this.sliceSize !== this.numel) throw new Error(`AdamW.stepFlat: this optimizer owns [${this.range[0]}, ${this.range[1]}) of ${this.numel} parameters; use stepSlice`);
    tf.tidy(() => {
      const pNew = this.update(grad, lr, gradMul, deviceClip);
      const parts = splitFlat(pNew, this.sizes);
      parts.forEach((part, i) => this.vars[i]!.assign(part.reshape(this.vars[i]!.shape)));
    });
  }

  /**
   * One update of this optimizer's slice from the slice's gradient: the variables lying wholly in
   * the slice are assigned; the slice's new values are returned (the caller disposes them) for the
   * all-gather that brings the other ranks' slices.
   */
  stepSlice(grad: Float32Array | tf.Tensor1D, lr: number = this.lr, gradMul?: [number, number]): tf.Tensor1D {
    return tf.tidy(() => {
      const pNew = this.update(grad, lr, gradMul);
      for (const p of this.pieces) {
        const v = this.vars[p.index]!;
        if (p.whole) v.assign(pNew.slice(p.at, p.to - p.from).reshape(v.shape));
      }
      return pNew;
    });
  }

  /**
   * Whether stepFlat can take a DeviceClip for this gradient: the fused WebGPU kernels, where the
   * clip and the skip of a non-finite norm happen on the device.
   */
  takesDeviceClip(grad: tf.Tensor1D): boolean {
    return this.sliceSize === this.numel && fusedLayersFor(grad);
  }

  /**
   * Takes back the step count of a step that a DeviceClip skipped on the device (its norm was not
   * finite): found after it was recorded, it must not advance the bias corrections.
   */
  revertSkippedStep(): void {
    if (this.stepCount === 0) throw new Error("AdamW.revertSkippedStep: no step to take back");
    this.stepCount -= 1;
  }

  /** Moments updated, new parameter values of the slice returned (inside the caller's tidy). */
  private update(grad: Float32Array | tf.Tensor1D, lr: number, gradMul?: [number, number], deviceClip?: DeviceClip): tf.Tensor1D {
    const n = grad instanceof Float32Array ? grad.length : grad.size;
    if (n !== this.sliceSize) {
      const slice = this.sliceSize === this.numel ? "" : ` (its slice [${this.range[0]}, ${this.range[1]}) of ${this.numel})`;
      throw new Error(`AdamW: gradient has ${n} elements, parameters have ${this.sliceSize}${slice}`);
    }
    this.lr = lr;
    this.stepCount += 1;
    if (n === 0) return tf.zeros([0]) as tf.Tensor1D;
    const t = this.stepCount;
    const bc1 = 1 - this.beta1 ** t;
    const bc2 = 1 - this.beta2 ** t;
    const stepSize = lr / bc1;
    const { beta1, beta2, eps } = this;
    const decay = 1 - lr * this.weightDecay;
    // host gradients (the ranks' reduced sum) go up by writeBuffer on WebGPU (webgpu_transfer.ts)
    const g0 = grad instanceof Float32Array ? (canWriteDirect() ? uploadTensor(grad, [n]) as tf.Tensor1D : tf.tensor1d(grad)) : grad;
    const p = concatFlat(this.pieces.map((pc) => {
      const flat = this.vars[pc.index]!.reshape([-1]);
      return pc.whole ? flat : flat.slice(pc.from, pc.to - pc.from);
    }));
    const [gradScale, clip] = gradMul ?? [1, 1];
    if (fusedLayersFor(g0, p)) {
      // three dispatches and three full-size buffers instead of about a dozen (webgpu_fused_adamw.ts)
      const [m, v, pNew] = fusedAdamW(p, this.expAvg as tf.Tensor1D, this.expAvgSq as tf.Tensor1D, g0,
        { beta1, beta2, eps, stepSize, sqrtBc2: Math.sqrt(bc2), decay, gradScale, clip }, deviceClip);
      this.expAvg.assign(m);
      this.expAvgSq.assign(v);
      return pNew;
    }
    if (deviceClip) throw new Error("AdamW: a device clip needs the fused WebGPU kernels (takesDeviceClip)");
    const g1 = gradScale === 1 ? g0 : g0.mul(gradScale);
    const g = clip === 1 ? g1 : g1.mul(clip);
    const m = this.expAvg.mul(beta1).add(g.mul(1 - beta1));
    const v = this.expAvgSq.mul(beta2).add(g.square().mul(1 - beta2));
    const denom = v.sqrt().div(Math.sqrt(bc2)).add(eps);
    const pNew = p.mul(decay).sub(m.div(denom).mul(stepSize)) as tf.Tensor1D;
    this.expAvg.assign(m);
    this.expAvgSq.assign(v);
    return pNew;
  }

  /** The moments read back asynchronously (the only way a GPU backend reads under Node). */
  async stateDict(): Promise<AdamWState> {
    const [expAvg, expAvgSq] = await Promise.all([this.expAvg.data(), this.expAvgSq.data()]);
    return {
      step: this.stepCount,
      expAvg: expAvg as Float32Array,
      expAvgSq: expAvgSq as Float32Array,
      paramNames: this.vars.map((v) => v.name),
      paramSizes: [...this.sizes],
      range: [...this.range],
    };
  }

  loadStateDict(s: AdamWState): void {
    if (s.paramSizes.length !== this.sizes.length || s.paramSizes.some((n, i) => n !== this.sizes[i])) {
      throw new Error(
        `AdamW.loadStateDict: saved state is for ${s.paramSizes.length} variables (${sum(s.paramSizes)} values), ` +
        `this optimizer has ${this.sizes.length} (${this.numel} values)`,
      );
    }
    const [start, end] = s.range ?? [0, this.numel];
    if (start !== this.range[0] || end !== this.range[1]) {
      throw new Error(`AdamW.loadStateDict: saved moments cover [${start}, ${end}) of the parameters, this optimizer owns [${this.range[0]}, ${this.range[1]})`);
    }
    if (s.expAvg.length !== this.sliceSize || s.expAvgSq.length !== this.sliceSize) {
      throw new Error(`AdamW.loadStateDict: moment vectors have ${s.expAvg.length}/${s.expAvgSq.length} values, expected ${this.sliceSize}`);
    }
    this.stepCount = s.step;
    tf.tidy(() => {
      this.expAvg.assign(tf.tensor1d(s.expAvg));
      this.expAvgSq.assign(tf.tensor1d(s.expAvgSq));
    });
  }

  dispose(): void {
    this.expAvg.dispose();
    this.expAvgSq.dispose();
  }
}

function sum(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0);
}
