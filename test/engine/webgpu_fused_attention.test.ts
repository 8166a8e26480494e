// The fused causal grouped-query attention on WebGPU (engine/webgpu_fused_attention.ts) against the
// composite of llama.ts's decoderLayer (split, scale, transposes, models/attention.ts's
// groupedAttention, transpose back) on the same backend: values and gradients of q, k and v, with
// GQA, left padding (keyStart) and a packed-like right-padded view; dispatch counts; determinism;
// tensor counts; and a tiny Llama's loss and gradients with the fused kernels on and off. Runs only
// where a WebGPU adapter exists (the H200, or llvmpipe: docs/gpu.md, "Testing WebGPU code without a
// GPU"); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason, withFused } from "./webgpu_adapter.js";
import { tokenAttention } from "../../src/models/attention.js";
import { setFusedLayers } from "../../src/engine/webgpu_fused.js";
import { fusedAttentionFor, fusedCausalAttention, setAttentionRegisters, type CausalAttentionShape } from "../../src/engine/webgpu_fused_attention.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { Rng } from "../../src/utils/rng.js";

const skip = await webgpuOrReason();
// VERL_WEBGPU_FUSED=0 may have turned the kernels off; this file tests them, so on
setFusedLayers(true);
const gpu = { skip: skip || false };

interface Case extends CausalAttentionShape { hd: number; keyStart: number[]; /** real tokens per sequence from keyStart on (default: to the end) */ lengths?: number[] }

/** [B*T] 1 where token t of sequence b is real: keyStart[b] <= t < keyStart[b] + length[b]. */
function realTokens(c: Case): boolean[] {
  const r: boolean[] = [];
  for (let b = 0; b < c.batch; b++) {
    const end = c.keyStart[b]! + (c.lengths?.[b] ?? c.seqLen - c.keyStart[b]!);
    for (let t = 0; t < c.seqLen; t++) r.push(t >= c.keyStart[b]! && t < end);
  }
  return r;
}

/** The causal bias [B, 1, T, 1, T] llama.ts builds from the mask: 0 where key s is real and s <= t. */
function biasOf(c: Case, real: boolean[]): tf.Tensor {
  const { batch: B, seqLen: T } = c, bias = new Float32Array(B * T * T);
  for (let b = 0; b < B; b++) for (let t = 0; t < T; t++) for (let s = 0; s < T; s++) bias[(b * T + t) * T + s] = s <= t && real[b * T + s] ? 0 : -1e9;
  return tf.tensor(bias, [B, 1, T, 1, T]);
}

/** tokenAttention as llama.ts calls it, fused or the composite (split, scale, transposes, groupedAttention). */
function attention(on: boolean, qk: tf.Tensor3D, v: tf.Tensor3D, c: Case, real: boolean[]): tf.Tensor {
  return withFused(on, () => tf.tidy(() => {
    const shape = { batch: c.batch, seqLen: c.seqLen, kvHeads: c.kvHeads, group: c.heads / c.kvHeads, scale: c.scale };
    return tokenAttention(qk, v, biasOf(c, real), shape, Int32Array.from(c.keyStart));
  }));
}
const composite = (qk: tf.Tensor3D, v: tf.Tensor3D, c: Case, real: boolean[]) => attention(false, qk, v, c, real);

const fused = (qk: tf.Tensor3D, v: tf.Tensor3D, c: Case) => fusedCausalAttention(qk, v, Int32Array.from(c.keyStart), c);

function inputs(c: Case, seed: number): { qk: tf.Tensor3D; v: tf.Tensor3D; dy: tf.Tensor2D } {
  const N = c.batch * c.seqLen, real = realTokens(c);
  // dO zero on the padding query rows: their outputs differ by contract (zeros here, anything there)
  const rowMask = tf.tensor2d(real.map((r) => (r ? 1 : 0)), [N, 1]);
  const dy = tf.randomNormal([N, c.heads * c.hd], 0, 1, "float32", seed + 2).mul(rowMask) as tf.Tensor2D;
  rowMask.dispose();
  return { qk: tf.randomNormal([N, c.heads + c.kvHeads, c.hd], 0, 1.5, "float32", seed), v: tf.randomNormal([N, c.kvHeads, c.hd], 0, 1, "float32", seed + 1), dy };
}

