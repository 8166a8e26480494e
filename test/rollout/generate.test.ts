import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { JsKernels } from "../../src/engine/host_kernels.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { generate, defaultSamplingParams, computeLogProb, leftPadPrompts, KvCacheDecoder } from "../../src/rollout/index.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, tok512Bin, STORIES_MISSING, ONCE_UPON_A_TIME, README_CONTINUATION, tok512Pieces, decodePieces } from "../models/stories.js";

const tinyConfig = () => makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false, maxSeqLen: 64 });

function rowTokens(d: { data: ArrayLike<number>; shape: number[] }, b: number): number[] {
  const n = d.shape[1]!;
  return Array.from(d.data).slice(b * n, (b + 1) * n);
}

test("stories260K: batched KV-cache generation reproduces the README continuation and the no-cache tokens", async (t) => {
  const bin = storiesBin(), tok = tok512Bin();
  if (!bin || !tok) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin);
  try {
    // prompts of different lengths, left-padded
    const prompts = [ONCE_UPON_A_TIME, [1, 403], [1, 378, 261, 407]];
    const batch = leftPadPrompts(prompts, 0);
    const params = defaultSamplingParams({ temperature: 0, responseLength: 32, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true });
    const fast = generate(m, batch, params, new Rng(0));
    const slow = generate(m, batch, params, new Rng(0), { engine: "no-cache" });
    const pieces = tok512Pieces(tok);
    assert.ok(README_CONTINUATION.startsWith(decodePieces(pieces, rowTokens(fast.batch["responses"]!, 0))), "README continuation");
    assert.deepEqual(Array.from(fast.batch["responses"]!.data), Array.from(slow.batch["responses"]!.data));
    // the fast engine's log-probs agree with the training forward (greedy: temperature 1)
    const lp = await computeLogProb(m, fast, { microBatchSize: 2, temperature: 0 });
    const mask = fast.batch["response_mask"]!.data, roll = fast.batch["rollout_log_probs"]!.data;
    let md = 0;
    for (let i = 0; i < mask.length; i++) if (mask[i]) md = Math.max(md, Math.abs(lp.logProbs.data[i]! - roll[i]!));
    assert.ok(md < 1e-4, `log-prob disagreement ${md}`);
    // sampled decoding with the same seed is also the same on both engines
    const sp = { ...params, temperature: 1, responseLength: 16 };
    assert.deepEqual(Array.from(generate(m, batch, sp, new Rng(7)).batch["responses"]!.data), Array.from(generate(m, batch, sp, new Rng(7), { engine: "no-cache" }).batch["responses"]!.data));
  } finally {
    m.dispose();
  }
});

test("verl's output layout: left-padded prompts, right-padded responses, EOS kept and masked after, positions continue", async () => {
  await initBackend("wasm");
  const m = initModel(tinyConfig(), new Rng(4));
  try {
    const batch = leftPadPrompts([[5, 6, 7, 8], [9]], 0);
    batch.nonTensorBatch["uid"] = ["a", "b"];
    // make every token an EOS candidate except one, so some row stops early
    const eos = Array.from({ length: 40 }, (_, i) => i).filter((i) => i % 3 === 0);
    const out = generate(m, batch, defaultSamplingParams({ temperature: 1, responseLength: 6, eosTokenIds: eos, padTokenId: 0, calculateLogProbs: true, n: 2 }), new Rng(11));
    assert.equal(out.length, 4);
    assert.deepEqual(out.nonTensorBatch["uid"], ["a", "a", "b", "b"]);
    const R = 6, P = 4, L = P + R;
    assert.deepEqual(out.batch["input_ids"]!.shape, [4, L]);
    assert.deepEqual(rowTokens(out.batch["prompts"]!, 2), [0, 0, 0, 9]);
    let sawEarlyStop = false;
    for (let b = 0; b < 4; b++) {
      const resp = rowTokens(out.batch["responses"]!, b), rm = rowTokens(out.batch["response_mask"]!, b);
      const stop = resp.findIndex((x) => eos.includes(x));
      const valid = stop < 0 ? R : stop + 1;
      if (valid < R) sawEarlyStop = true;
      assert.deepEqual(rm, Array.from({ length: R }, (_, i) => (i < valid ? 1 : 0)), `row ${b}`);
      for (let i = valid; i < R; i++) assert.equal(resp[i], 0);
      assert.deepEqual(rowTokens(out.batch["input_ids"]!, b).slice(P), resp);
      assert.deepEqual(rowTokens(out.batch["attention_mask"]!, b).slice(P), rm);
      const pos = rowTokens(out.batch["position_ids"]!, b);
      const last = b < 2 ? 3 : 0;
      assert.deepEqual(pos.slice(P), Array.from({ length: R }, (_, i) => last + 1 + i));
    }
    assert.ok(sawEarlyStop, "some row should hit an EOS");
    // seeded: the same seed gives the same batch, another seed (almost surely) not
    const again = generate(m, batch, defaultSamplingParams({ temperature: 1, responseLength: 6, eosTokenIds: eos, padTokenId: 0, n: 2 }), new Rng(11));
    assert.deepEqual(Array.from(again.batch["responses"]!.data), Array.from(out.batch["responses"]!.data));
  } finally {
    m.dispose();
  }
});

