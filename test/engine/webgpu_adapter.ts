// For tests that need a WebGPU adapter: "" when the webgpu backend is up, else why not (the test skips with it);
// and what the fused-kernel tests measure with (relative error, dispatch counts).
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";

export async function webgpuOrReason(): Promise<string> {
  try {
    await initBackend("webgpu");
    return "";
  } catch (e) {
    return `no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`;
  }
}

/** max |a - b| over max |b|: the error relative to the reference's scale. */
export async function relErr(a: tf.Tensor, b: tf.Tensor): Promise<number> {
  assert.deepEqual(a.shape, b.shape);
  const x = await a.data(), y = await b.data();
  let d = 0, m = 0;
  for (let i = 0; i < y.length; i++) { d = Math.max(d, Math.abs(x[i]! - y[i]!)); m = Math.max(m, Math.abs(y[i]!)); }
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
