// The WebGPU decode engine against the host decoder. Runs only where a WebGPU adapter
// exists (the H200 through scripts/gpu-run.sh, or this CPU machine through Dawn's OpenGL
// backend on Mesa's llvmpipe: docs/gpu.md, "Testing WebGPU code without a GPU"); skips
// clearly elsewhere. The error off WebGPU is checked everywhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { generate, defaultSamplingParams, computeLogProb, leftPadPrompts } from "../../src/rollout/index.js";
import { readParamsForDecode } from "../../src/rollout/decode_weights.js";
import { DECODE_TILE, WebGpuDecoder, WebGpuSlotDecoder } from "../../src/rollout/webgpu_decoder.js";
import { directSplits } from "../../src/engine/webgpu_gemm.js";
import { attentionHeadsPerGroup, AttentionProgram, placementUniforms, type DecodeShape, type GpuProgram, type Placement } from "../../src/rollout/webgpu_programs.js";
import { halfToFloat } from "../../src/models/safetensors.js";
import { samePromptSource } from "../../src/rollout/prompts.js";
import { setRolloutQuantization } from "../../src/rollout/fp8.js";
import type { DataProto } from "../../src/protocol/data_proto.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, STORIES_MISSING, ONCE_UPON_A_TIME } from "../models/stories.js";

let adapter: string | undefined;
async function webgpu(): Promise<string | undefined> {
  if (adapter !== undefined) return adapter || undefined;
  try {
    await initBackend("webgpu");
    adapter = "webgpu";
  } catch (e) {
    adapter = "";
    skipReason = `no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`;
  }
  return adapter || undefined;
}
let skipReason = "";

const ints = (d: DataProto, key: string) => Array.from(d.batch[key]!.data);
const greedy = (responseLength: number) => defaultSamplingParams({ temperature: 0, responseLength, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true });

/** The WebGPU engine's output and the host engine's for the same batch. */
async function both(m: LlamaModel, batch: DataProto, params: ReturnType<typeof greedy>, opts = {}): Promise<[DataProto, DataProto]> {
  const gpu = await new WebGpuDecoder(opts).generate(m, batch, params, new Rng(0));
  await readParamsForDecode(m);
  return [gpu, generate(m, batch, params, new Rng(0))];
}

function meanDiff(a: DataProto, b: DataProto, key: string): number {
  const mask = a.batch["response_mask"]!.data, x = a.batch[key]!.data, y = b.batch[key]!.data;
  let s = 0, n = 0;
  for (let i = 0; i < mask.length; i++) if (mask[i]) { s += Math.abs(x[i]! - y[i]!); n++; }
  return s / n;
}

function maxDiff(a: DataProto, b: DataProto, key: string): number {
  const mask = a.batch["response_mask"]!.data, x = a.batch[key]!.data, y = b.batch[key]!.data;
  let m = 0;
  for (let i = 0; i < mask.length; i++) if (mask[i]) m = Math.max(m, Math.abs(x[i]! - y[i]!));
  return m;
}

