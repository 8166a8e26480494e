// A tensor-core product padded in rows only (token counts are rarely multiples of the tile, model
// widths are) is handed on as a view of its buffer's first m rows instead of a copy (rowPrefix in
// webgpu_kernels.ts). Where an adapter has the tensor cores: the view holds the product (against the
// host's float64 product), reads back exactly m x n values (the buffer holds mP x n), feeds later ops
// and reshapes like any tensor, the same bits as the sliced copy, one dispatch fewer, and no tensor
// is left behind.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, hostRows, relToHost, webgpuOrReason } from "./webgpu_adapter.js";
import { packedWeightCache, setMatmulPrecision, tensorCoreSupport, withRowPrefix } from "../../src/engine/webgpu_kernels.js";

test("a row-padded product is a prefix view: right values, exact read-back size, usable downstream, one dispatch fewer than slicing", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  // every product packs its own operands here: with shared activation copies on, the sliced product
  // found the view's copies and took two dispatches fewer, not one more (first seen on lavapipe;
  // shared copies are test/engine/webgpu_operand_cache.test.ts's)
  const cache = packedWeightCache(tf.backend() as unknown as Parameters<typeof packedWeightCache>[0]), bound = cache?.activationBytes ?? 0;
  if (cache) cache.activationBytes = 0;
  t.after(() => { if (cache) cache.activationBytes = bound; });
  // x W^T with 200 rows (padded to 256) and 256 output columns (no column padding); and x W (NN)
  const cases: { what: string; a: [number, number]; b: [number, number]; tb: boolean }[] = [
    { what: "x W^T, 200 x 256, K 96", a: [200, 96], b: [256, 96], tb: true },
    { what: "x W, 1000 x 896, K 640", a: [1000, 640], b: [640, 896], tb: false },
  ];
  const live = tf.memory().numTensors;
  for (const c of cases) {
    const a = tf.randomNormal(c.a, 0, 1, "float32", 3) as tf.Tensor2D, b = tf.randomNormal(c.b, 0, 1, "float32", 4) as tf.Tensor2D;
    const m = c.a[0], n = c.tb ? c.b[0] : c.b[1];
    const host = await hostRows(a, b, false, c.tb, 7);
    setMatmulPrecision("f16");
    try {
      const view = dispatches(() => tf.matMul(a, b, false, c.tb));
      const values = await view.out.data();
      assert.equal(values.length, m * n, `${c.what}: read back ${values.length} values, the tensor has ${m * n}`);
      assert.equal(view.out.dataSync().length, m * n, `${c.what}: dataSync size`);
      const err = await relToHost(view.out, host);
      t.diagnostic(`${c.what}: against the host ${err.toExponential(2)}, ${view.n} dispatches`);
      assert.ok(err < 2e-3, `${c.what}: against the host ${err}`);
      // downstream: an element-wise op, a reshape and a reduction see m x n values
      const [plusOne, rowSums] = tf.tidy(() => [tf.add(view.out, 1), tf.sum(view.out.reshape([m * n / 8, 8]), 1)]);
      assert.equal((await plusOne!.data()).length, m * n);
      assert.equal(rowSums!.shape[0], m * n / 8);
      const expectSum = tf.tidy(() => tf.sum(view.out));
      const gotSum = tf.tidy(() => tf.sum(rowSums!));
      const [es, gs] = [(await expectSum.data())[0]!, (await gotSum.data())[0]!];
      assert.ok(Math.abs(es - gs) <= 1e-3 * Math.max(1, Math.abs(es)), `${c.what}: the reshaped sum ${gs} against ${es}`);
      // the sliced copy (the way before): the same bits, one dispatch more
      const sliced = withRowPrefix(false, () => dispatches(() => tf.matMul(a, b, false, c.tb)));
      assert.deepEqual(await sliced.out.data(), values, `${c.what}: the view and the sliced copy differ`);
      assert.equal(view.n, sliced.n - 1, `${c.what}: ${view.n} dispatches as a view, ${sliced.n} sliced`);
      tf.dispose([view.out, sliced.out, plusOne!, rowSums!, expectSum, gotSum]);
    } finally {
      setMatmulPrecision("f32");
      tf.dispose([a, b]);
    }
  }
  assert.equal(tf.memory().numTensors, live, "tensors left behind");
});
