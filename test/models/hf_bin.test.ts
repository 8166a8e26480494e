// Hugging Face folders whose weights are pytorch_model.bin (torch.save pickles), single and
// sharded: the same tensors, logits and greedy tokens as the safetensors folder they were made from
// (test/models/fixtures/torch/, written by torch through scripts/make_torch_fixtures.py).
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel, readHfWeights } from "../../src/models/hf.js";
import { loadModel } from "../../src/models/load.js";
import { readSafetensors } from "../../src/models/safetensors.js";
import { modelFiles, MODEL_FILES } from "../../src/utils/hf_hub.js";
import { fixtureDir, maxDiff, reference } from "./families_fixtures.js";

const TORCH = "test/models/fixtures/torch";

for (const folder of ["qwen3_bin", "qwen3_bin_sharded"]) {
  test(`${folder}: pytorch_model.bin weights are exactly the safetensors fixture's, and the model gives transformers' logits and greedy tokens`, async () => {
    const want = readSafetensors(join(fixtureDir("qwen3"), "model.safetensors")).tensors;
    const got = readHfWeights(join(TORCH, folder));
    assert.deepEqual([...got.keys()].sort(), [...want.keys()].sort());
    for (const [name, w] of want) {
      assert.deepEqual(got.get(name)!.shape, w.shape, name);
      assert.deepEqual(got.get(name)!.data, w.data, `${name}: every value equal`);
    }
    await initBackend("wasm");
    const ref = reference("qwen3"), model = await loadHfModel(join(TORCH, folder));
    try {
      for (let i = 0; i < ref.prompts.length; i++) {
        const ids = [...ref.prompts[i]!, ...ref.greedy[i]!], P = ref.prompts[i]!.length, V = model.config.vocabSize;
        const logits = tf.tidy(() => model.forward(tf.tensor2d(ids, [1, ids.length], "int32")).dataSync() as Float32Array);
        assert.ok(maxDiff(logits, ref.tensors.get(`logits_${i}`)!.data) < 1e-4, `prompt ${i}: logits`);
        // the greedy continuation: the argmax at each position from the prompt's last on
        for (let j = 0; j < ref.greedy[i]!.length; j++) {
          const row = logits.subarray((P - 1 + j) * V, (P + j) * V);
          assert.equal(row.indexOf(Math.max(...row)), ref.greedy[i]![j], `prompt ${i} step ${j}: greedy token`);
        }
      }
    } finally {
      model.dispose();
    }
  });
}

test("HF folders: safetensors is preferred over pytorch_model.bin; bad .bin files and indexes are named", () => {
  const dir = mkdtempSync(join(tmpdir(), "hfbin-"));
  for (const f of ["config.json", "model.safetensors"]) copyFileSync(join(fixtureDir("qwen3"), f), join(dir, f));
  writeFileSync(join(dir, "pytorch_model.bin"), "not a torch file");
  assert.ok(readHfWeights(dir).has("model.embed_tokens.weight"), "the .bin is not read when model.safetensors exists");

  const only = mkdtempSync(join(tmpdir(), "hfbin-"));
  writeFileSync(join(only, "pytorch_model.bin"), "not a torch file");
  assert.throws(() => readHfWeights(only), (e: Error) => e.message.startsWith(join(only, "pytorch_model.bin")) && /not a torch\.save file/.test(e.message));

  const sharded = mkdtempSync(join(tmpdir(), "hfbin-"));
  writeFileSync(join(sharded, "pytorch_model.bin.index.json"), JSON.stringify({ weight_map: { "a.weight": "pytorch_model-00001-of-00002.bin" } }));
  assert.throws(() => readHfWeights(sharded), /pytorch_model\.bin\.index\.json: shard "pytorch_model-00001-of-00002\.bin" does not exist/);

  const none = mkdtempSync(join(tmpdir(), "hfbin-"));
  assert.throws(() => readHfWeights(none), /no model\.safetensors, model\.safetensors\.index\.json, pytorch_model\.bin or pytorch_model\.bin\.index\.json/);
});

test("loadModel: a pytorch_model.bin path is pointed to its folder (not read as a llama2.c file); the folder loads", async () => {
  await assert.rejects(loadModel(join(TORCH, "qwen3_bin", "pytorch_model.bin")), /qwen3_bin\/pytorch_model\.bin: pass the folder holding config\.json, not the weights file/);
  await initBackend("wasm");
  const model = await loadModel(join(TORCH, "qwen3_bin"));
  try {
    assert.equal(model.config.nLayers, 3);
  } finally {
    model.dispose();
  }
});

test("Hub downloads: pytorch_model*.bin only for a repository without safetensors weights", () => {
  assert.deepEqual(modelFiles(["config.json", "model.safetensors", "pytorch_model.bin"]), MODEL_FILES);
  assert.deepEqual(modelFiles(["config.json", "model-00001-of-00002.safetensors", "pytorch_model-00001-of-00002.bin"]), MODEL_FILES);
  assert.deepEqual(modelFiles(["config.json", "pytorch_model.bin"]), [...MODEL_FILES, "pytorch_model*.bin"]);
});
