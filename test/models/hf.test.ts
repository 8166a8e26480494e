import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { loadHfModel, loadHfValueModel, saveHfModel } from "../../src/models/hf.js";
import { loadModel } from "../../src/models/load.js";
import { parseSafetensors, serializeSafetensors, halfToFloat, readSafetensors, type NamedArray } from "../../src/models/safetensors.js";
import { ValueHeadModel } from "../../src/models/value_head.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { loadTokenizer } from "../../src/models/tokenizers/index.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, tok512Bin, STORIES_MISSING } from "./stories.js";

const tmp = (p: string) => mkdtempSync(join(tmpdir(), p));

function logitsOf(m: LlamaModel): number[] {
  return tf.tidy(() => {
    const ids = tf.tensor2d([[0, 1, 5, 9, 3], [2, 2, 7, 1, 4]], [2, 5], "int32");
    const mask = tf.tensor2d([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], [2, 5], "int32");
    return Array.from(m.forward(ids, { attentionMask: mask }).dataSync());
  });
}

/** A safetensors file written byte by byte, as another library would. */
function handMade(entries: { name: string; dtype: string; shape: number[]; bytes: number[] }[]): Uint8Array {
  let off = 0;
  const header: Record<string, unknown> = {};
  for (const e of entries) { header[e.name] = { dtype: e.dtype, shape: e.shape, data_offsets: [off, off + e.bytes.length] }; off += e.bytes.length; }
  const json = new TextEncoder().encode(JSON.stringify(header) + "  ");
  const out = new Uint8Array(8 + json.length + off);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let at = 8 + json.length;
  for (const e of entries) { out.set(e.bytes, at); at += e.bytes.length; }
  return out;
}

test("safetensors: F16 and BF16 decode to float32; F32 round-trips; bad files are named", () => {
  // 1.5, -2, 65504 (max half), 2^-24 (smallest subnormal) in F16; 1.5, -2 in BF16
  const f16 = [0x3e00, 0xc000, 0x7bff, 0x0001].flatMap((h) => [h & 0xff, h >> 8]);
  const bf16 = [0x3fc0, 0xc000].flatMap((h) => [h & 0xff, h >> 8]);
  const { tensors } = parseSafetensors(handMade([{ name: "a", dtype: "F16", shape: [2, 2], bytes: f16 }, { name: "b", dtype: "BF16", shape: [2], bytes: bf16 }]), "x.safetensors");
  assert.deepEqual(Array.from(tensors.get("a")!.data), [1.5, -2, 65504, 2 ** -24]);
  assert.deepEqual(tensors.get("a")!.shape, [2, 2]);
  assert.deepEqual(Array.from(tensors.get("b")!.data), [1.5, -2]);
  assert.ok(Number.isNaN(halfToFloat(0x7e00)) && halfToFloat(0xfc00) === -Infinity);

  const src = new Map<string, NamedArray>([["w", { data: Float32Array.from([1, -0.5, 3e-8, 7]), shape: [2, 2] }], ["b", { data: Float32Array.from([9]), shape: [1] }]]);
  const bytes = serializeSafetensors(src);
  const hlen = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  assert.equal((8 + hlen) % 8, 0, "data starts 8-byte aligned");
  const back = parseSafetensors(bytes, "rt");
  assert.deepEqual(back.metadata, { format: "pt" });
  assert.deepEqual(Array.from(back.tensors.get("w")!.data), Array.from(src.get("w")!.data));

  assert.throws(() => parseSafetensors(handMade([{ name: "i", dtype: "I64", shape: [1], bytes: [0, 0, 0, 0, 0, 0, 0, 0] }]), "m.safetensors"), /m.safetensors: tensor 'i' has dtype I64/);
  assert.throws(() => parseSafetensors(handMade([{ name: "w", dtype: "F32", shape: [3], bytes: [0, 0, 0, 0] }]), "m.safetensors"), /'w' offsets \[0, 4\] do not fit shape \[3\]/);
});

test("stories260K saved as a Hugging Face folder reloads with identical logits", async (t) => {
  const bin = storiesBin(), tokPath = tok512Bin();
  if (!bin || !tokPath) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin), dir = join(tmp("hf-"), "stories");
  const tok = await loadTokenizer(tokPath);
  try {
    await saveHfModel(m, dir, tok);
    const cfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    assert.deepEqual(cfg["architectures"], ["LlamaForCausalLM"]);
    assert.equal(cfg["model_type"], "llama");
    assert.equal(cfg["torch_dtype"], "float32");
    assert.equal(cfg["tie_word_embeddings"], true);
    assert.equal(cfg["num_key_value_heads"], 4);
    assert.equal(cfg["eos_token_id"], 2);
    const st = readSafetensors(join(dir, "model.safetensors")).tensors;
    assert.ok(!st.has("lm_head.weight"), "a tied lm_head is not stored");
    assert.equal(st.size, m.params.size);
    assert.ok(existsSync(join(dir, "tokenizer.json")) && existsSync(join(dir, "tokenizer_config.json")), "tokenizer files beside the weights");
    assert.deepEqual((await loadTokenizer(dir)).encode("Once upon a time", { addSpecialTokens: true }), tok.encode("Once upon a time", { addSpecialTokens: true }));
    const back = await loadModel(dir);
    try {
      assert.deepEqual(logitsOf(back), logitsOf(m));
    } finally {
      back.dispose();
    }
  } finally {
    m.dispose();
  }
});

