import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import * as tf from "@tensorflow/tfjs";
import { initTensors, normalArray } from "../../src/models/init.js";
import { LlamaModel as Model, parameterShapes, toVariables } from "../../src/models/llama.js";
import { makeConfig } from "../../src/models/config.js";
import { saveHfModel, loadHfModel } from "../../src/models/hf.js";
import { loadTokenizer, HfTokenizer } from "../../src/models/tokenizers/index.js";
import type { LlamaModel } from "../../src/models/llama.js";
import type { Tokenizer } from "../../src/models/tokenizer.js";
import { generate, defaultSamplingParams, leftPadPrompts, computeLogProb, type SamplingParams } from "../../src/rollout/index.js";
import { LlamaCppRolloutEngine, type LlamaCppSettings } from "../../src/rollout/llama_cpp/engine.js";
import { loadLlama } from "../../src/rollout/llama_cpp/binding.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, tok512Bin, STORIES_MISSING } from "../models/stories.js";

// one CPU thread: llama.cpp's default thread count spins badly on a small shared VM
const settings = (o: Partial<LlamaCppSettings> = {}): LlamaCppSettings => ({
  weightType: "f32", kvCacheType: "f32", gpu: "cpu", ggufDir: tmpdir(), threads: 1, flashAttention: false, maxNumSeqs: 4, ...o,
});

async function llamaCppMissing(): Promise<string | undefined> {
  try {
    await loadLlama("cpu");
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

const rows = (d: { data: ArrayLike<number>; shape: number[] }) =>
  Array.from({ length: d.shape[0]! }, (_, b) => Array.from(d.data).slice(b * d.shape[1]!, (b + 1) * d.shape[1]!));

/** Greedy responses of the llama_cpp engine and of the host KV-cache decoder, and both sets of log-probs. */
async function greedyBoth(model: LlamaModel, tok: Tokenizer, prompts: number[][], R: number, o: Partial<LlamaCppSettings> = {}) {
  const batch = leftPadPrompts(prompts, tok.padTokenId);
  const params: SamplingParams = defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [tok.eosTokenId], padTokenId: tok.padTokenId, calculateLogProbs: true });
  const host = generate(model, batch, params, new Rng(0));
  const engine = new LlamaCppRolloutEngine(settings(o), "test");
  try {
    const llama = await engine.generate({ model, tokenizer: tok, prompts: batch, params, rng: new Rng(0) });
    return { host, llama };
  } finally {
    await engine.dispose();
  }
}


/** stories260K and its tokenizer on the cpu backend, or undefined after skipping `t` with the reason. */
async function storiesOrSkip(t: { skip(msg: string): void }): Promise<{ model: ReturnType<typeof loadLlama2c>; tok: Awaited<ReturnType<typeof loadTokenizer>> } | undefined> {
  const bin = storiesBin(), tokPath = tok512Bin();
  const missing = !bin || !tokPath ? STORIES_MISSING : await llamaCppMissing();
  if (missing) { t.skip(missing); return undefined; }
  await initBackend("cpu");
  return { model: loadLlama2c(bin!), tok: await loadTokenizer(tokPath!) };
}

test("llama_cpp engine: stories260K GGUF decodes greedily token for token as the host decoder (f32 KV), log-probs agree", async (t) => {
  const stories = await storiesOrSkip(t);
  if (!stories) return;
  const { model, tok } = stories;
  try {
    const prompts = [[1, 403, 407, 261, 378], [1, 403], [1, 378, 261, 407], [1, 1035 % 512, 300, 301, 302, 303]];
    const { host, llama } = await greedyBoth(model, tok, prompts, 24);
    assert.deepEqual(rows(llama.batch.responses!), rows(host.batch.responses!));
    assert.deepEqual(Array.from(llama.batch.response_mask!.data), Array.from(host.batch.response_mask!.data));
    assert.deepEqual(Array.from(llama.batch.input_ids!.data), Array.from(host.batch.input_ids!.data));
    const a = llama.batch.rollout_log_probs!.data, b = host.batch.rollout_log_probs!.data, m = host.batch.response_mask!.data;
    let md = 0;
    for (let i = 0; i < a.length; i++) if (m[i]) md = Math.max(md, Math.abs(a[i]! - b[i]!));
    assert.ok(md < 1e-3, `rollout log-prob difference ${md}`);
  } finally {
    model.dispose();
  }
});

