import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { loadConfig } from "../../src/config/index.js";
import { makeConfig } from "../../src/models/config.js";
import { saveHfModel } from "../../src/models/hf.js";
import { initModel } from "../../src/models/init.js";
import { CharTokenizer } from "../../src/models/tokenizers/index.js";
import { Rng } from "../../src/utils/rng.js";
import { RewardModelWorker } from "../../src/workers/reward_model_worker.js";
import { switchChatTemplate } from "../../src/workers/rm_chat_template.js";
import { syntheticBatch } from "./helpers.js";

const ACTOR_ALPHABET = "abcdefghijklmnopqrstuvwxyz";
// The reward model's tokenizer: other ids for the same letters, and a chat template of its own.
const RM_TEMPLATE = "{% for m in messages %}[{{ m.role }}]{{ m.content }}|{% endfor %}";
const rmTokenizer = new CharTokenizer("|][:<> zyxwvutsrqponmlkjihgfedcba", RM_TEMPLATE);

async function rmFolder(): Promise<string> {
  const dir = join(mkdtempSync(join(tmpdir(), "verl-rm-")), "rm");
  const model = initModel(makeConfig({ vocabSize: rmTokenizer.vocabSize, dim: 16, hiddenDim: 32, nLayers: 1, nHeads: 2, nKvHeads: 2, maxSeqLen: 256 }), new Rng(3));
  try {
    await saveHfModel(model, dir, rmTokenizer);
  } finally {
    model.dispose();
  }
  return dir;
}

function rmConfig(rmPath: string, extra: string[] = []) {
  return loadConfig({
    configName: "ppo_trainer",
    overrides: [
      "trainer.device=cpu", "actor_rollout_ref.model.path=scratch", `actor_rollout_ref.model.tokenizer_path=char:${ACTOR_ALPHABET}`,
      "+actor_rollout_ref.model.override_config.hidden_size=16", "+actor_rollout_ref.model.override_config.num_hidden_layers=1",
      "+actor_rollout_ref.model.override_config.num_attention_heads=2",
      "reward_model.enable=true", `reward_model.model.path=${rmPath}`, "reward_model.micro_batch_size_per_gpu=2",
      "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=grpo", ...extra,
    ],
  });
}

const actorTokenizer = CharTokenizer.fromSpec(`char:${ACTOR_ALPHABET}`);

function batchWithPrompts(B: number) {
  const data = syntheticBatch(B, 4, 6, actorTokenizer.vocabSize, 5);
  data.nonTensorBatch.raw_prompt = Array.from({ length: B }, (_, b) => [{ role: "user", content: `q ${"abcdef"[b]}` }]);
  return data;
}

type Forward = { forward(ids: tf.Tensor2D, o: object): tf.Tensor2D };
const lastValue = (model: Forward, ids: number[]) => tf.tidy(() => model.forward(tf.tensor2d(ids, [1, ids.length], "int32"), {}).dataSync()[ids.length - 1]!);

test("input_tokenizer (verl's default: the actor's path): responses are decoded, re-rendered with the reward model's chat template and scored at their last token", async () => {
  const dir = await rmFolder();
  // max_length: the re-rendered text is longer than the batch's 10 columns (verl's width when it is null)
  const worker = new RewardModelWorker(rmConfig(dir, ["reward_model.max_length=64"]));
  await worker.initModel();
  const data = batchWithPrompts(5);
  const scores = (await worker.computeRmScore(data)).batch.rm_scores!;
  const model = (worker as unknown as { model: Forward }).model;
  const mask = data.batch.response_mask!.data, resp = data.batch.responses!.data;
  for (let b = 0; b < 5; b++) {
    let len = 0;
    for (let t = 0; t < 6; t++) len += mask[b * 6 + t]!;
    // verl: decode with the actor's tokenizer, drop the eos text, append as the assistant turn, no generation prompt
    const response = actorTokenizer.decode(Array.from(resp.subarray(b * 6, b * 6 + len))).split("<eos>").join("");
    const text = `[user]q ${"abcdef"[b]}|[assistant]${response}|`;
    assert.equal(rmTokenizer.applyChatTemplate([{ role: "user", content: `q ${"abcdef"[b]}` }, { role: "assistant", content: response }]), text);
    const want = lastValue(model, rmTokenizer.encode(text, { addSpecialTokens: false }));
    for (let t = 0; t < 6; t++) {
      const got = scores.data[b * 6 + t]!;
      if (t === len - 1) assert.ok(Math.abs(got - want) < 1e-5, `row ${b}: score ${got} vs the re-rendered sequence's value ${want}`);
      else assert.equal(got, 0);
    }
  }
});

test("input_tokenizer=null: the reward model reads the actor's token ids as they are", async () => {
  const dir = await rmFolder();
  const worker = new RewardModelWorker(rmConfig(dir, ["reward_model.model.input_tokenizer=null"]));
  await worker.initModel();
  const data = batchWithPrompts(3);
  const scores = (await worker.computeRmScore(data)).batch.rm_scores!;
  const model = (worker as unknown as { model: Forward }).model;
  const am = data.batch.attention_mask!.data, ids = data.batch.input_ids!.data;
  for (let b = 0; b < 3; b++) {
    const row = Array.from(ids.subarray(b * 10, b * 10 + 10)).filter((_, j) => am[b * 10 + j]);
    const want = lastValue(model, row);
    const got = Array.from(scores.data.subarray(b * 6, b * 6 + 6)).find((v) => v !== 0)!;
    assert.ok(Math.abs(got - want) < 1e-5, `row ${b}: ${got} vs ${want}`);
  }
});

