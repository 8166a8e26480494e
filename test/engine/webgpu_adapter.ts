// For tests that need a WebGPU adapter: "" when the webgpu backend is up, else why not (the test skips with it);
// and what the fused-kernel tests share (engine/webgpu_fused.ts's switch, dispatch counting, relative error).
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { setFusedLayers } from "../../src/engine/webgpu_fused.js";

export async function webgpuOrReason(): Promise<string> {
  try {
    await initBackend("webgpu");
    return "";
  } catch (e) {
    return `no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`;
  }
}

/** Runs fn with the fused kernels on or off (the composite on the same backend), then leaves them on. */
export function withFused<T>(on: boolean, fn: () => T): T {
  setFusedLayers(on);
  try { return fn(); } finally { setFusedLayers(true); }
}

/** max |a - b| over max |b|: the error relative to the reference's scale (only rows of the leading axis where keep is set, if given). */
export async function relErr(a: tf.Tensor, b: tf.Tensor, keep?: boolean[]): Promise<number> {
  assert.deepEqual(a.shape, b.shape);
  const x = await a.data(), y = await b.data(), per = y.length / Math.max(a.shape[0] ?? 1, 1);
  let d = 0, m = 0;
  for (let i = 0; i < y.length; i++) {
    if (keep && !keep[Math.floor(i / per)]) continue;
    d = Math.max(d, Math.abs(x[i]! - y[i]!)); m = Math.max(m, Math.abs(y[i]!));
  }
  return d / Math.max(m, 1e-30);
}

/** Counts the programs the webgpu backend runs inside fn. */
export function dispatches<T>(fn: () => T): { out: T; n: number } {
  const be = tf.backend() as unknown as { runWebGPUProgram: (...a: unknown[]) => unknown };
  const orig = be.runWebGPUProgram;
  let n = 0;
  be.runWebGPUProgram = function (this: unknown, ...a: unknown[]) { n++; return orig.apply(this, a); };
  try { return { out: fn(), n }; } finally { be.runWebGPUProgram = orig; }
}

/**
 * op(a) op(b) on the host in float64, every `step`-th output row: the reference for products on the
 * GPU, tfjs's own float32 one included (it has been wrong: webgpu_f32_matmul_guard.test.ts).
 */
export async function hostRows(a: tf.Tensor2D, b: tf.Tensor2D, ta: boolean, tb: boolean, step: number): Promise<{ rows: number[]; ref: Float64Array; n: number }> {
  const x = await a.data(), y = await b.data();
  const [m, k] = ta ? [a.shape[1], a.shape[0]] : a.shape, n = tb ? b.shape[0] : b.shape[1];
  const rows: number[] = [];
  for (let i = 0; i < m; i += step) rows.push(i);
  const ref = new Float64Array(rows.length * n);
  rows.forEach((i, r) => {
    for (let j = 0; j < n; j++) {
      let acc = 0;
      for (let p = 0; p < k; p++) acc += x[ta ? p * m + i : i * k + p]! * y[tb ? j * k + p : p * n + j]!;
      ref[r * n + j] = acc;
    }
  });
  return { rows, ref, n };
}

/** max |out - ref| over max |ref| on the reference's rows. */
export async function relToHost(out: tf.Tensor, h: { rows: number[]; ref: Float64Array; n: number }): Promise<number> {
  const o = await out.data();
  let d = 0, mx = 0;
  h.rows.forEach((i, r) => {
    for (let j = 0; j < h.n; j++) {
      d = Math.max(d, Math.abs(o[i * h.n + j]! - h.ref[r * h.n + j]!)); mx = Math.max(mx, Math.abs(h.ref[r * h.n + j]!));
    }
  });
  return d / Math.max(mx, 1e-30);
}
