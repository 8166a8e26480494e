// Choosing the tensor-core matrix-product kernel on the device itself (issue 23). Which WGSL
// kernel is fastest on an adapter is not known ahead (the H200 sweeps disagreed with every
// guess), and a kernel can compile and still be wrong there (the staged kernel's one-element
// shift), so each product class (the transposes and a coarse size bucket) is settled once per
// process: every candidate is run on a small random problem and compared with the float32
// product (relative error bound as the benchmark's checks), the correct ones are timed on a
// representative size, and the fastest is kept. A candidate that throws, raises a device error
// or misses the bound is skipped with its reason logged, never used; when none is correct the
// class stays on tfjs's float32 kernel. VERL_GEMM_KERNEL pins a choice (still checked).
//
// This file knows nothing of WebGPU: candidates, the timer, the reference and the device-error
// capture are given (webgpu_kernels.ts gives the tensor-core ones), so the selection logic is
// the same code on the device and in the CPU tests.
import * as tf from "@tensorflow/tfjs";
import type { Logger } from "pino";
import type { GemmShape } from "./webgpu_gemm.js";

/** One kernel the tuner may choose. */
export interface GemmCandidate {
  /** stable name: what VERL_GEMM_KERNEL names and the log prints */
  name: string;
  params: Record<string, unknown>;
  /** C = op(A) op(B) as float32 [batch, m, n] (a tensor the caller owns); throws where it cannot run */
  matMul(a: tf.Tensor, b: tf.Tensor, s: GemmShape): tf.Tensor;
}

/** Mean milliseconds of one product: `run` does one product (its output already disposed). */
export type GemmTimer = (c: GemmCandidate, run: () => void, s: GemmShape) => Promise<number>;

/** Device errors raised while a candidate ran (WebGPU error scopes); absent off WebGPU. */
export interface ErrorCapture { begin(): void; end(): Promise<string | null> }

export interface CandidateReport {
  name: string; params: Record<string, unknown>; ok: boolean;
  /** why it was skipped */
  reason?: string;
  /** ||C - ref|| / ||ref|| on the check problem */
  relErr?: number;
  /** on a failed check: the index shift of an iota x identity product (0: none; null: not a shift) */
  shift?: number | null;
  ms?: number; tflops?: number;
}

export interface GemmChoice {
  cls: string;
  /** null: no candidate was correct (or "f32" was pinned); the class uses tfjs's float32 kernel */
  candidate: GemmCandidate | null;
  pinned: boolean;
  reports: CandidateReport[];
}

export type SizeBucket = "small" | "large";
/** Transposes and a size bucket: products with both output extents at least 1024 are "large". */
export function productClass(s: Pick<GemmShape, "m" | "n" | "transposeA" | "transposeB">): string {
  const bucket: SizeBucket = Math.min(s.m, s.n) >= 1024 ? "large" : "small";
  return `${s.transposeA ? "T" : "N"}${s.transposeB ? "T" : "N"}/${bucket}`;
}
export const PRODUCT_CLASSES: readonly string[] = ["NN", "NT", "TN", "TT"].flatMap((t) => [`${t}/large`, `${t}/small`]);

function parseClass(cls: string): { transposeA: boolean; transposeB: boolean; bucket: SizeBucket } {
  const m = /^([NT])([NT])\/(small|large)$/.exec(cls);
  if (!m) throw new Error(`GEMM product class '${cls}' is not one of ${PRODUCT_CLASSES.join(", ")}`);
  return { transposeA: m[1] === "T", transposeB: m[2] === "T", bucket: m[3] as SizeBucket };
}

/**
 * The check problem: not a multiple of any tile (padding and slicing are exercised), a batch of 2
 * against a broadcast right operand (a weight's shape).
 */
export function checkShape(cls: string): GemmShape {
  const { transposeA, transposeB } = parseClass(cls);
  return { batch: 2, m: 144, n: 200, k: 88, transposeA, transposeB, batchA: 2, batchB: 1 };
}