test("the re-rendered batch is right-padded to reward_model.max_length, truncated from the right, positions as verl counts them", () => {
  const data = batchWithPrompts(2);
  const out = switchChatTemplate(data, actorTokenizer, rmTokenizer, { maxLength: 12 });
  assert.deepEqual(out.batch.input_ids!.shape, [2, 12]);
  for (let b = 0; b < 2; b++) {
    const resp = data.batch.responses!.data, mask = data.batch.response_mask!.data;
    let len = 0;
    for (let t = 0; t < 6; t++) len += mask[b * 6 + t]!;
    const response = actorTokenizer.decode(Array.from(resp.subarray(b * 6, b * 6 + len))).split("<eos>").join("");
    const full = rmTokenizer.encode(`[user]q ${"abcdef"[b]}|[assistant]${response}|`, { addSpecialTokens: false });
    const n = Math.min(12, full.length);
    assert.deepEqual(Array.from(out.batch.input_ids!.data.subarray(b * 12, b * 12 + n)), full.slice(0, n));
    assert.deepEqual(Array.from(out.batch.attention_mask!.data.subarray(b * 12, b * 12 + 12)), Array.from({ length: 12 }, (_, t) => (t < n ? 1 : 0)));
    assert.deepEqual(Array.from(out.batch.position_ids!.data.subarray(b * 12, b * 12 + 12)), Array.from({ length: 12 }, (_, t) => Math.min(t, n - 1)));
  }
  // shorter than the template's text: padded with the reward model's pad id past it
  const wide = switchChatTemplate(data, actorTokenizer, rmTokenizer, { maxLength: 40 });
  assert.equal(wide.batch.input_ids!.data[39], rmTokenizer.padTokenId);
  assert.equal(wide.batch.attention_mask!.data[39], 0);
});

test("input_tokenizer: a batch without raw_prompt, or a row whose raw_prompt is not a message list, is an error naming the key", () => {
  const data = batchWithPrompts(2);
  delete data.nonTensorBatch.raw_prompt;
  assert.throws(() => switchChatTemplate(data, actorTokenizer, rmTokenizer, { maxLength: null }), /reward_model\.model\.input_tokenizer: the batch has no raw_prompt/);
  data.nonTensorBatch.raw_prompt = [[{ role: "user", content: "q" }], "just text"];
  assert.throws(() => switchChatTemplate(data, actorTokenizer, rmTokenizer, { maxLength: null }), /input_tokenizer: row 1: raw_prompt must be a list/);
});

test("reward_model.model.override_config shapes a scratch reward model over the actor's overrides; a checkpoint refuses it by key", async () => {
  const scratch = new RewardModelWorker(rmConfig("scratch", [
    "+reward_model.model.override_config.hidden_size=8", "+reward_model.model.override_config.num_attention_heads=1", "+reward_model.model.override_config.num_hidden_layers=2",
  ]));
  await scratch.initModel();
  const cfg = (scratch as unknown as { model: { config: { dim: number; nHeads: number; nLayers: number } } }).model.config;
  assert.deepEqual([cfg.dim, cfg.nHeads, cfg.nLayers], [8, 1, 2]);
  // without its own overrides the scratch reward model takes the actor's (hidden_size 16, one layer)
  const plain = new RewardModelWorker(rmConfig("scratch"));
  await plain.initModel();
  const p = (plain as unknown as { model: { config: { dim: number; nLayers: number } } }).model.config;
  assert.deepEqual([p.dim, p.nLayers], [16, 1]);
  const dir = await rmFolder();
  const ckpt = new RewardModelWorker(rmConfig(dir, ["+reward_model.model.override_config.hidden_size=8"]));
  await assert.rejects(ckpt.initModel(), /reward_model\.model\.override_config sets hidden_size: config overrides shape a 'scratch' model/);
});

test("reward_model.rollout.name (verl's reward loop serves the reward model): always re-rendered from the actor's tokenizer, tokenized as the server does, never cut", async () => {
  const dir = await rmFolder();
  // input_tokenizer=null does not matter here: verl's reward loop always re-renders; the batch is 10 columns wide
  const worker = new RewardModelWorker(rmConfig(dir, ["reward_model.rollout.name=vllm", "reward_model.model.input_tokenizer=null"]));
  await worker.initModel();
  const data = batchWithPrompts(3);
  const scores = (await worker.computeRmScore(data)).batch.rm_scores!;
  const model = (worker as unknown as { model: Forward }).model;
  const mask = data.batch.response_mask!.data, resp = data.batch.responses!.data;
  for (let b = 0; b < 3; b++) {
    let len = 0;
    for (let t = 0; t < 6; t++) len += mask[b * 6 + t]!;
    const response = actorTokenizer.decode(Array.from(resp.subarray(b * 6, b * 6 + len))).split("<eos>").join("");
    // the server adds the tokenizer's special tokens (a leading <bos> here), over the whole conversation
    const ids = rmTokenizer.encode(`[user]q ${"abcdef"[b]}|[assistant]${response}|`, { addSpecialTokens: true });
    assert.equal(ids[0], rmTokenizer.bosTokenId);
    assert.ok(ids.length > 10);
    const want = lastValue(model, ids);
    const got = scores.data[b * 6 + len - 1]!;
    assert.ok(Math.abs(got - want) < 1e-5, `row ${b}: ${got} vs ${want}`);
  }
  // a conversation longer than the server takes is refused, as verl's server refuses it
  const short = new RewardModelWorker(rmConfig(dir, ["reward_model.rollout.name=sglang", "reward_model.rollout.max_model_len=12"]));
  await short.initModel();
  await assert.rejects(short.computeRmScore(batchWithPrompts(2)), /reward_model\.rollout\.max_model_len: row 0's conversation is \d+ tokens for the reward model, more than the 12 it takes/);
});
