// tfjs's WebGPU BatchMatMul takes an atomic split-K program for products with few output tiles and
// a long K; with a transposed right operand it returned x [200, 4864] W^T (W [32, 4864]) with a
// relative error of 1.2 on an H100 and 1.4 on llvmpipe, and its float atomics make the bits vary. initBackend registers a guard that sends those
// products to tfjs's tiled small-output program (src/engine/webgpu_kernels.ts, guardFloat32MatMul).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, hostRows, relToHost, webgpuOrReason } from "./webgpu_adapter.js";
import { tfjsTakesAtomicSplitK } from "../../src/engine/webgpu_kernels.js";

test("the rule of tfjs's atomic split-K choice: few output tiles, more than 128 outputs, one batch, K >= 2000", () => {
  assert.equal(tfjsTakesAtomicSplitK([200, 4864], [32, 4864], false, true, 8), true); // LoRA's x A^T on a short micro-batch
  assert.equal(tfjsTakesAtomicSplitK([4864, 200], [4864, 32], true, false, 8), true);
  assert.equal(tfjsTakesAtomicSplitK([200, 1999], [32, 1999], false, true, 8), false); // K too short
  assert.equal(tfjsTakesAtomicSplitK([2048, 4864], [32, 4864], false, true, 8), false); // many tiles
  assert.equal(tfjsTakesAtomicSplitK([4, 4864], [32, 4864], false, true, 8), false); // 128 outputs: the reduce program
  assert.equal(tfjsTakesAtomicSplitK([2, 200, 4864], [32, 4864], false, true, 8), false); // batched
  assert.equal(tfjsTakesAtomicSplitK([8, 4864], [4864, 400], false, false, 8), true); // 8 rows: twice the tiles allowed
});

test("float32 products tfjs would split with atomics: equal to the host's, one dispatch, the same bits twice", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const a = tf.randomNormal([200, 4864], 0, 1, "float32", 3) as tf.Tensor2D, b = tf.randomNormal([32, 4864], 0, 1, "float32", 4) as tf.Tensor2D;
  const host = await hostRows(a, b, false, true, 7);
  const one = dispatches(() => tf.matMul(a, b, false, true)), two = tf.matMul(a, b, false, true);
  const rel = await relToHost(one.out, host);
  assert.ok(rel < 1e-5, `relative error ${rel} against the host`);
  assert.equal(one.n, 1, `${one.n} programs (the atomic path fills the output first: 2)`);
  assert.deepEqual(await one.out.data(), await two.data());
  tf.dispose([a, b, one.out, two]);
});
