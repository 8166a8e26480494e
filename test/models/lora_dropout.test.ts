// LoRA dropout (Megatron-Bridge's lora.dropout / dropout_position, peft's lora_dropout): on the
// adapter branch in training passes only, seeded, the same masks when a checkpointed layer is
// recomputed, and gradients through the kept units only.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { LoraAdapter, trainingForward } from "../../src/models/lora.js";
import { AdapterDropout, type DropoutPosition } from "../../src/models/lora_dropout.js";
import { loraLinear, type LoraBlock } from "../../src/models/lora_linear.js";
import { Rng } from "../../src/utils/rng.js";

const config = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: false, maxSeqLen: 64 });
const IDS = [1, 5, 9, 13, 2, 7, 3, 3, 8, 21, 30, 4];

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

/** A LoRA model with non-zero B (so the adapter branch matters); q/k/v share A as Megatron's fused linear_qkv does. */
function adapted(dropout: number, position: DropoutPosition = "pre"): LlamaModel {
  const m = initModel(config, new Rng(1));
  const tiedA = [0, 1].map((i) => ["q_proj", "k_proj", "v_proj"].map((p) => `model.layers.${i}.self_attn.${p}`));
  m.lora = LoraAdapter.init(config, { rank: 4, alpha: 8, targetModules: "all-linear", tiedA, dropout, dropoutPosition: position }, new Rng(2));
  let s = 10;
  for (const mod of m.lora.modules.values()) mod.b.assign(tf.randomNormal(mod.b.shape, 0, 0.3, "float32", s++));
  return m;
}

/** sum(logits * fixed weights) and its adapter gradients, in a training pass with `seed` (or none). */
function run(m: LlamaModel, seed: number | null, checkpointing = false): { loss: number; grads: Float32Array[] } {
  m.gradientCheckpointing = checkpointing;
  const vars = m.trainableVariables();
  const ids = tf.tensor2d(IDS, [2, 6], "int32"), weights = tf.randomNormal([2, 6, 40], 0, 1, "float32", 7);
  const f = () => m.forward(ids).mul(weights).sum() as tf.Scalar;
  const { value, grads } = tf.variableGrads(() => (seed === null ? f() : m.lora!.trainingPass(seed, f)), vars);
  const out = { loss: value.dataSync()[0]!, grads: vars.map((v) => Float32Array.from(grads[v.name]!.dataSync())) };
  tf.dispose([ids, weights, value, ...Object.values(grads)]);
  return out;
}

const logits = (m: LlamaModel) => tf.tidy(() => Float32Array.from(m.forward(tf.tensor2d(IDS, [2, 6], "int32")).dataSync()));

test("LoRA dropout: p = 0 is the plain adapter; p > 0 changes training passes only; the same seed gives the same pass; checkpointed layers redraw the forward's masks", async () => {
  await initBackend("cpu");
  for (const position of ["pre", "post"] as const) {
    const plain = adapted(0), drop = adapted(0.3, position);
    const base = run(plain, null);
    // p = 0: a training pass is the plain forward, and draws nothing from the caller's stream
    const zero = run(plain, 5);
    assert.equal(zero.loss, base.loss);
    const rng = new Rng(9), before = rng.getState();
    trainingForward(plain.lora, rng, () => 0);
    assert.deepEqual(rng.getState(), before, "no dropout, no draw");
    // outside a training pass (log-probs, values) dropout is off: bit-equal logits
    assert.equal(maxDiff(logits(drop), logits(plain)), 0, `${position}: inference pass unchanged`);
    const a = run(drop, 5), again = run(drop, 5), other = run(drop, 6);
    assert.ok(Math.abs(a.loss - base.loss) > 1e-3, `${position}: dropout changes the training loss (${a.loss} vs ${base.loss})`);
    assert.equal(again.loss, a.loss, `${position}: same seed, same loss`);
    a.grads.forEach((g, i) => assert.equal(maxDiff(g, again.grads[i]!), 0, `${position}: same seed, same gradient ${i}`));
    assert.notEqual(other.loss, a.loss, `${position}: another seed, other masks`);
    // gradient checkpointing recomputes each layer in the backward pass, after the training pass ended: same masks
    const ckpt = run(drop, 5, true);
    assert.ok(Math.abs(ckpt.loss - a.loss) < 1e-4, `${position}: checkpointed loss ${ckpt.loss} vs ${a.loss}`);
    ckpt.grads.forEach((g, i) => assert.ok(maxDiff(g, a.grads[i]!) < 1e-4, `${position}: checkpointed gradient ${i}: ${maxDiff(g, a.grads[i]!)}`));
    assert.equal(maxDiff(logits(drop), logits(plain)), 0, `${position}: the pass ended with fn`);
    plain.dispose(); drop.dispose();
  }
});

