// Split-K for the trainer's 16-bit products (issue 23, LoRA at full speed): a product with few output
// tiles and a long K, as LoRA's factor gradients over 6,144 tokens, is cut into K parts summed by a
// second pass. The kernel's WGSL is checked exactly by the simulator (webgpu_gemm_sim.test.ts); here,
// where an adapter has the tensor cores, the products through tfjs's matMul override: close to the
// host's float64 product, the same as without the split up to f16 rounding, the same bits twice, and
// at most one dispatch more. tfjs's own float32 product of each shape is held to the host's as well.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, hostRows, relErr, relToHost, webgpuOrReason } from "./webgpu_adapter.js";
import { PackedMatrix, packedWeightCache, setMatmulPrecision, tensorCoreSupport } from "../../src/engine/webgpu_kernels.js";
import { DEFAULT_DIRECT_TILE, SplitKSumProgram, THIN_DIRECT_TILE, directSplits, isThinProduct, setSplitKCap, type DirectTile, type GemmShape } from "../../src/engine/webgpu_gemm.js";

/** LoRA's shapes at the 0.5B widths, over fewer tokens: dA = dH^T x, dB = g^T H, and a full dW of the attention block. */
const SHAPES: { what: string; a: [number, number]; b: [number, number]; ta: boolean; tb: boolean }[] = [
  { what: "dA [96, 896] over 2,048 tokens", a: [2048, 96], b: [2048, 896], ta: true, tb: false },
  { what: "dB [1152, 96] over 2,048 tokens", a: [2048, 1152], b: [2048, 96], ta: true, tb: false },
  { what: "dW [1152, 896] over 3,000 tokens", a: [3000, 1152], b: [3000, 896], ta: true, tb: false },
  { what: "x A^T, K 4,864", a: [200, 4864], b: [32, 4864], ta: false, tb: true },
];

function withSplit<T>(cap: number, fn: () => T): T {
  const before = setSplitKCap(cap);
  try { return fn(); } finally { setSplitKCap(before); }
}

test("split-K products on the tensor cores: close to the host's float64 product, equal to the unsplit product within f16 rounding, deterministic", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  // every product packs its own operands here (the dispatch counts compare split and unsplit); shared
  // activation copies are test/engine/webgpu_operand_cache.test.ts's
  const cache = packedWeightCache(tf.backend() as unknown as Parameters<typeof packedWeightCache>[0]), bound = cache?.activationBytes ?? 0;
  if (cache) cache.activationBytes = 0;
  t.after(() => { if (cache) cache.activationBytes = bound; });
  const failures: string[] = [];
  for (const sh of SHAPES) {
    const a = tf.randomNormal(sh.a, 0, 1, "float32", 1) as tf.Tensor2D, b = tf.randomNormal(sh.b, 0, 1, "float32", 2) as tf.Tensor2D;
    const [m, k] = sh.ta ? [sh.a[1], sh.a[0]] : sh.a, n = sh.tb ? sh.b[0] : sh.b[1];
    const s: GemmShape = { batch: 1, m, n, k, transposeA: sh.ta, transposeB: sh.tb, batchA: 1, batchB: 1 };
    const splits = directSplits(s, { ...(isThinProduct(s) ? THIN_DIRECT_TILE : DEFAULT_DIRECT_TILE), splitK: true }); // the trainer's tile
    assert.ok(splits >= 2, `${sh.what}: split (${splits})`);
    const host = await hostRows(a, b, sh.ta, sh.tb, Math.max(1, Math.floor(m / 64)));
    const ref = tf.matMul(a, b, sh.ta, sh.tb); // tfjs's float32 product
    const refErr = await relToHost(ref, host);
    t.diagnostic(`${sh.what}: tfjs float32 against the host ${refErr.toExponential(2)}`);
    if (!(refErr < 1e-4)) failures.push(`${sh.what}: tfjs's float32 product against the host ${refErr}`);
    setMatmulPrecision("f16");
    try {
      const split1 = dispatches(() => tf.matMul(a, b, sh.ta, sh.tb)), split2 = tf.matMul(a, b, sh.ta, sh.tb);
      const plain = withSplit(1, () => dispatches(() => tf.matMul(a, b, sh.ta, sh.tb)));
      const splitErr = await relToHost(split1.out, host);
      t.diagnostic(`${sh.what}: ${splits} parts, against the host ${splitErr.toExponential(2)}`);
      if (!(splitErr < 2e-3)) failures.push(`${sh.what}: split-K against the host ${splitErr}`);
      const plainErr = await relToHost(plain.out, host), vsPlain = await relErr(split1.out, plain.out);
      t.diagnostic(`${sh.what}: unsplit against the host ${plainErr.toExponential(2)}, split against unsplit ${vsPlain.toExponential(2)}`);
      if (!(vsPlain < 1e-3)) failures.push(`${sh.what}: split against unsplit ${vsPlain}`);
      assert.deepEqual(await split1.out.data(), await split2.data(), `${sh.what}: the same bits twice`);
      // the parts' sum replaces the slice of the padding (or adds a pass where nothing was padded)
      assert.ok(split1.n <= plain.n + 1, `${sh.what}: ${split1.n} dispatches split, ${plain.n} unsplit`);
      tf.dispose([split1.out, split2, plain.out]);
    } finally {
      setMatmulPrecision("f32");
      tf.dispose([a, b, ref]);
    }
  }
  assert.deepEqual(failures, []);
});