test("off the WebGPU backend the engine says which backend it needs", async () => {
  const prev = tf.getBackend();
  await tf.setBackend("cpu");
  const m = initModel(makeConfig({ vocabSize: 16, dim: 8, nLayers: 1, nHeads: 2 }), new Rng(1));
  try {
    await assert.rejects(new WebGpuDecoder().generate(m, leftPadPrompts([[1, 2]], 0), greedy(2), new Rng(0)), /rollout engine 'webgpu' decodes on the WebGPU backend \(trainer.device=webgpu\); this thread's backend is 'cpu'/);
  } finally {
    m.dispose();
    if (prev) await tf.setBackend(prev);
  }
});

test("heads wider than the decode attention takes are refused up front, naming the fallback", async () => {
  const m = initModel(makeConfig({ vocabSize: 16, dim: 576, hiddenDim: 16, nLayers: 1, nHeads: 2 }), new Rng(1)); // head_dim 288
  try {
    const want = /does not serve head_dim 288 \(its decode attention takes up to 256\) yet; use rollout.name=tfjs/;
    await assert.rejects(new WebGpuDecoder().generate(m, leftPadPrompts([[1, 2]], 0), greedy(2), new Rng(0)), want);
    assert.throws(() => new WebGpuSlotDecoder(m, 2, 8), want);
  } finally {
    m.dispose();
  }
});

test("decode products split K where they have few output tiles; attention serves a kv head's query heads together (Qwen2.5-0.5B's shapes, 512 rows)", () => {
  const at = (m: number, n: number, k: number) => directSplits({ batch: 1, m, n, k, transposeA: false, transposeB: true, batchA: 1, batchB: 1 }, DECODE_TILE);
  // H100, 2026-12-06: split 1,024:256 gave 15.96 ms a step against 22.10 unsplit (docs/gpu.md)
  assert.deepEqual({ qkv: at(512, 1152, 896), o: at(512, 896, 896), down: at(512, 896, 4864) }, { qkv: 3, o: 3, down: 5 });
  assert.deepEqual({ gateUp: at(512, 9728, 896), head: at(512, 151936, 896), prefillDown: at(16384, 896, 4864) }, { gateUp: 1, head: 1, prefillDown: 1 });
  assert.equal(attentionHeadsPerGroup({ nHeads: 14, nKvHeads: 2, headDim: 64 }), 7);
  assert.equal(attentionHeadsPerGroup({ nHeads: 14, nKvHeads: 2, headDim: 64 }, true), 1);
  // Qwen3-8B's 32:8 heads of 128; heads of 256 in groups of 16 take 4 (8 would need 16,416 bytes of workgroup memory)
  assert.equal(attentionHeadsPerGroup({ nHeads: 32, nKvHeads: 8, headDim: 128 }), 4);
  assert.equal(attentionHeadsPerGroup({ nHeads: 16, nKvHeads: 1, headDim: 256 }), 4);
});

test("stories260K: greedy tokens and log-probs match the host decoder", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(skipReason);
  const m = loadLlama2c(bin);
  try {
    const batch = leftPadPrompts([ONCE_UPON_A_TIME, [1, 403], [1, 378, 261, 407], [1, 261, 403, 407, 378, 261]], 0);
    const [gpu, host] = await both(m, batch, greedy(48));
    assert.deepEqual(ints(gpu, "responses"), ints(host, "responses"));
    assert.deepEqual(ints(gpu, "response_mask"), ints(host, "response_mask"));
    assert.deepEqual(ints(gpu, "input_ids"), ints(host, "input_ids"));
    assert.deepEqual(ints(gpu, "position_ids"), ints(host, "position_ids"));
    const d = maxDiff(gpu, host, "rollout_log_probs");
    assert.ok(d < 1e-3, `log-prob disagreement ${d}`);
  } finally {
    m.dispose();
  }
});

test("q/k/v biases, untied head, grouped heads, chunked prefill and sub-batches match the host decoder", async (t) => {
  if (!(await webgpu())) return t.skip(skipReason);
  const cfg = makeConfig({ vocabSize: 300, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false, maxSeqLen: 128 });
  const m = initModel(cfg, new Rng(7));
  try {
    const rng = new Rng(3), prompts = Array.from({ length: 5 }, (_, i) => Array.from({ length: 3 + 2 * i }, () => 1 + Math.floor(rng.random() * 299)));
    const batch = leftPadPrompts(prompts, 0);
    const params = { ...greedy(20), eosTokenIds: [] };
    const [gpu, host] = await both(m, batch, params, { maxPrefillTokens: 10, maxCacheBytes: 2 * cfg.nLayers * cfg.nKvHeads * cfg.headDim * 40 * 4 * 2 });
    assert.deepEqual(ints(gpu, "responses"), ints(host, "responses"));
    const d = maxDiff(gpu, host, "rollout_log_probs");
    assert.ok(d < 1e-3, `log-prob disagreement ${d}`);
  } finally {
    m.dispose();
  }
});

