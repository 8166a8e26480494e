// AdamW (Loshchilov & Hutter) with decoupled weight decay and bias correction,
// matching torch.optim.AdamW. The update is fused over one flat vector: the
// parameters are concatenated, updated with a dozen element-wise ops and split
// back, so the op count per step stays constant instead of growing with the
// number of variables (the dispatch cost dominates on WebGPU).
import * as tf from "@tensorflow/tfjs";

export interface AdamWOptions {
  lr: number;
  betas?: [number, number];
  eps?: number;
  weightDecay?: number;
}

/** The saveable optimizer state: flat moment vectors in variable order. */
export interface AdamWState {
  step: number;
  expAvg: Float32Array;
  expAvgSq: Float32Array;
  /** Names and sizes of the variables, checked on load. */
  paramNames: string[];
  paramSizes: number[];
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
    this.expAvg = tf.variable(tf.zeros([this.numel]), false);
    this.expAvgSq = tf.variable(tf.zeros([this.numel]), false);
  }

  get step(): number {
    return this.stepCount;
  }

  /**
   * One update from a flat gradient (variable order, already averaged and clipped).
   * `lr` overrides the current learning rate for this and later steps.
   */
  stepFlat(grad: Float32Array | tf.Tensor1D, lr: number = this.lr): void {
    const n = grad instanceof Float32Array ? grad.length : grad.size;
    if (n !== this.numel) throw new Error(`AdamW.stepFlat: gradient has ${n} elements, parameters have ${this.numel}`);
    this.lr = lr;
    this.stepCount += 1;
    const t = this.stepCount;
    const bc1 = 1 - this.beta1 ** t;
    const bc2 = 1 - this.beta2 ** t;
    const stepSize = lr / bc1;
    const { beta1, beta2, eps } = this;
    const decay = 1 - lr * this.weightDecay;
    tf.tidy(() => {
      const g = grad instanceof Float32Array ? tf.tensor1d(grad) : grad;
      const p = tf.concat(this.vars.map((v) => v.reshape([-1])));
      const m = this.expAvg.mul(beta1).add(g.mul(1 - beta1));
      const v = this.expAvgSq.mul(beta2).add(g.square().mul(1 - beta2));
      const denom = v.sqrt().div(Math.sqrt(bc2)).add(eps);
      const pNew = p.mul(decay).sub(m.div(denom).mul(stepSize));
      this.expAvg.assign(m);
      this.expAvgSq.assign(v);
      const parts = tf.split(pNew, this.sizes);
      parts.forEach((part, i) => this.vars[i]!.assign(part.reshape(this.vars[i]!.shape)));
    });
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
    };
  }

  loadStateDict(s: AdamWState): void {
    if (s.paramSizes.length !== this.sizes.length || s.paramSizes.some((n, i) => n !== this.sizes[i])) {
      throw new Error(
        `AdamW.loadStateDict: saved state is for ${s.paramSizes.length} variables (${sum(s.paramSizes)} values), ` +
        `this optimizer has ${this.sizes.length} (${this.numel} values)`,
      );
    }
    if (s.expAvg.length !== this.numel || s.expAvgSq.length !== this.numel) {
      throw new Error(`AdamW.loadStateDict: moment vectors have ${s.expAvg.length}/${s.expAvgSq.length} values, expected ${this.numel}`);
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