test("a packed weight's product with a residual: the residual plus the product, bit for bit, in the pass that sums the parts (the decoder's o_proj and down_proj)", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  // down_proj at the 0.5B shape over 40 rows (padded to 64), and o_proj's K; split and unsplit
  for (const [k, split] of [[4864, true], [896, true], [896, false]] as const) {
    const tile: DirectTile = { sgM: 1, sgN: 1, tm: 2, tn: 4, unroll: 1, splitK: split, splitTargets: { workgroups: 1024, minChunk: 256 } };
    const w = tf.randomNormal([896, k], 0, 0.05, "float32", 3) as tf.Tensor2D, x = tf.randomNormal([40, k], 0, 1, "float32", 4) as tf.Tensor2D;
    const r = tf.randomNormal([40, 896], 0, 1, "float32", 5) as tf.Tensor2D;
    const packed = PackedMatrix.pack(w, true, "f16", tile);
    try {
      const parts = directSplits({ batch: 1, m: 40, n: 896, k, transposeA: false, transposeB: true, batchA: 1, batchB: 1 }, tile);
      assert.equal(parts > 1, split, `k ${k}: ${parts} parts`);
      const plain = packed.matMul(x), fused = dispatches(() => packed.matMul(x, r)), sum = tf.add(r, plain);
      assert.deepEqual(await fused.out.data(), await sum.data(), `k ${k}, ${parts} parts: residual + product`);
      assert.deepEqual(fused.out.shape, [40, 896]);
      const unfused = dispatches(() => tf.add(r, packed.matMul(x)));
      // split, the add rides on the parts' sum; unsplit, the add is the pass that crops the padded rows
      assert.ok(split ? fused.n < unfused.n : fused.n <= unfused.n, `k ${k}: ${fused.n} dispatches with the residual in the sum, ${unfused.n} with an add after`);
      const wrong = tf.zeros([40, 895]);
      assert.throws(() => packed.matMul(x, wrong), /residual of \[40, 896\] float32/);
      wrong.dispose();
      tf.dispose([plain, fused.out, sum, unfused.out]);
    } finally {
      packed.dispose();
      tf.dispose([w, x, r]);
    }
  }
});

test("the split-K sum on any adapter: parts added in order, padding cropped, the residual added in the same pass", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  // 3 parts of a padded [4, 8] plane holding a [3, 5] product; integer values, so every sum is exact
  const [splits, m, n, mP, nP] = [3, 3, 5, 4, 8];
  const parts = Float32Array.from({ length: splits * mP * nP }, (_, i) => (i * 7) % 23 - 11);
  const residual = Float32Array.from({ length: m * n }, (_, i) => 100 * i);
  const be = tf.backend() as unknown as { runWebGPUProgram(p: unknown, inputs: tf.TensorInfo[], dtype: string, u: unknown): tf.TensorInfo };
  const partsT = tf.tensor1d(parts), resT = tf.tensor2d(residual, [m, n]);
  for (const withResidual of [false, true]) {
    const prog = new SplitKSumProgram(1, splits, m, n, mP, nP, withResidual);
    const info = be.runWebGPUProgram(prog, withResidual ? [partsT, resT] : [partsT], "float32", prog.uniformValues());
    const out = tf.engine().makeTensorFromTensorInfo(info);
    const want = Array.from({ length: m * n }, (_, i) => {
      const [r, c] = [Math.floor(i / n), i % n];
      let s = 0;
      for (let p = 0; p < splits; p++) s += parts[p * mP * nP + r * nP + c]!;
      return withResidual ? residual[i]! + s : s;
    });
    assert.deepEqual(out.shape, [1, m, n]);
    assert.deepEqual(Array.from(await out.data()), want, `residual ${withResidual}`);
    out.dispose();
  }
  tf.dispose([partsT, resT]);
});