test("KV-cache and no-cache decoding agree on a random GQA + bias + untied model; small cache budgets split the batch", async () => {
  await initBackend("wasm");
  const m = initModel(tinyConfig(), new Rng(8));
  try {
    const batch = leftPadPrompts([[1, 2, 3, 4, 5, 6], [7, 8], [9, 10, 11]], 0);
    const params = defaultSamplingParams({ temperature: 0, responseLength: 12, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true });
    const a = generate(m, batch, params, new Rng(0));
    const b = generate(m, batch, params, new Rng(0), { engine: "no-cache" });
    const c = generate(m, batch, params, new Rng(0), { maxCacheBytes: 1 });
    assert.deepEqual(Array.from(a.batch["responses"]!.data), Array.from(b.batch["responses"]!.data));
    assert.deepEqual(Array.from(a.batch["responses"]!.data), Array.from(c.batch["responses"]!.data));
    const la = a.batch["rollout_log_probs"]!.data, lb = b.batch["rollout_log_probs"]!.data;
    for (let i = 0; i < la.length; i++) assert.ok(Math.abs(la[i]! - lb[i]!) < 1e-4);
  } finally {
    m.dispose();
  }
});

test("plain-JS products and attention give the same decoder logits as XNNPACK and the SIMD kernels", async () => {
  await initBackend("wasm");
  const m = initModel(tinyConfig(), new Rng(9));
  const a = new KvCacheDecoder(m, 2, 8), b = new KvCacheDecoder(m, 2, 8, { kernels: new JsKernels(), simd: false });
  assert.equal(a.usesSimd, true);
  assert.equal(b.usesSimd, false);
  try {
    const ids = Int32Array.from([0, 3, 4, 5, 6, 7]), pos = Int32Array.from([0, 0, 1, 0, 1, 2]), mask = [0, 1, 1, 1, 1, 1];
    const la = Array.from(a.prefill(ids, pos, mask, 3)), lb = Array.from(b.prefill(ids, pos, mask, 3));
    la.forEach((v, i) => assert.ok(Math.abs(v - lb[i]!) < 1e-4));
    const sa = Array.from(a.step(Int32Array.from([1]), Int32Array.from([2]), Int32Array.from([3]), 3));
    const sb = Array.from(b.step(Int32Array.from([1]), Int32Array.from([2]), Int32Array.from([3]), 3));
    assert.equal(sa.length, 40);
    sa.forEach((v, i) => assert.ok(Math.abs(v - sb[i]!) < 1e-4));
    assert.throws(() => a.step(Int32Array.from([0]), Int32Array.from([99]), Int32Array.from([1]), 4), /token id 99 outside the vocabulary/);
  } finally {
    a.dispose(); b.dispose(); m.dispose();
  }
});

test("rows can sit at different cache columns: per-row slots give each sequence's own logits", async () => {
  await initBackend("wasm");
  const m = initModel(tinyConfig(), new Rng(12));
  const both = new KvCacheDecoder(m, 2, 10), one = new KvCacheDecoder(m, 1, 10);
  try {
    const seqs = [[3, 4, 5, 6], [7, 8, 9, 10, 11, 12]];
    both.forwardRows(Int32Array.from([1]), Int32Array.from(seqs[1]!.slice(0, 5)), Int32Array.from([0, 1, 2, 3, 4]), Int32Array.from([0]), 5);
    both.forwardRows(Int32Array.from([0]), Int32Array.from(seqs[0]!.slice(0, 3)), Int32Array.from([0, 1, 2]), Int32Array.from([0]), 3);
    const stepped = Array.from(both.step(Int32Array.from([0, 1]), Int32Array.from([6, 12]), Int32Array.from([3, 5]), Int32Array.from([3, 5])));
    seqs.forEach((seq, r) => {
      one.resetRows(Int32Array.from([0]));
      const ref = one.forwardRows(Int32Array.from([0]), Int32Array.from(seq), Int32Array.from(seq.map((_, i) => i)), Int32Array.from([0]), seq.length);
      ref.forEach((v, i) => assert.ok(Math.abs(v - stepped[r * 40 + i]!) < 1e-4, `row ${r} logit ${i}`));
    });
  } finally {
    both.dispose(); one.dispose(); m.dispose();
  }
});