test("llama_cpp engine: a tiny Hugging Face folder (q/k/v biases, untied head, BPE tokenizer.json) matches the host decoder", async (t) => {
  const tokPath = tok512Bin();
  if (!tokPath) return t.skip(STORIES_MISSING);
  const missing = await llamaCppMissing();
  if (missing) return t.skip(missing);
  await initBackend("cpu");
  // the llama.c tokenizer saved as a Hugging Face folder (tokenizer.json, byte-fallback BPE)
  const dir = join(mkdtempSync(join(tmpdir(), "llc-hf-")), "model");
  const cfg = makeConfig({ vocabSize: 520, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false, maxSeqLen: 128 });
  // weights large enough that greedy choices are clear, and non-zero q/k/v biases (they are permuted too)
  const rng = new Rng(3), init = initTensors(parameterShapes(cfg, { lmHead: true }), rng, 0.2);
  for (const [name, t] of init) if (name.endsWith(".bias")) { init.set(name, tf.tensor(normalArray(rng, t.size, 0.5), t.shape)); t.dispose(); }
  const src = new Model(cfg, toVariables(init), { lmHead: true });
  await saveHfModel(src, dir, await loadTokenizer(tokPath));
  // so the folder loads through tokenizer.json
  for (const f of ["tok512.bin", "tokenizer.bin"]) rmSync(join(dir, f), { force: true });

  src.dispose();
  const model = await loadHfModel(dir);
  const tok = await loadTokenizer(dir);
  assert.ok(tok instanceof HfTokenizer, "the folder's tokenizer.json is used");
  try {
    const prompts = [[1, 403, 407, 261, 378], [1, 300, 301], [1, 42, 43, 44, 45, 46, 47]];
    const { host, llama } = await greedyBoth(model, tok, prompts, 16);
    assert.deepEqual(rows(llama.batch.responses!), rows(host.batch.responses!));
  } finally {
    model.dispose();
  }
});

test("llama_cpp engine: sampling is seeded, n samples per prompt differ, and rollout log-probs match the trainer's at the rollout temperature", async (t) => {
  const stories = await storiesOrSkip(t);
  if (!stories) return;
  const { model, tok } = stories;
  const engine = new LlamaCppRolloutEngine(settings(), "test-sample");
  try {
    const batch = leftPadPrompts([[1, 403, 407, 261, 378], [1, 378]], tok.padTokenId);
    const params = defaultSamplingParams({ temperature: 0.8, responseLength: 12, eosTokenIds: [2], padTokenId: tok.padTokenId, calculateLogProbs: true, n: 3 });
    const req = (seed: number) => ({ model, tokenizer: tok, prompts: batch, params, rng: new Rng(seed) });
    const a = await engine.generate(req(5)), b = await engine.generate(req(5)), c = await engine.generate(req(6));
    assert.equal(a.length, 6);
    assert.deepEqual(Array.from(a.batch.responses!.data), Array.from(b.batch.responses!.data), "same seed, same samples");
    assert.notDeepEqual(Array.from(a.batch.responses!.data), Array.from(c.batch.responses!.data), "another seed, other samples");
    const r = rows(a.batch.responses!);
    assert.ok(new Set(r.slice(0, 3).map((x) => x.join(","))).size > 1, "the 3 samples of a prompt differ");
    // per-row seeds (rollout.seed_per_sample): a row's samples do not depend on the other rows
    const seeded = await engine.generate({ ...req(0), rowSeeds: [11, 12] });
    const alone = await engine.generate({ ...req(0), prompts: batch.slice(1, 2), rowSeeds: [12] });
    assert.deepEqual(rows(seeded.batch.responses!).slice(3), rows(alone.batch.responses!));
    // what the trainer recomputes as old_log_probs at the same temperature
    const lp = await computeLogProb(model, a, { microBatchSize: 6, temperature: 0.8 });
    const m = a.batch.response_mask!.data, roll = a.batch.rollout_log_probs!.data;
    let md = 0;
    for (let i = 0; i < m.length; i++) if (m[i]) md = Math.max(md, Math.abs(lp.logProbs.data[i]! - roll[i]!));
    assert.ok(md < 1e-3, `rollout vs trainer log-prob difference ${md}`);
  } finally {
    await engine.dispose();
    model.dispose();
  }
});
