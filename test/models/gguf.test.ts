import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { floatToHalf, permuteHalvesToInterleaved, writeGguf, ggufTensorPlan } from "../../src/models/gguf.js";
import { ggufVocab } from "../../src/models/gguf_vocab.js";
import { permuteInterleavedToHalves } from "../../src/models/llama2c.js";
import { halfToFloat } from "../../src/models/safetensors.js";
import { makeConfig } from "../../src/models/config.js";
import { CharTokenizer, HfTokenizer } from "../../src/models/tokenizers/index.js";

/** A GPT-2 style byte-level BPE tokenizer.json: 256 byte tokens, one merge, one special token. */
function byteLevelTokenizer(): HfTokenizer {
  const bytes = Array.from({ length: 256 }, (_, b) => String.fromCharCode(b < 33 ? 256 + b : b > 126 && b < 161 ? 256 + 34 + (b - 127) : b));
  const vocabMap: Record<string, number> = {};
  bytes.forEach((t, i) => { vocabMap[t] = i; });
  vocabMap["ab"] = 256;
  return new HfTokenizer({
    tokenizerJson: {
      normalizer: null, post_processor: null,
      model: { type: "BPE", vocab: vocabMap, merges: ["a b"] },
      pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
      decoder: { type: "ByteLevel" },
      added_tokens: [{ id: 257, content: "<|end|>", special: true }],
    },
    tokenizerConfig: { eos_token: "<|end|>" },
  });
}

test("gguf: float -> half rounds to nearest even, keeps subnormals, infinities and NaN", () => {
  // exactly representable values come back unchanged
  for (const x of [0, 1, -2, 1.5, 65504, 2 ** -24, 2 ** -14, 3 * 2 ** -20]) assert.equal(halfToFloat(floatToHalf(x)), x);
  assert.equal(halfToFloat(floatToHalf(0.1)), 0.0999755859375);
  assert.equal(floatToHalf(1 + 2 ** -11), 0x3c00, "a tie rounds to even (down)");
  assert.equal(floatToHalf(1 + 3 * 2 ** -11), 0x3c02, "a tie rounds to even (up)");
  assert.equal(halfToFloat(floatToHalf(70000)), Infinity);
  assert.ok(Number.isNaN(halfToFloat(floatToHalf(NaN))));
});

test("gguf: the q/k reordering is the inverse of llama.c's (interleaved pairs <-> halves)", () => {
  const w = Float32Array.from({ length: 2 * 8 * 3 }, (_, i) => i);
  assert.deepEqual(Array.from(permuteHalvesToInterleaved(permuteInterleavedToHalves(w, 2, 8, 3), 2, 8, 3)), Array.from(w));
  // one head of 4, one column: halves [a0 a1 | b0 b1] -> pairs [a0 b0 a1 b1]
  assert.deepEqual(Array.from(permuteHalvesToInterleaved(Float32Array.from([10, 11, 20, 21]), 1, 4, 1)), [10, 20, 11, 21]);
});

test("gguf: header, metadata and tensor table as llama.cpp reads them; a wrong-sized parameter is named", async () => {
  // llama.cpp aborts on a table without byte tokens: the character tokenizer is refused by name
  assert.throws(() => ggufVocab(new CharTokenizer("abcde"), 8), /no GGUF tokenizer table for CharTokenizer/);
  const vocab = ggufVocab(byteLevelTokenizer(), 260);
  const c = makeConfig({ vocabSize: 260, dim: 4, hiddenDim: 6, nLayers: 1, nHeads: 2, nKvHeads: 1, tieWordEmbeddings: true });
  const plan = ggufTensorPlan(c);
  assert.ok(!plan.some((t) => t.name === "output.weight"), "tied: no output tensor");
  const sizes = new Map(plan.map((t) => [t.source, t.shape.reduce((a, b) => a * b, 1)]));
  const path = join(mkdtempSync(join(tmpdir(), "gguf-")), "m.gguf");
  const { bytes } = await writeGguf(path, c, vocab, (n) => new Float32Array(sizes.get(n)!).fill(0.5), { weightType: "f16" });
  const buf = readFileSync(path);
  assert.equal(buf.length, bytes);
  assert.equal(buf.toString("latin1", 0, 4), "GGUF");
  assert.equal(buf.readUInt32LE(4), 3);
  assert.equal(Number(buf.readBigUInt64LE(8)), plan.length);
  const text = buf.toString("latin1");
  for (const k of ["general.architecture", "llama.attention.head_count_kv", "llama.rope.freq_base", "tokenizer.ggml.tokens", "blk.0.attn_q.weight", "output_norm.weight"]) assert.ok(text.includes(k), k);
  await assert.rejects(writeGguf(path, c, vocab, () => new Float32Array(3)), /parameter 'model.embed_tokens.weight' holds 3 values, expected \[260,4\]/);
  await assert.rejects(writeGguf(path, c, { ...vocab, tokens: vocab.tokens.slice(1) }, () => new Float32Array(1)), /259 tokens but the model's vocabulary is 260/);
});

test("gguf vocab: a byte-level BPE tokenizer.json becomes a gpt2 table with merges, padded to the model's vocabulary", () => {
  const tok = byteLevelTokenizer();
  const v = ggufVocab(tok, 260);
  assert.equal(v.model, "gpt2");
  assert.deepEqual(v.merges, ["a b"]);
  assert.equal(v.tokens[256], "ab");
  assert.equal(v.tokenTypes[257], 3);
  assert.equal(v.tokens[259], "[PAD259]");
  assert.equal(v.eosId, 257);
});