test("an untied Qwen2-style model round-trips, also from sharded safetensors; value models round-trip", async () => {
  await initBackend("wasm");
  const cfg = makeConfig({ vocabSize: 24, dim: 16, hiddenDim: 20, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false });
  const m = initModel(cfg, new Rng(1)), dir = join(tmp("hf-"), "qwen");
  try {
    await saveHfModel(m, dir);
    const cj = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    assert.deepEqual(cj["architectures"], ["Qwen2ForCausalLM"]);
    const back = await loadHfModel(dir);
    assert.deepEqual(logitsOf(back), logitsOf(m));
    back.dispose();

    // reshard into two files with an index, as large checkpoints come
    const all = readSafetensors(join(dir, "model.safetensors")).tensors;
    const names = [...all.keys()], half = Math.ceil(names.length / 2), shards = [names.slice(0, half), names.slice(half)];
    const sharded = join(tmp("hf-"), "sharded");
    await import("node:fs").then((fs) => fs.mkdirSync(sharded, { recursive: true }));
    const weightMap: Record<string, string> = {};
    shards.forEach((list, i) => {
      const file = `model-0000${i + 1}-of-00002.safetensors`;
      writeFileSync(join(sharded, file), serializeSafetensors(new Map(list.map((n) => [n, all.get(n)!]))));
      for (const n of list) weightMap[n] = file;
    });
    writeFileSync(join(sharded, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    writeFileSync(join(sharded, "config.json"), JSON.stringify(cj));
    const fromShards = await loadModel(sharded);
    assert.deepEqual(logitsOf(fromShards), logitsOf(m));
    fromShards.dispose();

    // a critic: saved with its score head, reloaded with identical values; from a causal LM it gets a fresh head
    const critic = ValueHeadModel.fromPolicy(m, new Rng(2)), vdir = join(tmp("hf-"), "critic");
    await saveHfModel(critic, vdir);
    assert.deepEqual((JSON.parse(readFileSync(join(vdir, "config.json"), "utf8")) as Record<string, unknown>)["architectures"], ["Qwen2ForTokenClassification"]);
    const v2 = await loadHfValueModel(vdir, new Rng(3));
    const ids = tf.tensor2d([[1, 2, 3]], [1, 3], "int32");
    assert.deepEqual(Array.from(v2.forward(ids).dataSync()), Array.from(critic.forward(ids).dataSync()));
    const fresh = await loadHfValueModel(dir, new Rng(2));
    assert.deepEqual(Array.from(fresh.forward(ids).dataSync()), Array.from(critic.forward(ids).dataSync()));
    tf.dispose(ids); v2.dispose(); fresh.dispose(); critic.dispose();
  } finally {
    m.dispose();
  }
  await assert.rejects(loadModel(join(tmpdir(), "no-such-model-dir")), /does not exist/);
  const empty = tmp("hf-empty-");
  await assert.rejects(loadModel(empty), /expected a llama2.c checkpoint file or a Hugging Face folder/);
  writeFileSync(join(empty, "config.json"), JSON.stringify({ architectures: ["LlamaForCausalLM"], hidden_size: 8, intermediate_size: 8, num_hidden_layers: 1, num_attention_heads: 2, vocab_size: 4 }));
  await assert.rejects(loadModel(empty), /no model\.safetensors, model\.safetensors\.index\.json, pytorch_model\.bin or pytorch_model\.bin\.index\.json/);
});

test("a re-export keeps config.json's pad_token_id (and writes it to generation_config.json)", async () => {
  await initBackend("wasm");
  const m = initModel(makeConfig({ vocabSize: 24, dim: 16, hiddenDim: 20, nLayers: 1, nHeads: 2, attentionBias: true }), new Rng(2));
  const src = join(tmp("hf-pad-"), "src"), out = join(tmp("hf-pad-"), "out");
  try {
    await saveHfModel(m, src);
    const cj = JSON.parse(readFileSync(join(src, "config.json"), "utf8")) as Record<string, unknown>;
    writeFileSync(join(src, "config.json"), JSON.stringify({ ...cj, pad_token_id: 7, eos_token_id: 3 }));
    const loaded = await loadHfModel(src);
    assert.equal(loaded.config.padTokenId, 7);
    await saveHfModel(loaded, out);
    loaded.dispose();
    const back = JSON.parse(readFileSync(join(out, "config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(back.pad_token_id, 7);
    assert.equal(back.eos_token_id, 3);
    const gen = JSON.parse(readFileSync(join(out, "generation_config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(gen.pad_token_id, 7);
    assert.equal(gen.eos_token_id, 3);
  } finally {
    m.dispose();
  }
});
