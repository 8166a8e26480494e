// stackRows and splitRows (src/engine/copies.ts): fused q/k/v and gate/up weights and LoRA's stacked
// A and B laid end to end by buffer copies on WebGPU, their gradients cut apart by copies. On the CPU
// they are tf.concat and tf.split; on WebGPU (llvmpipe here, the GPU machine there) a model's loss
// and gradients, full and LoRA, equal tfjs's dispatches' to the bit, with fewer dispatches.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, webgpuOrReason } from "./webgpu_adapter.js";
import { splitRows, stackRows } from "../../src/engine/copies.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import { LoraAdapter } from "../../src/models/lora.js";
import { Rng } from "../../src/utils/rng.js";

// Its LoRA counts are the unmerged form's; the merged one, WebGPU's default, is test/models/lora_merged.test.ts's.
process.env.VERL_LORA_MERGED = "0";

const withCopies = <T>(on: boolean, fn: () => T): T => {
  const before = process.env.VERL_FLAT_BY_COPIES;
  process.env.VERL_FLAT_BY_COPIES = on ? "1" : "0";
  try { return fn(); } finally { if (before === undefined) delete process.env.VERL_FLAT_BY_COPIES; else process.env.VERL_FLAT_BY_COPIES = before; }
};

test("stackRows and splitRows: tf.concat and tf.split on the CPU; parts that disagree, or rows that do not add up, are refused", async () => {
  await tf.setBackend("cpu");
  const a = tf.ones([2, 3]), b = tf.ones([2, 4]), c = tf.range(0, 12).reshape([4, 3]);
  assert.throws(() => stackRows([a, b]), /stackRows: parts must agree past their first axis, got \[2,3\], \[2,4\]/);
  assert.throws(() => stackRows([]), /nothing to stack/);
  assert.equal(stackRows([a]), a);
  assert.deepEqual(await stackRows([a, c]).array(), await tf.concat([a, c], 0).array());
  const pieces = splitRows(c, [1, 3]);
  assert.deepEqual(pieces.map((p) => p.shape), [[1, 3], [3, 3]]);
  assert.deepEqual(await pieces[1]!.array(), [[3, 4, 5], [6, 7, 8], [9, 10, 11]]);
  assert.throws(() => splitRows(c, [1, 2]), /splitRows: pieces of 3 rows in all, the tensor is \[4,3\]/);
  tf.dispose([a, b, c, ...pieces]);
});

test("stackRows on WebGPU: values and gradients equal tf.concat's, no dispatch; a model's pass the same bits with fewer dispatches", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const parts = [[5, 8], [3, 8], [3, 8]].map((s, i) => tf.variable(tf.randomNormal(s, 0, 1, "float32", i), true, `stack_rows_${i}`));
  const weight = tf.randomNormal([11, 8], 0, 1, "float32", 9);
  const loss = (stack: () => tf.Tensor) => () => tf.sum(tf.mul(tf.square(stack()), weight)) as tf.Scalar;
  const copied = dispatches(() => withCopies(true, () => stackRows(parts)));
  assert.equal(copied.n, 0, "the stack: buffer copies, no dispatch");
  assert.deepEqual(await copied.out.data(), await tf.concat(parts, 0).data());
  const cut = dispatches(() => withCopies(true, () => splitRows(copied.out, [5, 6])));
  assert.equal(cut.n, 0, "the split: buffer copies, no dispatch");
  assert.deepEqual(cut.out.map((p) => p.shape), [[5, 8], [6, 8]]);
  assert.deepEqual(await cut.out[1]!.data(), await tf.slice(copied.out, [5, 0], [6, 8]).data());
  tf.dispose(cut.out);
  // differentiated through: only the second piece used, the first's gradient is zeros
  const x = parts[0]!, wx = tf.randomNormal([3, 8], 0, 1, "float32", 7);
  const viaCut = withCopies(true, () => tf.grad((v: tf.Tensor) => tf.sum(tf.mul(splitRows(v, [2, 3])[1]!, wx)))(x));
  const viaSplit = tf.grad((v: tf.Tensor) => tf.sum(tf.mul(tf.split(v, [2, 3], 0)[1]!, wx)))(x);
  assert.deepEqual(await viaCut.data(), await viaSplit.data(), "splitRows' gradient: tf.split's");
  tf.dispose([wx, viaCut, viaSplit]);
  const byCopies = withCopies(true, () => tf.variableGrads(loss(() => stackRows(parts)), parts));
  const byConcat = tf.variableGrads(loss(() => tf.concat(parts, 0)), parts);
  assert.deepEqual(await byCopies.value.data(), await byConcat.value.data());
  for (const p of parts) {
    assert.deepEqual(byCopies.grads[p.name]!.shape, p.shape);
    assert.deepEqual(await byCopies.grads[p.name]!.data(), await byConcat.grads[p.name]!.data(), `${p.name}: the same gradient`);
  }
  tf.dispose([copied.out, weight, byCopies.value, byConcat.value, ...Object.values(byCopies.grads), ...Object.values(byConcat.grads), ...parts]);

  // q/k/v with biases (Qwen2) and gate/up: 3 stacks a layer forward, 8 splits backward
  const config = makeConfig({ vocabSize: 64, dim: 32, hiddenDim: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: true, maxSeqLen: 32 });
  const ids = tf.tensor2d(Int32Array.from({ length: 2 * 9 }, (_, i) => (i * 11) % 64), [2, 9], "int32");
  // full fine-tuning: 3 stacks a layer forward, 8 splits backward; LoRA r=4 (all linear): A's and B's
  // stacks (once a weight version) and the A and B gradients' splits (5 + 5 a layer)
  for (const [lora, fewer] of [[false, 11], [true, 10]] as const) {
    const model = initModel(config, new Rng(3));
    if (lora) model.lora = LoraAdapter.init(config, { rank: 4, alpha: 8, targetModules: "all-linear" }, new Rng(4));
    const pass = (copies: boolean) => withCopies(copies, () => dispatches(() =>
      tf.variableGrads(() => tf.tidy(() => tf.mean(tf.square(model.forward(ids))) as tf.Scalar), [...model.trainableParams().values()])));
    pass(true);
    const before = tf.memory().numTensors;
    const viaCopies = pass(true), viaConcat = pass(false);
    const what = lora ? "LoRA" : "full";
    t.diagnostic(`${what}, two layers: ${viaConcat.n} dispatches with tf.concat and tf.split, ${viaCopies.n} with copies`);
    assert.ok(viaConcat.n - viaCopies.n >= 2 * fewer, `${what}: ${viaConcat.n - viaCopies.n} dispatches fewer, ${fewer} a layer expected`);
    assert.deepEqual(await viaCopies.out.value.data(), await viaConcat.out.value.data(), `${what}: the same loss`);
    for (const k of Object.keys(viaConcat.out.grads)) assert.deepEqual(await viaCopies.out.grads[k]!.data(), await viaConcat.out.grads[k]!.data(), `${what} ${k}: the same gradient`);
    const outs = [viaCopies.out, viaConcat.out].flatMap((o) => [o.value, ...Object.values(o.grads)]);
    assert.equal(tf.memory().numTensors - before, outs.length, `${what}: nothing left alive but the outputs`);
    tf.dispose(outs);
  }
  ids.dispose();
});
