// Packed operand copies shared between products (PackedWeightCache in src/engine/webgpu_kernels.ts):
// the bookkeeping on tfjs's cpu backend (a stand-in pack program), and, where an adapter has the
// tensor cores, a model's forward and backward pass with activation copies shared against packed
// per product: the same bits, fewer packing dispatches.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, webgpuOrReason } from "./webgpu_adapter.js";
import { PackedWeightCache, activationPackBytes, packedWeightCache, setMatmulPrecision, tensorCoreSupport, type OperandLayout } from "../../src/engine/webgpu_kernels.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import { LoraAdapter } from "../../src/models/lora.js";
import { Rng } from "../../src/utils/rng.js";

// Its LoRA counts are the unmerged form's; the merged one, WebGPU's default, is test/models/lora_merged.test.ts's.
process.env.VERL_LORA_MERGED = "0";

const L = (rowsP: number, colsP: number, batch = 1, base = "f16:1:100x256"): OperandLayout => ({ base, batch, rowsP, colsP });

test("activation copies: kept per layout, a wider-rowed copy serves a narrower layout, least recently used out past the bound, freed with their data", async () => {
  await tf.setBackend("cpu");
  const be = tf.backend() as unknown as { write(v: Float32Array, s: number[], d: string): object; numDataIds(): number; disposeData(id: object, force?: boolean): boolean };
  const bytes = (l: OperandLayout) => l.batch * l.rowsP * l.colsP * 2;
  const cache = new PackedWeightCache(be as unknown as ConstructorParameters<typeof PackedWeightCache>[0], bytes(L(128, 256)) * 2);
  const pack = () => ({ dataId: be.write(new Float32Array(8), [8], "float32"), shape: [8], dtype: "float32" });
  const x = tf.ones([100, 256]), y = tf.ones([100, 256]), z = tf.ones([100, 256]);
  const first = cache.get(x, L(128, 256), pack);
  assert.equal(first.owned, false, "kept: the caller must not free it");
  assert.equal(cache.get(x, L(128, 256), pack).info, first.info, "the same layout: the same copy");
  assert.equal(cache.get(x, L(112, 256), pack).info, first.info, "K padded to 16 (112 rows) read from rows padded to 128");
  assert.equal(cache.packs, 1);
  assert.notEqual(cache.get(x, L(128, 384), pack).info, first.info, "columns padded otherwise: packed again");
  assert.equal(cache.packs, 2);
  const narrow = cache.get(y, L(112, 256), pack);
  assert.notEqual(cache.get(y, L(128, 256), pack).info, narrow.info, "a narrower copy does not serve a wider layout");
  assert.notEqual(cache.get(z, L(128, 256, 2, "f16:2:100x256"), pack).info, cache.get(z, L(112, 256, 2, "f16:2:100x256"), pack).info, "batched operands match exactly (their batch stride is rows x cols)");
  assert.equal(cache.packs, 6);
  const before = be.numDataIds();
  cache.trim();
  assert.ok(cache.activationBytesHeld <= cache.activationBytes, `trimmed to the bound (${cache.activationBytesHeld})`);
  assert.ok(be.numDataIds() < before, "the trimmed copies were freed");
  assert.equal(cache.get(z, L(112, 256, 2, "f16:2:100x256"), pack).owned, false, "the most recently used copy stayed");
  const held = cache.activationBytesHeld, ids = be.numDataIds();
  z.dispose();
  assert.ok(cache.activationBytesHeld < held && be.numDataIds() < ids - 1, "a disposed activation's copies go with it");
  cache.activationBytes = 0;
  assert.equal(cache.get(x, L(128, 256), pack).owned, true, "bound 0: activations are packed for the caller");
  tf.dispose([x, y]);
  assert.equal(cache.activationBytesHeld, 0);
  assert.equal(activationPackBytes("16"), 16 * 2 ** 20);
  assert.equal(activationPackBytes(""), 4096 * 2 ** 20);
  assert.throws(() => activationPackBytes("-1"), /VERL_GEMM_ACTIVATION_PACK_MB/);
});

test("a model's forward and backward with activation copies shared: the same loss and gradients to the bit, fewer packing dispatches (full and LoRA)", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  // widths multiples of 128 (the products' N padding), 3 x 75 tokens (not a multiple of 128: the wider-row reuse)
  const config = makeConfig({ vocabSize: 256, dim: 256, hiddenDim: 512, nLayers: 2, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: true, maxSeqLen: 128 });
  const ids = tf.tensor2d(Int32Array.from({ length: 3 * 75 }, (_, i) => (i * 37) % 256), [3, 75], "int32");
  for (const lora of [false, true]) {
    const m = initModel(config, new Rng(1));
    if (lora) m.lora = LoraAdapter.init(config, { rank: 8, alpha: 16, targetModules: "all-linear" }, new Rng(2));
    const be = tf.backend() as unknown as Parameters<typeof packedWeightCache>[0];
    const cache = packedWeightCache(be)!, bound = cache.activationBytes;
    const pass = (share: boolean) => {
      cache.activationBytes = share ? bound : 0;
      const counted = dispatches(() => tf.variableGrads(() => tf.tidy(() => tf.mean(tf.square(m.forward(ids))) as tf.Scalar), [...m.trainableParams().values()]));
      return { n: counted.n, loss: counted.out.value, grads: counted.out.grads };
    };
    setMatmulPrecision("f16");
    try {
      pass(false); // packs the weights' copies once, so both timed passes see the same weight cache
      const plain = pass(false), shared = pass(true);
      t.diagnostic(`${lora ? "LoRA" : "full"}: ${plain.n} dispatches packing every product's operands, ${shared.n} sharing activation copies`);
      assert.ok(shared.n < plain.n, `${lora ? "LoRA" : "full"}: ${shared.n} against ${plain.n}`);
      assert.deepEqual(await shared.loss.data(), await plain.loss.data(), "the same loss");
      for (const k of Object.keys(plain.grads)) assert.deepEqual(await shared.grads[k]!.data(), await plain.grads[k]!.data(), `${k}: the same gradient`);
      tf.dispose([plain.loss, shared.loss, ...Object.values(plain.grads), ...Object.values(shared.grads)]);
    } finally {
      cache.activationBytes = bound;
      setMatmulPrecision("f32");
      m.dispose();
    }
  }
  ids.dispose();
});