const CASES: [string, Case][] = [
  ["GQA group 2, left padding", { batch: 2, seqLen: 7, heads: 4, kvHeads: 2, hd: 8, scale: 1 / Math.sqrt(8), keyStart: [0, 3] }],
  ["group 1, hd 12, one token", { batch: 1, seqLen: 1, heads: 2, kvHeads: 2, hd: 12, scale: 0.3, keyStart: [0] }],
  ["group 3, a sequence all padding", { batch: 3, seqLen: 5, heads: 6, kvHeads: 2, hd: 16, scale: 0.25, keyStart: [1, 5, 0] }],
  ["0.5B heads (14 q, 2 kv, hd 64), left padding", { batch: 2, seqLen: 33, heads: 14, kvHeads: 2, hd: 64, scale: 0.125, keyStart: [0, 10] }],
  ["packed-like right-padded segments", { batch: 3, seqLen: 6, heads: 4, kvHeads: 2, hd: 8, scale: 1 / Math.sqrt(8), keyStart: [0, 0, 0], lengths: [6, 2, 4] }],
];

test("off the webgpu backend the composite runs (no fused attention is asked for)", { skip: !skip ? "webgpu is the backend here" : false }, () => {
  assert.equal(fusedAttentionFor(tf.zeros([2, 3, 4])), false);
});

test("fused attention: values and gradients of qk and v match the composite (register-held and scalar kernels)", gpu, async () => {
  for (const [name, c] of CASES) {
    const { qk, v, dy } = inputs(c, c.batch * 10 + c.seqLen), real = realTokens(c);
    assert.ok(fusedAttentionFor(qk, v));
    const f = [fused(qk, v, c), ...tf.grads((a: tf.Tensor, b: tf.Tensor) => fused(a as tf.Tensor3D, b as tf.Tensor3D, c))([qk, v], dy)];
    const r = [composite(qk, v, c, real), ...tf.grads((a: tf.Tensor, b: tf.Tensor) => composite(a as tf.Tensor3D, b as tf.Tensor3D, c, real))([qk, v], dy)];
    // the scalar kernels (row arrays; a key row a thread backward), which head sizes not a multiple of 4 take
    const before = setAttentionRegisters(false);
    const scalarValue = fused(qk, v, c);
    const scalar = tf.grads((a: tf.Tensor, b: tf.Tensor) => fused(a as tf.Tensor3D, b as tf.Tensor3D, c))([qk, v], dy);
    setAttentionRegisters(before);
    const labels = ["value", "grad qk", "grad v"];
    for (let i = 0; i < 3; i++) {
      const e = await relErr(f[i]!, r[i]!, i === 0 ? real : undefined);
      assert.ok(e <= 1e-5, `${name} ${labels[i]}: relative error ${e.toExponential(2)}`);
      const es = await relErr(i === 0 ? scalarValue : scalar[i - 1]!, r[i]!, i === 0 ? real : undefined);
      assert.ok(es <= 1e-5, `${name} ${labels[i]}, scalar kernels: relative error ${es.toExponential(2)}`);
    }
    tf.dispose([scalarValue, ...scalar]);
    // padding queries: zeros, as the wasm kernels give
    const out = await f[0]!.data(), per = c.heads * c.hd;
    for (let n = 0; n < real.length; n++) {
      const t = n % c.seqLen;
      if (t < c.keyStart[Math.floor(n / c.seqLen)]!) for (let d = 0; d < per; d++) assert.equal(out[n * per + d], 0);
    }
    tf.dispose([qk, v, dy, ...f, ...r]);
  }
});

test("fused attention: forward 1 dispatch, backward 4 (3 scalar); same bits twice; no leaked tensors", gpu, async () => {
  const c = CASES[0]![1], { qk, v, dy } = inputs(c, 5), real = realTokens(c);
  const routed = dispatches(() => attention(true, qk, v, c, real));
  assert.equal(routed.n, 1, "tokenAttention takes the fused kernel when the kernels are on");
  const fwd = dispatches(() => fused(qk, v, c)), ref = dispatches(() => composite(qk, v, c, real));
  assert.equal(fwd.n, 1);
  const grad = (fn: (a: tf.Tensor3D, b: tf.Tensor3D) => tf.Tensor) => () => tf.grads((a: tf.Tensor, b: tf.Tensor) => fn(a as tf.Tensor3D, b as tf.Tensor3D))([qk, v], dy);
  const bwd = dispatches(grad((a, b) => fused(a, b, c))), refBwd = dispatches(grad((a, b) => composite(a, b, c, real)));
  assert.equal(bwd.n, 1 + 4, "the forward inside tf.grads, then stats, the gradients, and dK's and dV's sums over the group");
  const registers = setAttentionRegisters(false);
  const scalarBwd = dispatches(grad((a, b) => fused(a, b, c)));
  setAttentionRegisters(registers);
  assert.equal(scalarBwd.n, 1 + 3, "scalar: the forward, then stats, dV, dQ with dK");
  tf.dispose(scalarBwd.out);
  console.error(`attention with the layer's transposes: forward ${ref.n} -> ${fwd.n} dispatches, forward + backward ${refBwd.n} -> ${bwd.n}`);
  const again = grad((a, b) => fused(a, b, c))();
  for (let i = 0; i < 2; i++) assert.deepEqual(await again[i]!.data(), await bwd.out[i]!.data());
  const f2 = fused(qk, v, c);
  assert.deepEqual(await f2.data(), await fwd.out.data());
  assert.deepEqual(await routed.out.data(), await fwd.out.data());
  tf.dispose([routed.out, fwd.out, ref.out, ...bwd.out, ...refBwd.out, ...again, f2]);
  const step = () => tf.dispose(grad((a, b) => fused(a, b, c))());
  step();
  const before = tf.memory().numTensors;
  for (let i = 0; i < 3; i++) step();
  assert.equal(tf.memory().numTensors, before);
  tf.dispose([qk, v, dy]);
});

