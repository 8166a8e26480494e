// A NaN or an infinity in the weights a run starts from is a clear error naming the
// tensor and the file, not a run whose every loss is NaN.
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initBackend } from "../../src/engine/backend.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { loadHfModel, saveHfModel } from "../../src/models/hf.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { readSafetensors, serializeSafetensors } from "../../src/models/safetensors.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, STORIES_MISSING } from "./stories.js";

test("a Hugging Face folder with a NaN weight is refused, naming the tensor and the file", async () => {
  await initBackend("cpu");
  const dir = mkdtempSync(join(tmpdir(), "verl-nan-"));
  try {
    const m = initModel(makeConfig({ vocabSize: 16, dim: 8, hiddenDim: 12, nLayers: 1, nHeads: 2, nKvHeads: 2 }), new Rng(1));
    await saveHfModel(m, dir);
    m.dispose();
    const file = join(dir, "model.safetensors");
    const { tensors, metadata } = readSafetensors(file);
    tensors.get("model.layers.0.self_attn.q_proj.weight")!.data[5] = NaN;
    writeFileSync(file, serializeSafetensors(tensors, metadata));
    await assert.rejects(loadHfModel(dir), (e: Error) => {
      assert.match(e.message, /model\.safetensors: weight 'model\.layers\.0\.self_attn\.q_proj\.weight' holds NaN \(element 5\)/);
      return true;
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a llama2.c checkpoint with an infinite weight is refused, naming the tensor and the file", (t) => {
  const src = storiesBin();
  if (!src) return t.skip(STORIES_MISSING);
  const dir = mkdtempSync(join(tmpdir(), "verl-nan-"));
  try {
    const path = join(dir, "bad.bin");
    copyFileSync(src, path);
    const bytes = readFileSync(path);
    // The first float after stories260K's 28-byte (version 0) header: the token embedding.
    bytes.writeFloatLE(Infinity, 28 + 4 * 3);
    writeFileSync(path, bytes);
    assert.throws(() => loadLlama2c(path), /bad\.bin: weight 'token embedding' holds Infinity \(element 3\)/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