test("attention: a kv head's query heads in one workgroup or one each give the training forward's log-probs (Qwen2.5-0.5B's 14:2 heads of 64 past one 128-column tile; head_dim 48 and 10; f32 and f16 caches)", async (t) => {
  if (!(await webgpu())) return t.skip(skipReason);
  // the cache's loads: vec4 words at head_dim 64 and 48 (8 halves or 4 floats), pairs at 10
  for (const [shape, kvCache] of [{ dim: 896, nHeads: 14, nKvHeads: 2 }, { dim: 96, nHeads: 2, nKvHeads: 1 }, { dim: 20, nHeads: 2, nKvHeads: 1 }]
    .flatMap((sh) => (["f32", "f16"] as const).map((kv) => [sh, kv] as const))) {
    const cfg = makeConfig({ vocabSize: 64, hiddenDim: 32, nLayers: 1, attentionBias: true, maxSeqLen: 256, ...shape });
    const m = initModel(cfg, new Rng(11));
    try {
      const rng = new Rng(4), prompts = Array.from({ length: 3 }, (_, i) => Array.from({ length: 4 + 5 * i }, () => 1 + Math.floor(rng.random() * 63)));
      // sampled (not greedy), so the rows differ and attend over their own columns: prompt + 140 > 128 columns
      const params = defaultSamplingParams({ temperature: 1, responseLength: 140, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true });
      const runs: number[][] = [];
      for (const attention of ["grouped", "per_head"] as const) {
        const out = await new WebGpuDecoder({ attention, kvCache }).generate(m, leftPadPrompts(prompts, 0), params, new Rng(2));
        const lp = await computeLogProb(m, out, { microBatchSize: 8, temperature: 1 });
        const mask = out.batch["response_mask"]!.data, roll = out.batch["rollout_log_probs"]!.data;
        let md = 0, n = 0;
        for (let i = 0; i < mask.length; i++) if (mask[i]) { md = Math.max(md, Math.abs(lp.logProbs.data[i]! - roll[i]!)); n++; }
        assert.equal(n, 3 * 140, `${attention}: every response token kept`);
        assert.ok(md < 1e-3, `${JSON.stringify(shape)} ${kvCache} cache, ${attention}: rollout log-probs off the training forward's by ${md}`);
        runs.push(ints(out, "responses"));
      }
      // the same draws: the two layouts differ only in the order of f32 sums
      const same = runs[0]!.filter((v, i) => v === runs[1]![i]).length;
      assert.ok(same >= 0.9 * runs[0]!.length, `${JSON.stringify(shape)} ${kvCache} cache: grouped and per-head tokens agree at ${same} of ${runs[0]!.length}`);
    } finally {
      m.dispose();
    }
  }
});

test("attention writes o_proj's packed f16 operand: its float output rounded to f16, zero past the rows and the heads", async (t) => {
  if (!(await webgpu())) return t.skip(skipReason);
  const s: DecodeShape = { dim: 128, hiddenDim: 32, nHeads: 4, nKvHeads: 2, headDim: 32, vocabSize: 64, normEps: 1e-5 };
  const N = 5, maxLen = 40, HD = s.headDim, KVH = s.nKvHeads, W = (s.nHeads + 2 * KVH) * HD, ropeRows = 48, O = s.nHeads * HD;
  const rng = new Rng(5), rand = (n: number) => Float32Array.from({ length: n }, () => rng.random() * 2 - 1);
  const place: Placement = { nTok: N, tPer: 1, slot0: 33, posAdd: 0, maxLen, vOff: N * KVH * maxLen * HD, ropeOff: ropeRows * (HD / 2) };
  const inputs = [tf.tensor2d(rand(N * W), [N, W]), tf.tensor1d(rand(W)), tf.tensor1d(rand(2 * ropeRows * (HD / 2))),
    tf.tensor1d(Int32Array.from({ length: N }, (_, n) => 20 + n), "int32"), tf.tensor1d(new Int32Array(N * maxLen).fill(1), "int32"), tf.tensor1d(rand(2 * N * KVH * maxLen * HD))];
  const backend = tf.backend() as unknown as { runWebGPUProgram(p: GpuProgram, i: tf.Tensor[], d: string, u: unknown[]): tf.TensorInfo };
  const run = (p: AttentionProgram, dtype: string) => tf.engine().makeTensorFromTensorInfo(backend.runWebGPUProgram(p, inputs, dtype, placementUniforms(place)));
  const rowsP = N + 3, colsP = O + 16;
  const plain = run(new AttentionProgram(s, N), "float32");
  // a freed buffer of the output's size holding non-zeros, which the packed output reuses: the zeros must be written
  const junk = tf.tidy(() => tf.fill([(rowsP * colsP) / 2], 0x3c003c00, "int32").add(tf.scalar(0, "int32")));
  await junk.data();
  junk.dispose();
  const packed = run(new AttentionProgram(s, N, false, false, { rowsP, colsP, rounding: "f16" }), "int32");
  try {
    const f = await plain.data(), words = await packed.data();
    assert.equal(words.length, (rowsP * colsP) / 2);
    let worst = 0;
    for (let r = 0; r < rowsP; r++) {
      for (let c = 0; c < colsP; c++) {
        const w = words[r * (colsP / 2) + (c >> 1)]!, h = halfToFloat(c & 1 ? (w >>> 16) & 0xffff : w & 0xffff);
        if (r >= N || c >= O) { assert.equal(h, 0, `padding [${r}, ${c}] is ${h}`); continue; }
        const want = f[r * O + c]!;
        worst = Math.max(worst, Math.abs(h - want) / Math.max(Math.abs(want), 2 ** -14));
      }
    }
    assert.ok(worst <= 2 ** -11, `packed output off the float output by ${worst} (relative), more than f16 rounding`);
  } finally {
    [...inputs, plain, packed].forEach((x) => x.dispose());
  }
});