/**
 * The timing problem: 4096^3 for large products (at 2048^3, ~0.3 ms a product, the H200's rankings
 * came out in a different order from one class to the next), 512 x 4096 x 1024 for small ones.
 */
export function timeShape(cls: string): GemmShape {
  const { transposeA, transposeB, bucket } = parseClass(cls);
  const [m, n, k] = bucket === "large" ? [4096, 4096, 4096] : [512, 4096, 1024];
  return { batch: 1, m, n, k, transposeA, transposeB, batchA: 1, batchB: 1 };
}

/**
 * VERL_GEMM_KERNEL: one candidate name for every class, or `CLASS=NAME` entries separated by
 * commas (CLASS as in PRODUCT_CLASSES; NAME `f32` keeps that class on tfjs's float32 kernel).
 */
export function parsePin(spec: string | undefined): { all?: string; byClass: Map<string, string> } {
  const byClass = new Map<string, string>();
  let all: string | undefined;
  for (const part of (spec ?? "").split(",").map((x) => x.trim()).filter(Boolean)) {
    const eq = part.indexOf("=");
    if (eq < 0) { all = part; continue; }
    const cls = part.slice(0, eq).trim(), name = part.slice(eq + 1).trim();
    parseClass(cls);
    byClass.set(cls, name);
  }
  return { all, byClass };
}

/** Operands of a product shape (3-D, transposed layouts as stored), normal draws from `seed`. */
export function productOperands(s: GemmShape, seed: number): [tf.Tensor3D, tf.Tensor3D] {
  const aShape: [number, number, number] = s.transposeA ? [s.batchA, s.k, s.m] : [s.batchA, s.m, s.k];
  const bShape: [number, number, number] = s.transposeB ? [s.batchB, s.n, s.k] : [s.batchB, s.k, s.n];
  return [tf.randomNormal(aShape, 0, 1, "float32", seed), tf.randomNormal(bShape, 0, 1, "float32", seed + 1)];
}

/** ||x - ref|| / ||ref||, NaN when x has a non-finite value (read back as one scalar). */
export async function relativeError(x: tf.Tensor, ref: tf.Tensor): Promise<number> {
  if (x.shape.join() !== ref.shape.join()) throw new Error(`result shape [${x.shape}] is not the reference's [${ref.shape}]`);
  const r = tf.tidy(() => tf.where(tf.all(tf.isFinite(x)), tf.div(tf.norm(tf.sub(x, ref)), tf.norm(ref)), tf.scalar(NaN)));
  const v = (await r.data())[0]!;
  r.dispose();
  return v;
}

/** Relative error bound of the check: f16 inputs give 3e-4 at these sizes (docs/gpu.md), a wrong kernel O(1). */
export const CHECK_REL_TOL = 2e-3;

export interface AutotunerOptions {
  timer: GemmTimer;
  /** the float32 product (tfjs's own kernel), [batch, m, n] */
  reference(a: tf.Tensor, b: tf.Tensor, s: GemmShape): tf.Tensor;
  errors?: ErrorCapture;
  /** VERL_GEMM_KERNEL's value */
  pin?: string;
  relTol?: number;
  log?: Pick<Logger, "info" | "warn">;
  /** the timing problem of a class (tests use small ones) */
  timeShape?(cls: string): GemmShape;
}

/** Choices per product class, made once each (concurrent asks share one tuning). */
export class GemmAutotuner {
  private readonly done = new Map<string, GemmChoice>();
  private readonly running = new Map<string, Promise<GemmChoice>>();
  private readonly pin: ReturnType<typeof parsePin>;
  /**
   * Each check draws new operands: a kernel that writes nothing returns a pooled buffer, which may
   * hold an earlier check's result; with the same operands that stale result would pass.
   */
  private draws = 0;