test("LoRA dropout masks: kept with probability 1 - p and scaled by 1 / (1 - p); a fused module's parts share the input mask (one Megatron adapter), not the output masks", async () => {
  await initBackend("cpu");
  const d = new AdapterDropout(0.25, "pre", 123);
  const mask = d.mask("x", 200, 100).dataSync();
  const zeros = mask.filter((v) => v === 0).length / mask.length;
  assert.ok(Math.abs(zeros - 0.25) < 0.02, `dropped fraction ${zeros}`);
  assert.ok(mask.every((v) => v === 0 || Math.abs(v - 1 / 0.75) < 1e-6));
  assert.deepEqual(Array.from(d.mask("x", 4, 4).dataSync()), Array.from(new AdapterDropout(0.25, "pre", 123).mask("x", 4, 4).dataSync()));
  assert.notDeepEqual(Array.from(d.mask("x", 8, 8).dataSync()), Array.from(d.mask("y", 8, 8).dataSync()));
  const m = adapted(0.5);
  const q = "model.layers.0.self_attn.q_proj", k = "model.layers.0.self_attn.k_proj";
  const get = (n: string): tf.Tensor => m.lora!.namedParams().get(n) ?? m.p(n);
  for (const position of ["pre", "post"] as const) {
    const drop = new AdapterDropout(0.5, position, 7);
    const bq = m.lora!.block(q, m.p(`${q}.weight`) as tf.Tensor2D, 6, get, drop), bk = m.lora!.block(k, m.p(`${k}.weight`) as tf.Tensor2D, 6, get, drop);
    if (position === "pre") assert.deepEqual(Array.from(bq.dropIn!.dataSync()), Array.from(bk.dropIn!.dataSync()), "q and k see one input mask");
    else assert.notDeepEqual(Array.from(bq.dropOut!.dataSync()).slice(0, 16), Array.from(bk.dropOut!.dataSync()).slice(0, 16));
  }
  m.dispose();
});

test("loraLinear with dropout (pre and post): value and gradients of x, A, B match autodiff of the masked formula; a dropped input column gets no A gradient", async () => {
  for (const backend of ["cpu", "wasm"]) {
    await initBackend(backend);
    const r = (s: number[], seed: number) => tf.randomNormal(s, 0, 0.5, "float32", seed);
    const x = r([5, 6], 1) as tf.Tensor2D, w0 = r([4, 6], 2) as tf.Tensor2D, w1 = r([3, 6], 3) as tf.Tensor2D;
    const a0 = r([2, 6], 4) as tf.Tensor2D, b0 = r([4, 2], 5) as tf.Tensor2D, dy = r([5, 7], 6), s = 1.5;
    const drop = new AdapterDropout(0.4, "pre", 3);
    // input column 2 dropped in every row: its A column gets no gradient
    const dropIn = tf.tidy(() => drop.mask("a", 5, 6).mul(tf.tensor2d([1, 1, 0, 1, 1, 1], [1, 6]))) as tf.Tensor2D;
    const dropOut = drop.mask("b", 5, 4);
    for (const [name, extra] of [["pre", { dropIn }], ["post", { dropOut }]] as [string, Partial<LoraBlock>][]) {
      const fused = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor) => loraLinear(xx as tf.Tensor2D, [{ w: w0, a: aa as tf.Tensor2D, b: bb as tf.Tensor2D, ...extra }, { w: w1 }], s);
      const plain = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor) => {
        const xd = extra.dropIn ? xx.mul(extra.dropIn) : xx;
        let d0 = tf.matMul(tf.matMul(xd, aa, false, true), bb, false, true).mul(s);
        if (extra.dropOut) d0 = d0.mul(extra.dropOut);
        return tf.matMul(xx, tf.concat([w0, w1], 0), false, true).add(tf.concat([d0, tf.zeros([5, 3])], 1));
      };
      assert.ok(maxDiff(fused(x, a0, b0).dataSync(), plain(x, a0, b0).dataSync()) < 1e-5, `${backend} ${name} value`);
      const g1 = tf.grads(fused)([x, a0, b0], dy), g2 = tf.grads(plain)([x, a0, b0], dy);
      g1.forEach((g, i) => assert.ok(maxDiff(g.dataSync(), g2[i]!.dataSync()) < 1e-5, `${backend} ${name} grad ${i}`));
      if (name === "pre") {
        const dA = g1[1]!.arraySync() as number[][];
        assert.ok(dA.every((row) => row[2] === 0) && dA.some((row) => row[0] !== 0), "dA is zero exactly on the dropped column");
      }
      tf.dispose([...g1, ...g2]);
    }
    tf.dispose([x, w0, w1, a0, b0, dy, dropIn, dropOut]);
  }
});
