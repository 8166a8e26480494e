import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { groupedAttention } from "../../src/models/attention.js";
import { Rng } from "../../src/utils/rng.js";

test("groupedAttention's recomputing gradient equals tfjs autograd of the plain formula", async () => {
  for (const backend of ["cpu", "wasm"]) {
    await initBackend(backend);
    const rng = new Rng(1), B = 2, K = 2, g = 2, T = 5, d = 4;
    const r = (n: number) => Float32Array.from({ length: n }, () => rng.normal());
    const q = tf.tensor3d(r(B * K * T * g * d), [B * K, T * g, d]), k = tf.tensor3d(r(B * K * T * d), [B * K, T, d]), v = tf.tensor3d(r(B * K * T * d), [B * K, T, d]);
    const up = tf.tensor3d(r(B * K * T * g * d), [B * K, T * g, d]);
    const biasArr = new Float32Array(B * T * T);
    for (let b = 0; b < B; b++) for (let t = 0; t < T; t++) for (let s = 0; s < T; s++) biasArr[(b * T + t) * T + s] = s <= t && !(b === 1 && s === 0) ? 0 : -1e9;
    const bias = tf.tensor(biasArr, [B, 1, T, 1, T]);
    const shape = { batch: B, kvHeads: K, group: g, seqLen: T };
    const plain = (qs: tf.Tensor, ks: tf.Tensor, vs: tf.Tensor) =>
      tf.matMul(tf.softmax(tf.matMul(qs as tf.Tensor3D, ks as tf.Tensor3D, false, true).reshape([B, K, T, g, T]).add(bias)).reshape([B * K, T * g, T]) as tf.Tensor3D, vs as tf.Tensor3D);
    const ours = (qs: tf.Tensor, ks: tf.Tensor, vs: tf.Tensor) => groupedAttention(qs as tf.Tensor3D, ks as tf.Tensor3D, vs as tf.Tensor3D, bias, shape);
    const loss = (f: typeof plain) => (qs: tf.Tensor, ks: tf.Tensor, vs: tf.Tensor) => tf.sum(tf.mul(f(qs, ks, vs), up));
    const want = tf.grads(loss(plain))([q, k, v]), got = tf.grads(loss(ours))([q, k, v]);
    const vWant = plain(q, k, v).dataSync(), vGot = ours(q, k, v).dataSync();
    vWant.forEach((x, i) => assert.ok(Math.abs(x - vGot[i]!) < 1e-5));
    want.forEach((w, j) => {
      const a = w.dataSync(), b = got[j]!.dataSync();
      a.forEach((x, i) => assert.ok(Math.abs(x - b[i]!) < 1e-4, `${backend} grad ${j}[${i}]: ${x} vs ${b[i]}`));
    });
    tf.dispose([q, k, v, up, bias, ...want, ...got]);
  }
});

test("the fused SIMD attention (wasm) matches the masked tfjs formula on real tokens, values and gradients", async () => {
  await initBackend("wasm");
  const { fusedAttentionAvailable } = await import("../../src/engine/fused_attention.js");
  const { contiguousKeyStart } = await import("../../src/models/llama.js");
  assert.ok(fusedAttentionAvailable(8));
  const rng = new Rng(2), B = 3, K = 2, g = 2, T = 9, d = 8;
  const r = (n: number) => Float32Array.from({ length: n }, () => rng.normal());
  // left padding, real tokens, right padding
  const mask = [[0, 0, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1, 0]].flat();
  const keyStart = contiguousKeyStart(mask, B, T)!;
  assert.deepEqual(Array.from(keyStart), [2, 0, 4]);
  assert.equal(contiguousKeyStart([1, 0, 1], 1, 3), undefined);
  const biasArr = new Float32Array(B * T * T);
  for (let b = 0; b < B; b++) for (let t = 0; t < T; t++) for (let s = 0; s < T; s++) biasArr[(b * T + t) * T + s] = s <= t && mask[b * T + s] ? 0 : -1e9;
  const bias = tf.tensor(biasArr, [B, 1, T, 1, T]);
  // upstream gradient zero on padding queries (their outputs are never used)
  const upArr = r(B * K * T * g * d);
  for (let bk = 0; bk < B * K; bk++) for (let t = 0; t < T; t++) if (!mask[Math.floor(bk / K) * T + t]) upArr.fill(0, (bk * T + t) * g * d, (bk * T + t + 1) * g * d);
  const up = tf.tensor3d(upArr, [B * K, T * g, d]);
  const q = tf.tensor3d(r(B * K * T * g * d), [B * K, T * g, d]), k = tf.tensor3d(r(B * K * T * d), [B * K, T, d]), v = tf.tensor3d(r(B * K * T * d), [B * K, T, d]);
  const shape = { batch: B, kvHeads: K, group: g, seqLen: T };
  const run = (ks?: Int32Array) => {
    const f = (qs: tf.Tensor, kk: tf.Tensor, vs: tf.Tensor) => groupedAttention(qs as tf.Tensor3D, kk as tf.Tensor3D, vs as tf.Tensor3D, bias, shape, ks);
    const out = f(q, k, v).mul(up.notEqual(0).toFloat()).dataSync();
    const grads = tf.grads((a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) => tf.sum(tf.mul(f(a, b, c), up)))([q, k, v]).map((t) => t.dataSync());
    return [out, ...grads];
  };
  const fused = run(keyStart), plain = run(undefined);
  fused.forEach((a, j) => a.forEach((x, i) => assert.ok(Math.abs(x - plain[j]![i]!) < 1e-4, `output ${j}[${i}]: ${x} vs ${plain[j]![i]}`)));
  tf.dispose([q, k, v, up, bias]);
});