test("fused attention: shapes that do not fit are refused with the reason", gpu, () => {
  const qk = tf.zeros([6, 5, 4]) as tf.Tensor3D, v = tf.zeros([6, 2, 4]) as tf.Tensor3D;
  assert.throws(() => fusedCausalAttention(qk, v, new Int32Array(2), { batch: 2, seqLen: 3, heads: 4, kvHeads: 2, scale: 1 }), /qk is \[6,5,4\], expected \[6, 6, head_dim\]/);
  assert.throws(() => fusedCausalAttention(qk, v, new Int32Array(1), { batch: 2, seqLen: 3, heads: 3, kvHeads: 2, scale: 1 }), /not a multiple/);
  tf.dispose([qk, v]);
});

test("a 2-layer Llama, left-padded, and packed with checkpointing: loss and gradients agree with the fused kernels on and off", gpu, async () => {
  const cfg = makeConfig({ vocabSize: 64, dim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, hiddenDim: 80, maxSeqLen: 16 });
  const m = initModel(cfg, new Rng(3));
  const ids = tf.tensor2d([[1, 5, 9, 13, 2, 7], [0, 0, 8, 60, 11, 3]], undefined, "int32");
  const mask = [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1];
  const weight = tf.tensor3d(mask, [2, 6, 1]);
  const vars = m.trainableVariables();
  const run = (on: boolean) => withFused(on, () => dispatches(() => tf.tidy(() => {
    const { value, grads } = tf.variableGrads(() => tf.sum(tf.logSoftmax(m.forward(ids, { attentionMask: mask })).mul(weight).mul(-1 / 10)) as tf.Scalar, vars);
    return [value, ...vars.map((v) => grads[v.name]!)];
  })));
  // packed: three sequences back to back in one row (attention per segment on a right-padded view), checkpointed
  const packed = tf.tensor2d([[1, 5, 9, 13, 2, 7, 8, 60, 11, 3]], undefined, "int32"), segments = [4, 2, 4];
  const positionIds = segments.flatMap((n) => [...Array(n).keys()]);
  const runPacked = (on: boolean) => withFused(on, () => tf.tidy(() => {
    const { value, grads } = tf.variableGrads(() => tf.mean(tf.logSoftmax(m.forward(packed, { segments, positionIds })).mul(-1)) as tf.Scalar, vars);
    return [value, ...vars.map((v) => grads[v.name]!)];
  }));
  const f = run(true), r = run(false);
  m.gradientCheckpointing = true; // the packed runs recompute each layer in the backward pass
  const fp = runPacked(true), rp = runPacked(false);
  for (const [what, a, b] of [["padded", f.out, r.out], ["packed", fp, rp]] as const) {
    for (let i = 0; i < a.length; i++) {
      const e = await relErr(a[i]!, b[i]!);
      assert.ok(e <= 2e-5, `${what} ${i ? vars[i - 1]!.name : "loss"}: relative error ${e.toExponential(2)}`);
    }
  }
  assert.ok(f.n < r.n, `fused ${f.n} dispatches, composite ${r.n}`);
  console.error(`2-layer Llama forward+backward with padding: ${r.n} dispatches composite, ${f.n} fused (norms, GLU and attention)`);
  tf.dispose([...f.out, ...r.out, ...fp, ...rp, ids, weight, packed]);
  m.dispose();
});
