// The tensor-core GEMM's host-side pieces (issue 23), checked without a GPU: shader rewriting,
// Dawn flag parsing, product shapes and padding, verl's mixed-precision keys, and the fallback
// off WebGPU. The kernels themselves run on the H200 (bench/gpu_gemm.ts, docs/gpu.md); on a
// machine with Dawn's null backend their WGSL is compiled by the same hoisting as in production.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { DirectGemmProgram, directPadding, hoistDirectives, rewriteF16Bindings, PackPadProgram, DEFAULT_DIRECT_TILE } from "../../src/engine/webgpu_gemm.js";
import { gemmShape, parsePrecision, readMixedPrecision, setMatmulPrecision, withMatmulPrecision, matmulPrecision } from "../../src/engine/webgpu_kernels.js";
import { splitFlags, DEFAULT_DAWN_FLAGS } from "../../src/engine/webgpu.js";

test("enable and diagnostic directives move above tfjs's prelude, once each", () => {
  const code = "struct U { a : f32, };\nfn f() {}\n      enable f16;\n      enable chromium_experimental_subgroup_matrix;\n      diagnostic(off, chromium.subgroup_matrix_uniformity);\nfn main() {}\n  enable f16;\n";
  const out = hoistDirectives(code);
  const lines = out.split("\n");
  assert.deepEqual(lines.slice(0, 3), ["enable f16;", "enable chromium_experimental_subgroup_matrix;", "diagnostic(off, chromium.subgroup_matrix_uniformity);"]);
  assert.equal(out.match(/enable f16;/g)!.length, 1);
  assert.ok(out.includes("struct U") && out.includes("fn main()"));
  assert.equal(hoistDirectives("fn main() { let enabled = 1; }"), "fn main() { let enabled = 1; }");
});

test("marked inputs are declared as f16 storage; others keep tfjs's type", () => {
  const code = "@group(0) @binding(1) var<storage, read> a: array<i32>;\n@group(0) @binding(2) var<storage, read> b: array<vec4<i32>>;\n@group(0) @binding(3) var<storage, read> c: array<f32>;\n// verl-f16-bindings: a,b\n";
  const out = rewriteF16Bindings(code);
  assert.ok(out.includes("var<storage, read> a: array<f16>;"));
  assert.ok(out.includes("var<storage, read> b: array<f16>;"));
  assert.ok(out.includes("var<storage, read> c: array<f32>;"));
  assert.equal(rewriteF16Bindings("var<storage, read> a: array<i32>;"), "var<storage, read> a: array<i32>;");
});

test("Dawn flags keep a toggle list together", () => {
  assert.deepEqual(splitFlags(DEFAULT_DAWN_FLAGS), [DEFAULT_DAWN_FLAGS]);
  assert.deepEqual(splitFlags("backend=opengl,enable-dawn-features=a,b,adapter=x"), ["backend=opengl", "enable-dawn-features=a,b", "adapter=x"]);
  assert.deepEqual(splitFlags(""), []);
});

test("product shapes: transposes, batch broadcast, mismatches refused", () => {
  const g = gemmShape([4, 10, 20], [20, 30], false, false)!;
  assert.deepEqual(g.shape, { batch: 4, m: 10, n: 30, k: 20, transposeA: false, transposeB: false, batchA: 4, batchB: 1 });
  assert.deepEqual(g.outShape, [4, 10, 30]);
  const t = gemmShape([20, 10], [30, 20], true, true)!;
  assert.deepEqual([t.shape.m, t.shape.n, t.shape.k], [10, 30, 20]);
  assert.equal(gemmShape([10, 20], [21, 30], false, false), null);
  assert.equal(gemmShape([2, 10, 20], [3, 20, 30], false, false), null);
  assert.equal(gemmShape([20], [20, 30], false, false), null);
});

test("direct kernel pads to its tile and dispatches one workgroup a tile", () => {
  const s = { batch: 2, m: 1000, n: 1032, k: 1000, transposeA: false, transposeB: true, batchA: 2, batchB: 1 };
  const pad = directPadding(s, DEFAULT_DIRECT_TILE);
  const tm = 16 * DEFAULT_DIRECT_TILE.tm * DEFAULT_DIRECT_TILE.sgM, tn = 16 * DEFAULT_DIRECT_TILE.tn * DEFAULT_DIRECT_TILE.sgN;
  assert.equal(pad.mP % tm, 0); assert.ok(pad.mP >= 1000 && pad.mP < 1000 + tm);
  assert.equal(pad.nP % tn, 0); assert.equal(pad.kP % 16, 0); assert.ok(pad.kP >= 1000);
  const p = new DirectGemmProgram(s, DEFAULT_DIRECT_TILE);
  assert.deepEqual(p.dispatch, [pad.nP / tn, pad.mP / tm, 2]);
  assert.deepEqual(p.outputShape, [2, pad.mP, pad.nP]);
  assert.match(p.getUserCode(), /col_major/); // B transposed: fragments read column-major
  const q = new PackPadProgram(2, 1000, 1000, pad.mP, pad.kP, "bf16");
  assert.equal(q.words, (2 * pad.mP * pad.kP) / 2);
  assert.throws(() => new PackPadProgram(1, 3, 3, 3, 3, "f16"), /even/);
});

