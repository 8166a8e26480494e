// LoRA on merged weights (VERL_LORA_MERGED=1, WebGPU): y = x (W + s B A)^T as one product, and the
// adapters' gradients projected from the full weight gradient. Held to the unmerged form (the same
// math in another order) for the value and every gradient, with tied A factors (a shared slot) and
// blocks of different sizes; the merged weight made once per adapter version; fewer dispatches; no
// tensor left behind. Where no WebGPU adapter is, the test skips (the form is WebGPU's only).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason } from "../engine/webgpu_adapter.js";
import { loraLinear, mergesAdapters, parseLoraMerged } from "../../src/models/lora_linear.js";
import { setMatmulPrecision, tensorCoreSupport } from "../../src/engine/webgpu_kernels.js";

/** A 2-D variable that alone holds its data (tf.variable shares its initial tensor's), as a model's weights do. */
function v2(t: tf.Tensor, trainable = true): tf.Variable<tf.Rank.R2> {
  const v = tf.variable(t, trainable) as tf.Variable<tf.Rank.R2>;
  t.dispose();
  return v;
}

function withMerged<T>(on: boolean, fn: () => T): T {
  const prev = process.env.VERL_LORA_MERGED;
  process.env.VERL_LORA_MERGED = on ? "1" : "0";
  try { return fn(); } finally { if (prev === undefined) delete process.env.VERL_LORA_MERGED; else process.env.VERL_LORA_MERGED = prev; }
}

test("VERL_LORA_MERGED: merged weights unless 0 (WebGPU only); any other value is an error naming the variable", () => {
  assert.equal(parseLoraMerged(undefined), true);
  assert.equal(parseLoraMerged("1"), true);
  assert.equal(parseLoraMerged("0"), false);
  assert.throws(() => parseLoraMerged("yes"), /VERL_LORA_MERGED=yes: expected 1 .* or 0/);
  if (tf.getBackend() !== "webgpu") assert.equal(mergesAdapters(), false); // the CPU keeps the unmerged form
});

test("LoRA on merged weights: the unmerged form's value and gradients, the merge made once per adapter version, fewer dispatches, nothing left", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  assert.equal(withMerged(true, mergesAdapters), true);
  assert.equal(withMerged(false, mergesAdapters), false);
  const N = 40, D = 48, r = 4, s = 2;
  const sizes = [48, 16, 16];
  const frozen = sizes.map((n, i) => v2(tf.randomNormal([n, D], 0, 0.2, "float32", 10 + i), false));
  // q and k share their A (tiedA): two slots for three blocks
  const a0 = v2(tf.randomNormal([r, D], 0, 0.2, "float32", 20)), a2 = v2(tf.randomNormal([r, D], 0, 0.2, "float32", 22));
  const as = [a0, a0, a2];
  const bs = sizes.map((n, i) => v2(tf.randomNormal([n, r], 0, 0.2, "float32", 30 + i)));
  const x = v2(tf.randomNormal([N, D], 0, 1, "float32", 40));
  const dy = tf.randomNormal([N, 80], 0, 1, "float32", 41);
  const vars = [x, a0, a2, ...bs];
  const pass = () => tf.variableGrads(() => tf.sum(tf.mul(loraLinear(x, frozen.map((w, i) => ({ w, a: as[i], b: bs[i] })), s), dy)), vars);
  const unmerged = withMerged(false, pass);
  const first = withMerged(true, () => dispatches(pass)); // makes and keeps the merged weight
  tf.dispose([first.out.value, ...Object.values(first.out.grads)]);
  const before = tf.memory().numTensors;
  const counted = withMerged(true, () => dispatches(pass)), merged = counted.out;
  assert.ok(first.n > counted.n, `the merge is made once: ${first.n} dispatches in the first merged pass, ${counted.n} in the next`);
  const plain = withMerged(false, () => dispatches(pass));
  t.diagnostic(`dispatches a forward and backward: ${counted.n} merged, ${plain.n} unmerged`);
  assert.ok(counted.n < plain.n, `${counted.n} dispatches merged against ${plain.n}`);
  assert.ok(await relErr(merged.value, unmerged.value) < 1e-5, "the value");
  for (const v of vars) {
    const e = await relErr(merged.grads[v.name]!, unmerged.grads[v.name]!);
    assert.ok(e < 1e-5, `${v.name}: ${e} relative to the unmerged form's gradient`);
  }
  tf.dispose([merged.value, ...Object.values(merged.grads), plain.out.value, ...Object.values(plain.out.grads)]);
  assert.equal(tf.memory().numTensors, before, "a merged pass keeps nothing but its outputs");
  // an optimizer step's assignment makes a new adapter version: the kept merged weight goes with the
  // old data (one tensor fewer), and the next call merges again
  const stepped = tf.add(bs[0]!, 0.5) as tf.Tensor2D, live = tf.memory().numTensors;
  bs[0]!.assign(stepped);
  stepped.dispose();
  assert.equal(tf.memory().numTensors, live - 2, "the merged weight is freed with the adapter's old data");
  const after = withMerged(true, pass), ref = withMerged(false, pass);
  for (const v of vars) {
    const e = await relErr(after.grads[v.name]!, ref.grads[v.name]!);
    assert.ok(e < 1e-5, `${v.name} after the step: ${e}`);
  }
  assert.ok(await relErr(after.value, ref.value) < 1e-5, "the value after the step");
  tf.dispose([after.value, ...Object.values(after.grads), ref.value, ...Object.values(ref.grads), unmerged.value, ...Object.values(unmerged.grads), ...frozen, ...vars, dy]);
});