  constructor(readonly candidates: readonly GemmCandidate[], private readonly opts: AutotunerOptions) {
    const names = new Set<string>();
    for (const c of candidates) {
      if (names.has(c.name)) throw new Error(`GEMM autotuner: two candidates named '${c.name}'`);
      names.add(c.name);
    }
    this.pin = parsePin(opts.pin);
    for (const n of [this.pin.all, ...this.pin.byClass.values()]) {
      if (n !== undefined && n !== "f32" && !names.has(n)) throw new Error(`VERL_GEMM_KERNEL: no candidate '${n}' (have f32, ${[...names].join(", ")})`);
    }
  }

  /** The choice for a class, if it was made. */
  chosen(cls: string): GemmChoice | undefined { return this.done.get(cls); }

  /** Forgets every choice (the next product of each class tunes again). */
  reset(): void { this.done.clear(); }

  tune(cls: string): Promise<GemmChoice> {
    parseClass(cls);
    const d = this.done.get(cls);
    if (d) return Promise.resolve(d);
    let p = this.running.get(cls);
    if (!p) {
      p = this.decide(cls).then((c) => { this.done.set(cls, c); return c; }).finally(() => this.running.delete(cls));
      this.running.set(cls, p);
    }
    return p;
  }

  private async decide(cls: string): Promise<GemmChoice> {
    const log = this.opts.log;
    const pinned = this.pin.byClass.get(cls) ?? this.pin.all;
    if (pinned === "f32") {
      log?.info({ cls }, "gemm autotune: VERL_GEMM_KERNEL pins tfjs's float32 kernel");
      return { cls, candidate: null, pinned: true, reports: [] };
    }
    const pool = pinned !== undefined ? this.candidates.filter((c) => c.name === pinned) : this.candidates;
    const reports: CandidateReport[] = [];
    for (const c of pool) {
      const r = await this.check(c, cls);
      reports.push(r);
      if (!r.ok) log?.warn({ cls, kernel: c.name, params: c.params, reason: r.reason, relErr: r.relErr, shift: r.shift }, "gemm autotune: candidate skipped");
    }
    const correct = pool.filter((_, i) => reports[i]!.ok);
    if (pinned !== undefined && correct.length === 0) {
      throw new Error(`VERL_GEMM_KERNEL pins '${pinned}' for ${cls}, which failed its check: ${reports[0]!.reason}`);
    }
    if (correct.length === 0) {
      log?.warn({ cls, tried: reports.length }, "gemm autotune: no candidate is correct; this class stays on tfjs's float32 kernel");
      return { cls, candidate: null, pinned: false, reports };
    }
    if (correct.length === 1) {
      log?.info({ cls, kernel: correct[0]!.name, params: correct[0]!.params, pinned: pinned !== undefined }, "gemm autotune: chosen (only correct candidate)");
      return { cls, candidate: correct[0]!, pinned: pinned !== undefined, reports };
    }
    const s = (this.opts.timeShape ?? timeShape)(cls);
    const [a, b] = productOperands(s, 7919);
    let best: GemmCandidate | null = null, bestMs = Infinity;
    try {
      for (const c of correct) {
        const r = reports.find((x) => x.name === c.name)!;
        try {
          this.opts.errors?.begin();
          let thrown: unknown;
          const ms = await this.opts.timer(c, () => { c.matMul(a, b, s).dispose(); }, s).catch((e: unknown) => { thrown = e; return NaN; });
          const devErr = (await this.opts.errors?.end()) ?? null;
          if (thrown !== undefined) throw thrown;
          if (devErr) throw new Error(`device error while timing: ${devErr}`);
          if (!(ms > 0)) throw new Error(`timer gave ${ms} ms`);
          Object.assign(r, { ms, tflops: (2 * s.batch * s.m * s.n * s.k) / ms / 1e9 });
          // strictly faster: ties keep the earlier candidate, so the choice does not depend on noise-free ties
          if (ms < bestMs) { best = c; bestMs = ms; }
        } catch (e) {
          Object.assign(r, { ok: false, reason: `timing failed: ${(e as Error).message}` });
          log?.warn({ cls, kernel: c.name, reason: r.reason }, "gemm autotune: candidate skipped");
        }
      }
    } finally {
      tf.dispose([a, b]);
    }
    if (!best) {
      log?.warn({ cls }, "gemm autotune: every correct candidate failed its timing; this class stays on tfjs's float32 kernel");
      return { cls, candidate: null, pinned: false, reports };
    }
    const timed = reports.filter((r) => r.ms !== undefined).sort((x, y) => x.ms! - y.ms!).map((r) => `${r.name} ${r.tflops!.toFixed(1)}`);
    log?.info({ cls, kernel: best.name, params: best.params, ms: bestMs, shape: `${s.m}x${s.n}x${s.k}`, ranking: timed.join(", ") }, "gemm autotune: chosen");
    return { cls, candidate: best, pinned: false, reports };
  }