test("sampling on the device: same seed same tokens, top-k 1 is greedy, log-probs are the training forward's", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(skipReason);
  const m = loadLlama2c(bin);
  try {
    const batch = leftPadPrompts([ONCE_UPON_A_TIME, [1, 403]], 0);
    const sample = defaultSamplingParams({ temperature: 1, topK: 50, topP: 0.9, responseLength: 24, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true, n: 4 });
    const dec = new WebGpuDecoder();
    const a = await dec.generate(m, batch, sample, new Rng(5)), b = await dec.generate(m, batch, sample, new Rng(5));
    assert.deepEqual(ints(a, "responses"), ints(b, "responses"));
    const c = await dec.generate(m, batch, sample, new Rng(6));
    assert.notDeepEqual(ints(a, "responses"), ints(c, "responses"));
    // the sampled tokens' log-probs under softmax(logits / T), as compute_log_prob gives them
    const lp = await computeLogProb(m, a, { microBatchSize: 8, temperature: 1 });
    const mask = a.batch["response_mask"]!.data, roll = a.batch["rollout_log_probs"]!.data;
    let md = 0;
    for (let i = 0; i < mask.length; i++) if (mask[i]) md = Math.max(md, Math.abs(lp.logProbs.data[i]! - roll[i]!));
    assert.ok(md < 1e-3, `log-prob disagreement ${md}`);
    // top-k 1 (and a tiny nucleus) leave only the most likely token
    const g = await dec.generate(m, batch, greedy(24), new Rng(0));
    for (const cut of [{ topK: 1, topP: 1 }, { topK: -1, topP: 1e-6 }]) {
      const s = await dec.generate(m, batch, { ...sample, ...cut, n: 1 }, new Rng(9));
      assert.deepEqual(ints(s, "responses"), ints(g, "responses"), JSON.stringify(cut));
    }
  } finally {
    m.dispose();
  }
});

test("replayed decode steps give the recorded steps' tokens and log-probs bit for bit (sampling, prefix sharing, sub-batches)", async (t) => {
  if (!(await webgpu())) return t.skip(skipReason);
  const cfg = makeConfig({ vocabSize: 300, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false, maxSeqLen: 128 });
  const m = initModel(cfg, new Rng(11));
  try {
    const rng = new Rng(4), prompts = Array.from({ length: 3 }, (_, i) => Array.from({ length: 2 + 3 * i }, () => 1 + Math.floor(rng.random() * 299)));
    const batch = leftPadPrompts(prompts, 0);
    const sample = defaultSamplingParams({ temperature: 0.9, topK: 40, topP: 0.95, responseLength: 18, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true, n: 3 });
    const opts = { maxCacheBytes: 2 * cfg.nLayers * cfg.nKvHeads * cfg.headDim * 30 * 4 * 5 }; // sub-batches of 5 rows
    const replayed = new WebGpuDecoder({ ...opts, replay: true }), recorded = new WebGpuDecoder({ ...opts, replay: false });
    const a = await replayed.generate(m, batch, sample, new Rng(8));
    const after = tf.memory().numTensors; // the weights' decode layout stays with the model
    assert.match(replayed.lastStats.replay, /^on: \d+ dispatches a step/);
    assert.equal(replayed.lastStats.replayed, 2 * (sample.responseLength - 2), "every sub-batch replays its steps after the recorded one");
    const b = await recorded.generate(m, batch, sample, new Rng(8));
    assert.match(recorded.lastStats.replay, /^off: turned off/);
    assert.equal(recorded.lastStats.replayed, 0);
    assert.deepEqual(ints(a, "responses"), ints(b, "responses"));
    assert.deepEqual(Array.from(a.batch["rollout_log_probs"]!.data), Array.from(b.batch["rollout_log_probs"]!.data));
    // the rows were sampled, not all the same: the step counter advanced in the replays
    assert.ok(new Set(ints(a, "responses")).size > 20);
    await replayed.generate(m, batch, sample, new Rng(8));
    assert.equal(tf.memory().numTensors, after, "no tensor left behind by the kept intermediates");
  } finally {
    m.dispose();
  }
});