test("LoRA on merged weights under 16-bit products: within the tensor cores' rounding of the unmerged form", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  const N = 640, D = 256, r = 32, s = 2, sizes = [384, 128, 128];
  const frozen = sizes.map((n, i) => v2(tf.randomNormal([n, D], 0, 0.05, "float32", 10 + i), false));
  const as = sizes.map((_, i) => v2(tf.randomNormal([r, D], 0, 0.05, "float32", 20 + i)));
  const bs = sizes.map((n, i) => v2(tf.randomNormal([n, r], 0, 0.05, "float32", 30 + i)));
  const x = v2(tf.randomNormal([N, D], 0, 1, "float32", 40)), dy = tf.randomNormal([N, 640], 0, 1, "float32", 41);
  const vars = [x, ...as, ...bs];
  const pass = () => tf.variableGrads(() => tf.sum(tf.mul(loraLinear(x, frozen.map((w, i) => ({ w, a: as[i], b: bs[i] })), s), dy)), vars);
  setMatmulPrecision("f16");
  t.after(() => setMatmulPrecision("f32"));
  const unmerged = withMerged(false, () => dispatches(pass)), merged = withMerged(true, () => dispatches(pass)), again = withMerged(true, () => dispatches(pass));
  t.diagnostic(`dispatches: ${unmerged.n} unmerged, ${merged.n} merged (merging), ${again.n} merged (kept)`);
  assert.ok(again.n < unmerged.n, `${again.n} against ${unmerged.n}`);
  for (const v of vars) {
    const e = await relErr(again.out.grads[v.name]!, unmerged.out.grads[v.name]!);
    t.diagnostic(`${v.name}: ${e.toExponential(2)}`);
    assert.ok(e < 5e-3, `${v.name}: ${e} relative to the unmerged form's gradient`);
    assert.deepEqual(await again.out.grads[v.name]!.data(), await merged.out.grads[v.name]!.data(), `${v.name}: the same bits twice`);
  }
  tf.dispose([...[unmerged, merged, again].flatMap((p) => [p.out.value, ...Object.values(p.out.grads)]), ...frozen, ...vars, dy]);
});