  /** Runs a candidate on the class's check problem against the float32 reference. */
  async check(c: GemmCandidate, cls: string): Promise<CandidateReport> {
    const s = checkShape(cls), tol = this.opts.relTol ?? CHECK_REL_TOL;
    const report: CandidateReport = { name: c.name, params: c.params, ok: false };
    const [a, b] = productOperands(s, 1009 + 2 * this.draws++);
    const ref = this.opts.reference(a, b, s);
    let out: tf.Tensor | undefined;
    try {
      this.opts.errors?.begin();
      let thrown: unknown;
      try { out = c.matMul(a, b, s); } catch (e) { thrown = e; }
      const devErr = (await this.opts.errors?.end()) ?? null;
      if (thrown !== undefined) { report.reason = `failed to run: ${(thrown as Error).message ?? String(thrown)}`; return report; }
      if (devErr) { report.reason = `device error (compile or dispatch): ${devErr}`; return report; }
      report.relErr = await relativeError(out!, ref);
      report.ok = report.relErr <= tol;
      if (!report.ok) {
        report.reason = `relative error ${report.relErr} above ${tol}`;
        report.shift = await this.shiftProbe(c, cls);
      }
      return report;
    } catch (e) {
      report.ok = false;
      report.reason = `check failed: ${(e as Error).message}`;
      return report;
    } finally {
      tf.dispose([a, b, ref]);
      out?.dispose();
    }
  }

  /**
   * A misplaced fragment shows as an exact index shift: A holds small integers (exact in f16),
   * B the identity, so C must equal A; the shift d with C[i] = A[i + d] for most i is returned
   * (0: none found wrong that way, null: not a shift).
   */
  async shiftProbe(c: GemmCandidate, cls: string): Promise<number | null> {
    const { transposeA, transposeB } = parseClass(cls);
    const m = 48, k = 80;
    const s: GemmShape = { batch: 1, m, n: k, k, transposeA, transposeB, batchA: 1, batchB: 1 };
    const off = this.draws++;
    const logical = Float32Array.from({ length: m * k }, (_, i) => (i + off) % 1021);
    const a = tf.tidy(() => { const x = tf.tensor3d(logical, [1, m, k]); return transposeA ? tf.transpose(x, [0, 2, 1]) : x; });
    const b = tf.tidy(() => tf.eye(k).reshape([1, k, k]));
    try {
      const out = c.matMul(a, b, s);
      const got = await out.data();
      out.dispose();
      let bestD: number | null = null, bestHits = 0;
      for (let d = -64; d <= 64; d++) {
        let hits = 0;
        for (let i = 0; i < got.length; i++) if (i + d >= 0 && i + d < logical.length && got[i] === logical[i + d]) hits++;
        if (hits > bestHits) { bestHits = hits; bestD = d; }
      }
      return bestHits >= 0.9 * got.length ? bestD : null;
    } catch {
      return null;
    } finally {
      tf.dispose([a, b]);
    }
  }
}