test("truncateRow keeps a cached prefix: continuing from it gives the logits of decoding the new sequence afresh", async () => {
  await initBackend("wasm");
  const m = initModel(tinyConfig(), new Rng(13));
  for (const simd of [true, false]) {
    const dec = new KvCacheDecoder(m, 2, 10, { simd }), fresh = new KvCacheDecoder(m, 1, 10, { simd });
    const cols = (from: number, n: number) => Int32Array.from({ length: n }, (_, i) => from + i);
    try {
      dec.forwardRows(Int32Array.from([1]), Int32Array.from([3, 4, 5, 6, 7, 8, 9]), cols(0, 7), Int32Array.from([0]), 7);
      dec.truncateRow(1, 4); // keep [3, 4, 5, 6]
      // written past a gap (column 6, position 4): the forgotten columns 4, 5 (tokens 7, 8) must not be attended to
      const cont = Array.from(dec.forwardRows(Int32Array.from([1]), Int32Array.from([12]), cols(4, 1), Int32Array.from([6]), 1));
      const ref = fresh.forwardRows(Int32Array.from([0]), Int32Array.from([3, 4, 5, 6, 12]), cols(0, 5), Int32Array.from([0]), 5);
      ref.forEach((v, i) => assert.ok(Math.abs(v - cont[i]!) < 1e-4, `simd ${simd}, logit ${i}`));
      dec.truncateRow(1, 0);
      const again = Array.from(dec.forwardRows(Int32Array.from([1]), Int32Array.from([3, 4, 5, 6, 12]), cols(0, 5), Int32Array.from([0]), 5));
      ref.forEach((v, i) => assert.ok(Math.abs(v - again[i]!) < 1e-4, `after truncating to 0, logit ${i}`));
      assert.throws(() => dec.truncateRow(2, 0), /row 2 outside \[0, 2\)/);
      assert.throws(() => dec.truncateRow(0, 11), /cannot keep 11 columns/);
    } finally {
      dec.dispose(); fresh.dispose();
    }
  }
  m.dispose();
});

test("generation leaves no tensors behind", async () => {
  await initBackend("wasm");
  const m = initModel(tinyConfig(), new Rng(10));
  const batch = leftPadPrompts([[1, 2], [3]], 0);
  const params = defaultSamplingParams({ responseLength: 5, padTokenId: 0 });
  generate(m, batch, params, new Rng(1));
  const before = tf.memory().numTensors;
  for (let i = 0; i < 3; i++) generate(m, batch, params, new Rng(i));
  assert.equal(tf.memory().numTensors, before);
  m.dispose();
});

test("prefix sharing on the host decoder: rollout.n siblings are prefilled once and decode as the no-cache engine", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin);
  try {
    const batch = leftPadPrompts([ONCE_UPON_A_TIME, [1, 403], ONCE_UPON_A_TIME], 0);
    for (const temperature of [0, 1]) {
      const params = defaultSamplingParams({ temperature, responseLength: 16, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true, n: 2 });
      const a = generate(m, batch, params, new Rng(3)), b = generate(m, batch, params, new Rng(3), { engine: "no-cache" });
      assert.deepEqual(Array.from(a.batch["responses"]!.data), Array.from(b.batch["responses"]!.data), `temperature ${temperature}`);
    }
    // the prefill runs the 2 distinct prompts of 6 rows; every row gets its source's last logits
    const P = 5, ids = Int32Array.from(batch.repeat(2, true).batch["input_ids"]!.data), mask = Int32Array.from(batch.repeat(2, true).batch["attention_mask"]!.data);
    const pos = Int32Array.from(mask, (_, i) => Math.max(0, mask.slice(i - (i % P), i + 1).reduce((s, x) => s + x, 0) - 1));
    const dec = new KvCacheDecoder(m, 6, P + 4), ran: number[] = [], run = dec.forwardRows.bind(dec);
    dec.forwardRows = (rows, ...rest) => { ran.push(rows.length); return run(rows, ...rest); };
    const logits = dec.prefill(ids, pos, mask, P).slice(), V = m.config.vocabSize;
    assert.deepEqual(ran, [2]);
    for (const [x, y] of [[0, 1], [0, 4], [2, 3]] as const) assert.deepEqual(logits.slice(x * V, x * V + V), logits.slice(y * V, y * V + V));
    assert.notDeepEqual(logits.slice(0, V), logits.slice(2 * V, 3 * V));
    dec.dispose();
  } finally {
    m.dispose();
  }
});