test("verl's mixed_precision keys: dtype names, fp32-only reduce/buffer, unknown names named", () => {
  assert.equal(parsePrecision("bfloat16", "k"), "bf16");
  assert.equal(parsePrecision("fp16", "k"), "f16");
  assert.equal(parsePrecision("fp32", "k"), "f32");
  assert.throws(() => parsePrecision("int8", "a.b"), /a\.b: unknown dtype 'int8'/);
  const cfg = (m: Record<string, string>) => (k: string) => m[k] ?? null;
  const sec = "actor_rollout_ref.actor";
  assert.deepEqual(readMixedPrecision(cfg({}), sec).products, "f32");
  assert.equal(readMixedPrecision(cfg({ [`${sec}.fsdp_config.mixed_precision.param_dtype`]: "bf16" }), sec).products, "bf16");
  assert.throws(() => readMixedPrecision(cfg({ [`${sec}.fsdp_config.mixed_precision.reduce_dtype`]: "bf16" }), sec), /reduce_dtype=bf16: verl-ts reduces gradients .* in float32/);
  assert.doesNotThrow(() => readMixedPrecision(cfg({ [`${sec}.fsdp_config.mixed_precision.buffer_dtype`]: "fp32" }), sec));
});

test("off WebGPU 16-bit products fall back to float32, results unchanged", async () => {
  await tf.setBackend("cpu");
  assert.equal(setMatmulPrecision("bf16"), false);
  assert.equal(matmulPrecision(), "f32");
  const a = tf.tensor2d([[1, 2], [3, 4]]), b = tf.tensor2d([[5, 6], [7, 8]]);
  const got = await withMatmulPrecision({ products: "bf16", key: "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype" }, async () => Array.from(await tf.matMul(a, b).data()));
  assert.deepEqual(got, [19, 22, 43, 50]);
  assert.equal(matmulPrecision(), "f32");
  tf.dispose([a, b]);
});

test("dynamic loss scale: halves on a skipped step, doubles after the growth interval", async () => {
  const { DynamicLossScale } = await import("../../src/engine/loss_scale.js");
  const s = new DynamicLossScale(1024, 3, 256);
  s.update(true);
  assert.equal(s.scale, 512);
  s.update(false); s.update(false);
  assert.equal(s.scale, 512);
  s.update(false);
  assert.equal(s.scale, 1024);
  for (let i = 0; i < 5; i++) s.update(true);
  assert.equal(s.scale, 256); // floor
});

test("packed weight copies: kept per layout while the weight is unchanged, packed again after an update, freed with the old data", async () => {
  await tf.setBackend("cpu");
  const { PackedWeightCache } = await import("../../src/engine/webgpu_kernels.js");
  const be = tf.backend() as unknown as { write(v: Float32Array, s: number[], d: string): object; numDataIds(): number; disposeData(id: object, force?: boolean): boolean };
  const cache = new PackedWeightCache(be as unknown as ConstructorParameters<typeof PackedWeightCache>[0]);
  // stands in for PackPadProgram: a backend-owned buffer, as runWebGPUProgram returns
  const pack = () => ({ dataId: be.write(new Float32Array(8), [8], "float32"), shape: [8], dtype: "float32" });
  // a product's two layouts of one [4, 4] operand (padded as N to 128 and as K to 16)
  const NT = { base: "f16:1:4x4", batch: 1, rowsP: 128, colsP: 16 }, NN = { base: "f16:1:4x4", batch: 1, rowsP: 16, colsP: 128 };
  const init = tf.ones([4, 4]), w = tf.variable(init, true, "cache_test_w");
  init.dispose(); // the variable is the data's only holder, as a model's weights are
  const first = cache.get(w, NT, pack);
  assert.equal(first.owned, false);
  assert.equal(cache.get(w, NT, pack).info, first.info, "unchanged weight: the same copy");
  assert.equal(cache.packs, 1);
  cache.get(w, NN, pack); // the backward product's layout
  assert.equal(cache.packs, 2);
  const ids = be.numDataIds();
  const next = tf.zeros([4, 4]);
  w.assign(next); // what the optimizer does: new data for the variable
  next.dispose();
  assert.equal(cache.size, 0);
  assert.equal(be.numDataIds(), ids - 2, "the old data's two copies are freed with it (the new data replaces the old)");
  const again = cache.get(w, NT, pack);
  assert.notEqual(again.info, first.info);
  assert.equal(cache.packs, 3, "a changed weight is packed again");
  // an activation (not a variable's data) is packed every product and owned by the caller
  const x = tf.ones([4, 4]);
  assert.equal(cache.get(x, NT, pack).owned, true);
  cache.get(x, NT, pack);
  assert.equal(cache.packs, 5);
  assert.equal(cache.size, 1);
  w.dispose();
  assert.equal(cache.size, 0);
  x.dispose();
});