test("the first sampled token follows softmax(logits / T), restricted to the top-k or not (the draw made in the first pass)", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(skipReason);
  const m = loadLlama2c(bin);
  try {
    const rows = 2048, batch = leftPadPrompts([ONCE_UPON_A_TIME], 0);
    const logits = tf.tidy(() => m.forward(tf.tensor2d(ONCE_UPON_A_TIME, [1, 5], "int32")).slice([0, 4, 0], [1, 1, -1]).reshape([-1]));
    const raw = Array.from(await logits.data());
    logits.dispose();
    // top-k runs the threshold passes; top-k off is the plain draw, made while the row's maximum is found
    for (const [T, K] of [[1.5, 8], [2, -1]] as const) {
      const params = defaultSamplingParams({ temperature: T, topK: K, responseLength: 1, padTokenId: 0, n: rows });
      const out = await new WebGpuDecoder().generate(m, batch, params, new Rng(11));
      const z = raw.map((x) => x / T);
      const top = z.map((v, i) => [v, i] as const).sort((a, b) => b[0] - a[0]).slice(0, K > 0 ? K : z.length);
      const mx = top[0]![0], w = top.map(([v]) => Math.exp(v - mx)), sum = w.reduce((s, x) => s + x, 0);
      const counts = new Map<number, number>();
      for (const tkn of ints(out, "responses")) counts.set(tkn, (counts.get(tkn) ?? 0) + 1);
      for (const tkn of counts.keys()) assert.ok(top.some(([, i]) => i === tkn), `token ${tkn} is outside the top ${K}`);
      let tv = 0;
      top.forEach(([, i], j) => { tv += Math.abs((counts.get(i) ?? 0) / rows - w[j]! / sum); });
      // the whole vocabulary at T = 2 spreads the draws over ~120 tokens: 2,048 draws of a right sampler
      // are ~0.06 off by noise alone (measured on llvmpipe); a first pass that drew nothing (the maximum) is 0.36 off
      const bound = K > 0 ? 0.05 : 0.1;
      assert.ok(tv / 2 < bound, `total variation from softmax(z / ${T}) over the top-${K > 0 ? K : "all"}: ${tv / 2}`);
    }
  } finally {
    m.dispose();
  }
});

test("prefix sharing finds each row's first equal prompt (ids, mask and positions)", () => {
  const P = 3;
  const ids = Int32Array.from([0, 5, 6, 0, 5, 6, 7, 5, 6, 0, 5, 6, 0, 5, 6]);
  const mask = Int32Array.from([0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]);
  const pos = Int32Array.from([0, 0, 1, 0, 0, 1, 0, 1, 2, 0, 0, 1, 0, 1, 2]);
  // row 4 has row 0's ids but not its mask: a prompt of its own
  assert.deepEqual(Array.from(samePromptSource(ids, mask, pos, 5, P)), [0, 0, 2, 0, 4]);
});

