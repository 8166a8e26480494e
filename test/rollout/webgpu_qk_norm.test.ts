// QkNormProgram (src/rollout/webgpu_programs.ts): Qwen3's per-head q/k RMSNorm in one dispatch,
// against the same math in tfjs ops (what the WebGPU decoder ran before: ~15 dispatches a layer).
// Needs a WebGPU adapter (llvmpipe or a GPU); skips with the reason without one.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { webgpuOrReason } from "../engine/webgpu_adapter.js";
import { QkNormProgram, type GpuProgram, type UniformValue } from "../../src/rollout/webgpu_programs.js";

type Runner = { runWebGPUProgram(p: GpuProgram, inputs: tf.TensorInfo[], dtype: string, uniforms: UniformValue[]): tf.TensorInfo };

test("QkNormProgram equals per-head RMSNorm of q and k (v untouched) in tfjs ops", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const s = { nHeads: 4, nKvHeads: 2, headDim: 24, normEps: 1e-6 }, N = 7, W = (s.nHeads + 2 * s.nKvHeads) * s.headDim;
  const qkv = tf.randomNormal([N, W], 0, 2, "float32", 1), qn = tf.randomNormal([s.headDim], 1, 0.3, "float32", 2), kn = tf.randomNormal([s.headDim], 1, 0.3, "float32", 3);
  try {
    const info = (tf.backend() as unknown as Runner).runWebGPUProgram(new QkNormProgram(s, N), [qkv, qn, kn], "float32", [{ type: "int32", data: [N] }]);
    const got = tf.engine().makeTensorFromTensorInfo(info);
    const want = tf.tidy(() => {
      const [q, k, v] = tf.split(qkv, [s.nHeads * s.headDim, s.nKvHeads * s.headDim, s.nKvHeads * s.headDim], 1);
      const norm = (x: tf.Tensor, w: tf.Tensor, heads: number) => {
        const r = x.reshape([N * heads, s.headDim]);
        return r.mul(tf.rsqrt(r.square().mean(-1, true).add(s.normEps))).mul(w).reshape([N, heads * s.headDim]);
      };
      return tf.concat([norm(q!, qn, s.nHeads), norm(k!, kn, s.nKvHeads), v!], 1);
    });
    const g = await got.data(), w = await want.data();
    let worst = 0;
    for (let i = 0; i < w.length; i++) worst = Math.max(worst, Math.abs(g[i]! - w[i]!) / (1e-6 + Math.abs(w[i]!)));
    assert.ok(worst < 1e-5, `largest relative difference ${worst}`);
    // v passes through exactly
    const vFrom = (s.nHeads + s.nKvHeads) * s.headDim;
    for (let n = 0; n < N; n++) for (let d = vFrom; d < W; d++) assert.equal(g[n * W + d], w[n * W + d]);
    tf.dispose([got, want]);
  } finally {
    tf.dispose([qkv, qn, kn]);
  }
});
