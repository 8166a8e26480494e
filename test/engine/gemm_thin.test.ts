// VERL_GEMM_THIN=f32 (issue 23, LoRA at full speed): LoRA's adapter products, those with a side or a
// K of at most THIN_SIDE, run on tfjs's float32 kernel (one dispatch, transposes inside) instead of a
// tensor-core product with its packs and split-K sums; those with a long K stay on the tensor cores,
// whose split-K spreads them over the GPU. The policy's classification runs anywhere; the products,
// where an adapter has the tensor cores.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason } from "./webgpu_adapter.js";
import { THIN_F32_MAX_K, parseThinPolicy, setMatmulPrecision, setThinPolicy, tensorCoreSupport, thinProductOnF32 } from "../../src/engine/webgpu_kernels.js";
import { THIN_SIDE, type GemmShape } from "../../src/engine/webgpu_gemm.js";
import { loraLinear } from "../../src/models/lora_linear.js";

// These tests look inside LoRA's unmerged form; the merged one, WebGPU's default, is test/models/lora_merged.test.ts's.
process.env.VERL_LORA_MERGED = "0";

const shape = (m: number, n: number, k: number): GemmShape => ({ batch: 1, m, n, k, transposeA: false, transposeB: true, batchA: 1, batchB: 1 });

test("VERL_GEMM_THIN: tc by default, f32 on request, anything else an error naming the variable", () => {
  assert.equal(parseThinPolicy(undefined), "tc");
  assert.equal(parseThinPolicy(""), "tc");
  assert.equal(parseThinPolicy("tc"), "tc");
  assert.equal(parseThinPolicy("f32"), "f32");
  assert.throws(() => parseThinPolicy("F32"), /VERL_GEMM_THIN=F32: expected tc/);
  assert.throws(() => parseThinPolicy("1"), /VERL_GEMM_THIN=1/);
});

test("the thin policy takes LoRA's adapter products to float32 and leaves the base products and the long-K factor gradients on the tensor cores", () => {
  const N = 6144;
  const cases: [string, GemmShape, boolean][] = [
    ["H = x A^T (rank 64 wide, K 896)", shape(N, 64, 896), true],
    ["l = H Bd^T (K 64)", shape(N, 1152, 64), true],
    ["dH = g Bd (N 64, K 4,864)", shape(N, 64, 4864), false],
    ["dH = g Bd (N 64, K 896)", shape(N, 64, 896), true],
    ["dA over 6,144 tokens", shape(64, 896, N), false],
    ["dB over 6,144 tokens", shape(1152, 64, N), false],
    ["dA over 1,024 tokens", shape(64, 896, 1024), true],
    ["the base product x W^T", shape(N, 1152, 896), false],
    ["a full weight gradient", shape(1152, 896, N), false],
  ];
  for (const [what, s, onF32] of cases) {
    assert.equal(thinProductOnF32(s, "f32"), onF32, `${what} under f32`);
    assert.equal(thinProductOnF32(s, "tc"), false, `${what} under tc`);
  }
  assert.equal(thinProductOnF32(shape(THIN_SIDE, 4096, THIN_F32_MAX_K - 1), "f32"), true);
  assert.equal(thinProductOnF32(shape(THIN_SIDE + 1, 4096, THIN_F32_MAX_K - 1), "f32"), false);
  assert.equal(thinProductOnF32(shape(4096, 4096, THIN_SIDE), "f32"), true);
});

function withThin<T>(p: "tc" | "f32", fn: () => T): T {
  const prev = setThinPolicy(p);
  try { return fn(); } finally { setThinPolicy(prev); }
}

test("thin products on float32 under 16-bit products: tfjs's own bits, one dispatch; a LoRA layer's value and gradients within f16 rounding of the tensor cores', in fewer dispatches, the same bits twice", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  const x = tf.randomNormal([640, 256], 0, 1, "float32", 1) as tf.Tensor2D;
  const a = tf.randomNormal([64, 256], 0, 0.1, "float32", 2) as tf.Tensor2D;
  const ref = tf.matMul(x, a, false, true); // the override is not installed yet: tfjs's float32 product
  const ws = [384, 128, 128].map((n, i) => tf.randomNormal([n, 256], 0, 0.05, "float32", 10 + i) as tf.Tensor2D);
  const as = ws.map((_, i) => tf.randomNormal([32, 256], 0, 0.05, "float32", 20 + i) as tf.Tensor2D);
  const bs = ws.map((w, i) => tf.randomNormal([w.shape[0], 32], 0, 0.05, "float32", 30 + i) as tf.Tensor2D);
  const dy = tf.randomNormal([640, 640], 0, 1, "float32", 40);
  const pass = () => {
    const f = (xx: tf.Tensor, ...ab: tf.Tensor[]) => tf.sum(tf.mul(loraLinear(xx as tf.Tensor2D, ws.map((w, i) => ({ w, a: ab[i] as tf.Tensor2D, b: ab[3 + i] as tf.Tensor2D })), 2), dy));
    return tf.grads(f)([x, ...as, ...bs]);
  };
  setMatmulPrecision("f16");
  t.after(() => setMatmulPrecision("f32"));
  const thin = withThin("f32", () => dispatches(() => tf.matMul(x, a, false, true)));
  assert.equal(thin.n, 1, "one dispatch");
  assert.deepEqual(await thin.out.data(), await ref.data(), "tfjs's float32 product, bit for bit");
  const tc = withThin("tc", () => dispatches(pass)), f32 = withThin("f32", () => dispatches(pass)), again = withThin("f32", pass);
  t.diagnostic(`a LoRA layer's forward and backward: ${tc.n} dispatches on the tensor cores, ${f32.n} with thin products on float32`);
  assert.ok(f32.n < tc.n, `${f32.n} dispatches against ${tc.n}`);
  for (let i = 0; i < tc.out.length; i++) {
    const e = await relErr(f32.out[i]!, tc.out[i]!);
    assert.ok(e < 2e-3, `gradient ${i}: ${e} relative to the tensor cores'`);
    assert.deepEqual(await f32.out[i]!.data(), await again[i]!.data(), `gradient ${i}: the same bits twice`);
  }
  tf.dispose([x, a, ref, ...ws, ...as, ...bs, dy, thin.out, ...tc.out, ...f32.out, ...again]);
});