test("prefix sharing: rollout.n siblings prefilled once decode as if each row had been prefilled", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(skipReason);
  const m = loadLlama2c(bin);
  try {
    // verl's layout: each prompt repeated n times, interleaved; two prompts equal across the batch too
    const batch = leftPadPrompts([ONCE_UPON_A_TIME, [1, 403], ONCE_UPON_A_TIME], 0);
    const sampled = defaultSamplingParams({ temperature: 1, responseLength: 16, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true, n: 3 });
    for (const params of [{ ...greedy(16), n: 3 }, sampled]) {
      const shared = new WebGpuDecoder(), own = new WebGpuDecoder({ sharePrefixes: false });
      const a = await shared.generate(m, batch, params, new Rng(5)), b = await own.generate(m, batch, params, new Rng(5));
      assert.equal(shared.lastStats.prefillRows, 2);
      assert.equal(own.lastStats.prefillRows, 9);
      assert.deepEqual(ints(a, "responses"), ints(b, "responses"));
      assert.deepEqual(ints(a, "response_mask"), ints(b, "response_mask"));
      const d = maxDiff(a, b, "rollout_log_probs");
      assert.ok(d < 1e-5, `log-prob disagreement ${d}`);
    }
  } finally {
    m.dispose();
  }
});

test("f16 KV cache: greedy tokens as the f32 cache's, rollout log-probs near the trainer's (prefix sharing, chunked prefill, sub-batches)", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(skipReason);
  const m = loadLlama2c(bin);
  try {
    const prompts = [ONCE_UPON_A_TIME, [1, 403], [1, 378, 261, 407], [1, 261, 403, 407, 378, 261], [1, 500, 301, 280], [1, 410], [1, 333, 444], [1, 45, 67, 89]];
    const batch = leftPadPrompts(prompts, 0), params = { ...greedy(32), n: 2 };
    const opts = { maxPrefillTokens: 12, maxCacheBytes: 6 * 2 * 5 * 8 * 40 * 2 }; // a few rows a sub-batch at the f16 size
    const f32 = await new WebGpuDecoder(opts).generate(m, batch, params, new Rng(0));
    const dec = new WebGpuDecoder({ ...opts, kvCache: "f16" });
    const f16 = await dec.generate(m, batch, params, new Rng(0));
    const R = 32, a = ints(f32, "responses"), b = ints(f16, "responses");
    let same = 0;
    for (let r = 0; r < prompts.length * 2; r++) if (a.slice(r * R, r * R + R).every((x, i) => x === b[r * R + i])) same++;
    assert.ok(same >= 12, `only ${same} of 16 rows decode as with the f32 cache`);
    // the f16 cache's log-probs against the float32 trainer's recomputation of the same tokens
    const lp = await computeLogProb(m, f16, { microBatchSize: 16, temperature: 1 });
    const mask = f16.batch["response_mask"]!.data, roll = f16.batch["rollout_log_probs"]!.data;
    let kl = 0, n = 0;
    for (let i = 0; i < mask.length; i++) if (mask[i]) { kl += roll[i]! - lp.logProbs.data[i]!; n++; }
    assert.ok(Math.abs(kl / n) < 1e-3, `rollout_corr/kl ${kl / n}`);
  } finally {
    m.dispose();
  }
});

test("fp8 rollout on the device: the host decoder's fp8 tokens and log-probs, off the float32 ones", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(skipReason);
  const m = loadLlama2c(bin);
  try {
    const batch = leftPadPrompts([ONCE_UPON_A_TIME, [1, 403], [1, 378, 261, 407]], 0);
    const [f32] = await both(m, batch, greedy(32));
    setRolloutQuantization(m, { blockSize: [128, 128], castTo: "f32" });
    const [gpu, host] = await both(m, batch, greedy(32));
    assert.deepEqual(ints(gpu, "responses"), ints(host, "responses"));
    const d = maxDiff(gpu, host, "rollout_log_probs"), md = meanDiff(gpu, host, "rollout_log_probs"), off = meanDiff(host, f32, "rollout_log_probs");
    // rounding activations to e4m3 turns float32-level differences upstream into whole e4m3 steps where
    // a value sits at a rounding boundary, so the two decoders agree to a fraction of fp8's own effect
    assert.ok(md < 0.2 * off && d < 0.1, `fp8 log-prob disagreement: max ${d}, mean ${md} (fp8 vs float32: mean ${off})`);
    assert.ok(maxDiff(gpu, f32, "rollout_log_probs") > 1e-3, "the fp8 weights change the rollout's log-probs");
    setRolloutQuantization(m, undefined);
    const [back] = await both(m, batch, greedy(32));
    assert.deepEqual(ints(back, "responses"), ints(f32, "responses"));
    assert.equal(maxDiff(back, f32, "rollout_log_probs"), 0);
  } finally {
    setRolloutQuantization(m, undefined);
    m.dispose();
  }
});
