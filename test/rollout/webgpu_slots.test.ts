// The WebGPU decoder's per-request entry point (WebGpuSlotDecoder) behind the continuous-batching
// server of agent loops, against the host decoder's server: same greedy tokens and log-probs for
// staggered requests of different lengths, and a conversation's cache reused at its next turn.
// Sampling on the device (issue 24): the server gets ids and log-probs back, never logits; greedy
// equal to the host server on stories260K, log-probs equal to the trainer's recomputation, the
// per-row sampler's distribution (chi-square on a small vocabulary), seeded streams independent
// of the batch, the f16 KV cache (and, where there are tensor cores, f16 weights) as the batch
// decoder's, and live tensors flat across steps.
// Runs where a WebGPU adapter exists (the H200, or Dawn's OpenGL backend on llvmpipe here:
// docs/gpu.md, "Testing WebGPU code without a GPU"); skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { initModel, makeConfig, type LlamaModel } from "../../src/models/index.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";
import type { TokenOutput } from "../../src/agent_loop/server.js";
import { webGpuSlotDecoder, webGpuSlotDecoderFactory, WebGpuDecoder, WebGpuSlotDecoder, type WebGpuSlotOptions } from "../../src/rollout/webgpu_decoder.js";
import type { SlotDecoderFactory } from "../../src/rollout/decoder.js";
import { SamplerProgram, type GpuProgram, type SamplerSettings } from "../../src/rollout/webgpu_programs.js";
import { computeLogProb, defaultSamplingParams, leftPadPrompts } from "../../src/rollout/index.js";
import { PackedMatrix, tensorCoreSupport } from "../../src/engine/webgpu_kernels.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { DataProto } from "../../src/protocol/data_proto.js";
import { tensor } from "../../src/protocol/tensor.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, STORIES_MISSING, ONCE_UPON_A_TIME } from "../models/stories.js";

let reason: string | undefined;
async function webgpu(): Promise<boolean> {
  if (reason !== undefined) return reason === "";
  try {
    await initBackend("webgpu");
    reason = "";
  } catch (e) {
    reason = `no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`;
  }
  return reason === "";
}

const greedy = { temperature: 0, topP: 1, topK: -1, logprobs: true };

function randomModel(): LlamaModel {
  const m = initModel(makeConfig({ vocabSize: 48, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 96, attentionBias: true, tieWordEmbeddings: false }), new Rng(3));
  tf.tidy(() => { for (const v of m.params.values()) if (!v.name.includes("norm")) v.assign(v.mul(15)); });
  return m;
}

/** Staggered requests (each joins a few steps after the previous), then a second turn of the last one. */
async function conversation(server: ContinuousBatchingServer, prompts: number[][]): Promise<TokenOutput[]> {
  const outs = await Promise.all(prompts.map(async (p, i) => {
    for (let k = 0; k < i; k++) await new Promise((r) => setImmediate(r));
    return server.generate(`r${i}`, p, { ...greedy, maxTokens: 16 });
  }));
  const last = prompts.length - 1;
  const turn2 = [...prompts[last]!, ...outs[last]!.tokenIds, 7, 8, 9];
  outs.push(await server.generate(`r${last}`, turn2, { ...greedy, maxTokens: 16 }));
  return outs;
}

test("off the WebGPU backend the slot decoder says which backend it needs", async () => {
  await initBackend("cpu");
  const m = randomModel();
  try {
    assert.throws(() => new WebGpuSlotDecoder(m, 2, 32), /rollout engine 'webgpu' decodes on the WebGPU backend \(trainer\.device=webgpu\); this thread's backend is 'cpu'/);
  } finally {
    m.dispose();
  }
});

test("the batching server on WebGPU slots gives the host server's greedy tokens and log-probs, and reuses a turn's cache", async (t) => {
  if (!(await webgpu())) return t.skip(reason);
  const model = randomModel();
  try {
    const rng = new Rng(5);
    const prompts = Array.from({ length: 5 }, (_, i) => Array.from({ length: 3 + 4 * i }, () => 3 + rng.int(45)));
    const opts = { maxNumSeqs: 3, maxModelLen: 96, eosTokenIds: [2], rng: new Rng(0) };
    const gpuServer = new ContinuousBatchingServer(model, { ...opts, decoder: webGpuSlotDecoder, prefillChunk: 5 });
    const gpu = await conversation(gpuServer, prompts);
    const st = gpuServer.stats();
    await gpuServer.sleep();
    const hostServer = new ContinuousBatchingServer(model, opts);
    await hostServer.wakeUp();
    const host = await conversation(hostServer, prompts);
    await hostServer.sleep();
    assert.deepEqual(gpu.map((o) => o.tokenIds), host.map((o) => o.tokenIds));
    let d = 0;
    gpu.forEach((o, i) => o.logProbs!.forEach((lp, j) => { d = Math.max(d, Math.abs(lp - host[i]!.logProbs![j]!)); }));
    assert.ok(d < 1e-3, `log-prob disagreement ${d}`);
    assert.ok(st.maxBatch > 1, `requests shared decode steps (max batch ${st.maxBatch})`);
    assert.ok(st.reusedTokens >= prompts.at(-1)!.length, `the second turn reused the first turn's cache (${st.reusedTokens} tokens)`);
  } finally {
    model.dispose();
  }
});

/** Tokens the server fed from the previous step's device ids (pipelined steps), over all deviceOnly decoders. */
let fedOnDevice = 0;

/** The slot decoder with forwardRows refused: the server must sample on the device. */
function deviceOnly(opts: WebGpuSlotOptions = {}): SlotDecoderFactory {
  return (m, slots, maxLen) => {
    const d = new WebGpuSlotDecoder(m, slots, maxLen, opts), sample = d.forwardSample.bind(d);
    d.forwardRows = () => { throw new Error("the logits were read back to the host"); };
    d.forwardSample = (rows, tokens, ...rest) => {
      fedOnDevice += tokens.filter((x) => x < 0).length;
      return sample(rows, tokens, ...rest);
    };
    return d;
  };
}

const STORY_PROMPTS = [ONCE_UPON_A_TIME, [1, 403], [1, 378, 261, 407], [1, 261, 403, 407, 378, 261], [1, 500, 301, 280], [1, 410]];

/** prompts + outputs as verl's rollout batch (left-padded prompts, right-padded responses) for the trainer's log-probs. */
function rolloutBatch(prompts: number[][], outs: number[][]): DataProto {
  const B = prompts.length, P = Math.max(...prompts.map((p) => p.length)), R = Math.max(...outs.map((o) => o.length)), L = P + R;
  const ids = new Int32Array(B * L), mask = new Int32Array(B * L), pos = new Int32Array(B * L), resp = new Int32Array(B * R);
  prompts.forEach((p, b) => {
    const seq = [...p, ...outs[b]!], off = P - p.length;
    seq.forEach((t, i) => { ids[b * L + off + i] = t; mask[b * L + off + i] = 1; pos[b * L + off + i] = i; });
    outs[b]!.forEach((t, j) => { resp[b * R + j] = t; });
  });
  return new DataProto({
    input_ids: tensor(ids, [B, L], "int32"), attention_mask: tensor(mask, [B, L], "int32"),
    position_ids: tensor(pos, [B, L], "int32"), responses: tensor(resp, [B, R], "int32"),
  });
}

async function serve(model: LlamaModel, decoder: SlotDecoderFactory | undefined, prompts: number[][], params: object, seeds?: number[], pipelineDeviceSteps = true): Promise<TokenOutput[]> {
  const server = new ContinuousBatchingServer(model, { maxNumSeqs: 4, maxModelLen: 64, eosTokenIds: [2], rng: new Rng(0), decoder, prefillChunk: 3, pipelineDeviceSteps });
  if (!decoder) await server.wakeUp();
  try {
    return await Promise.all(prompts.map((p, i) => server.generate(`r${i}`, p, { temperature: 0, topP: 1, topK: -1, logprobs: true, maxTokens: 24, ...params, seed: seeds?.[i] })));
  } finally {
    await server.sleep();
  }
}

test("stories260K: pipelined device steps with stop ids, staggered joins and second turns: the host server's tokens; live tensors flat", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(reason);
  const m = loadLlama2c(bin);
  try {
    // stop ids that the greedy continuations reach after a few tokens, so requests leave mid-pipeline
    const free = await serve(m, deviceOnly(), STORY_PROMPTS, {});
    const stopIds = [free[0]!.tokenIds[5]!, free[2]!.tokenIds[9]!];
    const run = async (server: ContinuousBatchingServer) => {
      const first = await Promise.all(STORY_PROMPTS.map(async (p, i) => {
        for (let k = 0; k < 2 * i; k++) await new Promise((r) => setImmediate(r));
        return server.generate(`r${i}`, p, { ...greedy, maxTokens: 5 + 3 * i, stopTokenIds: stopIds });
      }));
      const second = await Promise.all(STORY_PROMPTS.map((p, i) => server.generate(`s${i}`, [...p, ...first[i]!.tokenIds, 261, 403], { ...greedy, maxTokens: 12, stopTokenIds: stopIds })));
      return [...first, ...second];
    };
    const opts = { maxNumSeqs: 4, maxModelLen: 64, eosTokenIds: [2], rng: new Rng(0), prefillChunk: 4 };
    const gpuServer = new ContinuousBatchingServer(m, { ...opts, decoder: deviceOnly() });
    const gpu = await run(gpuServer);
    const live = tf.memory().numTensors;
    const again = await run(gpuServer);
    assert.equal(tf.memory().numTensors, live, "a second round on the same slots leaves no tensor behind");
    const st = gpuServer.stats();
    await gpuServer.sleep();
    const hostServer = new ContinuousBatchingServer(m, opts);
    await hostServer.wakeUp();
    const host = await run(hostServer);
    await hostServer.sleep();
    assert.deepEqual(gpu.map((o) => o.tokenIds), host.map((o) => o.tokenIds));
    assert.deepEqual(again.map((o) => o.tokenIds), host.map((o) => o.tokenIds));
    assert.deepEqual(gpu.map((o) => o.finishReason), host.map((o) => o.finishReason));
    assert.ok(gpu.some((o, i) => o.finishReason === "stop" && o.tokenIds.length < (i < STORY_PROMPTS.length ? 5 + 3 * i : 12)), "some request stopped on a stop id before its limit");
    assert.ok(st.reusedTokens > 0 && st.maxBatch > 1, `turns reused their caches (${st.reusedTokens}) and shared steps (max batch ${st.maxBatch})`);
  } finally {
    m.dispose();
  }
});

test("stories260K: device sampling on the slots gives the host server's greedy tokens, never reading logits back", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(reason);
  const m = loadLlama2c(bin);
  try {
    const gpu = await serve(m, deviceOnly(), STORY_PROMPTS, {});
    const host = await serve(m, undefined, STORY_PROMPTS, {});
    assert.deepEqual(gpu.map((o) => o.tokenIds), host.map((o) => o.tokenIds));
    let d = 0;
    gpu.forEach((o, i) => o.logProbs!.forEach((lp, j) => { d = Math.max(d, Math.abs(lp - host[i]!.logProbs![j]!)); }));
    assert.ok(d < 1e-3, `log-prob disagreement ${d}`);
  } finally {
    m.dispose();
  }
});

test("stories260K: sampled on the device, the log-probs are the trainer's; a seed gives the same tokens whatever shares the steps", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(reason);
  const m = loadLlama2c(bin);
  try {
    const T = 0.8, params = { temperature: T, topK: 50, topP: 0.9 }, seeds = STORY_PROMPTS.map((_, i) => 100 + i);
    const fed = fedOnDevice;
    const a = await serve(m, deviceOnly(), STORY_PROMPTS, params, seeds);
    assert.ok(fedOnDevice > fed, "steps were queued before the previous one was read back");
    // each step read back before the next is queued: the same draws
    const serial = await serve(m, deviceOnly(), STORY_PROMPTS, params, seeds, false);
    assert.deepEqual(serial.map((o) => o.tokenIds), a.map((o) => o.tokenIds));
    // the same requests one at a time (other batches, other rows): the same draws
    const alone: TokenOutput[] = [];
    for (let i = STORY_PROMPTS.length - 1; i >= 0; i--) alone[i] = (await serve(m, deviceOnly(), [STORY_PROMPTS[i]!], params, [seeds[i]!]))[0]!;
    assert.deepEqual(alone.map((o) => o.tokenIds), a.map((o) => o.tokenIds));
    const other = await serve(m, deviceOnly(), STORY_PROMPTS, params, seeds.map((s) => s + 1000));
    assert.notDeepEqual(other.map((o) => o.tokenIds), a.map((o) => o.tokenIds));
    const greedy = await serve(m, deviceOnly(), STORY_PROMPTS, {});
    assert.notDeepEqual(a.map((o) => o.tokenIds), greedy.map((o) => o.tokenIds), "temperature sampling differs from greedy");
    // the trainer's recomputation (compute_log_prob at the rollout temperature) of the sampled tokens
    const lp = await computeLogProb(m, rolloutBatch(STORY_PROMPTS, a.map((o) => o.tokenIds)), { microBatchSize: 8, temperature: T });
    const R = Math.max(...a.map((o) => o.tokenIds.length));
    let d = 0;
    a.forEach((o, b) => o.logProbs!.forEach((x, j) => { d = Math.max(d, Math.abs(x - lp.logProbs.data[b * R + j]!)); }));
    assert.ok(d < 1e-3, `log-prob disagreement with the trainer ${d}`);
  } finally {
    m.dispose();
  }
});

/** The per-row sampler run directly on logits [rows, V]: ids and log-probs. */
async function sampleRows(logits: tf.Tensor2D, settings: SamplerSettings[]): Promise<{ ids: Int32Array; logProbs: Float32Array }> {
  const R = settings.length, V = logits.shape[1];
  const st = tf.tensor1d(SamplerProgram.rowSettings(settings), "int32");
  const backend = tf.backend() as unknown as { runWebGPUProgram(p: GpuProgram, i: tf.TensorInfo[], d: string, u: unknown[]): tf.TensorInfo };
  const out = tf.engine().makeTensorFromTensorInfo(backend.runWebGPUProgram(new SamplerProgram(V, R, true), [logits, st], "int32", [{ type: "int32", data: [R] }]));
  const v = (await out.data()) as Int32Array;
  tf.dispose([st, out]);
  return { ids: v.slice(0, R), logProbs: new Float32Array(v.slice(R).buffer) };
}

/** softmax(z / T) restricted to the top-k, then the shortest most-likely prefix holding top_p of what is left (TokenSampler's rule). */
function expected(z: number[], T: number, topK: number, topP: number): number[] {
  const order = z.map((_, i) => i).sort((a, b) => z[b]! - z[a]!), keep = order.slice(0, topK > 0 ? topK : z.length);
  const w = z.map((v) => Math.exp((v - z[order[0]!]!) / T)), mass = keep.reduce((s, i) => s + w[i]!, 0);
  const out = new Array<number>(z.length).fill(0);
  let acc = 0;
  for (const i of keep) {
    if (acc >= topP * mass) break;
    out[i] = w[i]!;
    acc += w[i]!;
  }
  const tot = out.reduce((s, x) => s + x, 0);
  return out.map((x) => x / tot);
}

test("the per-row device sampler draws from softmax(z / T) within top-k and top-p (chi-square, 8 tokens), each row with its own settings", async (t) => {
  if (!(await webgpu())) return t.skip(reason);
  const z = [1.1, 2.0, -0.5, 1.5, 0.3, -3.0, 0.0, 1.2], V = z.length, n = 6000;
  const cases = [{ T: 0.7, topK: -1, topP: 1 }, { T: 1.3, topK: 5, topP: 1 }, { T: 1, topK: -1, topP: 0.8 }, { T: 0.9, topK: 6, topP: 0.85 }];
  const logits = tf.tidy(() => tf.tile(tf.tensor2d(z, [1, V]), [cases.length * n + 1, 1]) as tf.Tensor2D);
  try {
    // every case in one call, rows interleaved, plus a greedy row: settings are per row
    const settings: SamplerSettings[] = [];
    for (let j = 0; j < n; j++) cases.forEach((c, k) => settings.push({ invT: 1 / c.T, topK: c.topK, topP: c.topP, greedy: false, seed: 7 + k, step: j }));
    settings.push({ invT: 1, topK: -1, topP: 1, greedy: true, seed: 0, step: 0 });
    const { ids, logProbs } = await sampleRows(logits, settings);
    const G = cases.length * n;
    assert.equal(ids[G], 1, "the greedy row takes the largest logit");
    const logZ1 = Math.log(z.reduce((s, v) => s + Math.exp(v), 0));
    assert.ok(Math.abs(logProbs[G]! - (z[1]! - logZ1)) < 1e-5, `greedy log-prob ${logProbs[G]} (log-softmax at T = 1)`);
    cases.forEach((c, k) => {
      const p = expected(z, c.T, c.topK, c.topP), counts = new Array<number>(V).fill(0);
      const logZ = Math.log(z.reduce((s, v) => s + Math.exp(v / c.T), 0));
      for (let j = 0; j < n; j++) {
        const r = j * cases.length + k, tok = ids[r]!;
        counts[tok]!++;
        assert.ok(Math.abs(logProbs[r]! - (z[tok]! / c.T - logZ)) < 1e-5, "the log-prob is log softmax(z / T) of the drawn token");
      }
      let chi2 = 0, df = -1;
      p.forEach((q, i) => {
        if (q === 0) assert.equal(counts[i], 0, `${JSON.stringify(c)}: token ${i} is cut off but was drawn ${counts[i]} times`);
        else { chi2 += (counts[i]! - n * q) ** 2 / (n * q); df++; }
      });
      // the 0.999 quantile of chi-square with df <= 7 is at most 24.3 (fixed seeds: the outcome does not vary between runs)
      assert.ok(chi2 < 24.3, `${JSON.stringify(c)}: chi-square ${chi2.toFixed(1)} with ${df} degrees of freedom; counts ${counts}, expected ${p.map((q) => (q * n).toFixed(0))}`);
    });
    // a row's draw depends on its (seed, step) only: the same settings in reverse row order draw the same tokens
    const back = await sampleRows(logits, settings.slice().reverse());
    assert.deepEqual(Array.from(back.ids).reverse(), Array.from(ids));
  } finally {
    logits.dispose();
  }
});

/** The batch decoder's greedy tokens (each row's up to its stop) and log-probs for STORY_PROMPTS. */
async function batchGreedy(m: LlamaModel, opts: ConstructorParameters<typeof WebGpuDecoder>[0]): Promise<{ want: number[][]; logProbs: number[][] }> {
  const R = 24, params = defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true });
  const out = await new WebGpuDecoder({ ...opts, sharePrefixes: false }).generate(m, leftPadPrompts(STORY_PROMPTS, 0), params, new Rng(0));
  const resp = out.batch["responses"]!.data, mask = out.batch["response_mask"]!.data, lp = out.batch["rollout_log_probs"]!.data;
  const rowOf = (a: ArrayLike<number>, b: number) => Array.from(a).slice(b * R, b * R + R).filter((_, j) => mask[b * R + j]);
  return { want: STORY_PROMPTS.map((_, b) => rowOf(resp, b)), logProbs: STORY_PROMPTS.map((_, b) => rowOf(lp, b)) };
}

test("stories260K: the slots' f16 KV cache decodes as the batch decoder's f16 cache; live tensors flat across steps", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(reason);
  const m = loadLlama2c(bin);
  try {
    const { want, logProbs } = await batchGreedy(m, { kvCache: "f16" });
    const slots = await serve(m, deviceOnly({ kvCache: "f16" }), STORY_PROMPTS, {});
    assert.deepEqual(slots.map((o) => o.tokenIds), want);
    let d = 0;
    slots.forEach((o, b) => o.logProbs!.forEach((x, j) => { d = Math.max(d, Math.abs(x - logProbs[b]![j]!)); }));
    assert.ok(d < 1e-3, `log-prob disagreement with the batch decoder ${d}`);
    // a decoder kept across many device-sampled steps holds no more tensors than after its first
    const dec = new WebGpuSlotDecoder(m, 4, 64, { kvCache: "f16" });
    try {
      const rows = Int32Array.of(0, 1, 2, 3), step = async (t0: number) => {
        const col = Int32Array.from(rows, () => t0);
        const s = dec.forwardSample(rows, Int32Array.of(1, 403, 407, 261), col, col, 1, Array.from(rows, (r) => ({ temperature: 1, topK: 20, topP: 0.9, doSample: true, seed: r, step: t0 })))!;
        await s.result;
        s.dispose();
      };
      await step(0);
      const live = tf.memory().numTensors;
      for (let t0 = 1; t0 < 40; t0++) await step(t0);
      assert.equal(tf.memory().numTensors, live);
    } finally {
      dec.dispose();
    }
  } finally {
    m.dispose();
  }
});

test("16-bit products on the slots (rollout.dtype=bf16/fp16): the batch decoder's f16 tokens, weights packed once", async (t) => {
  if (!(await webgpu())) return t.skip(reason);
  if (!tensorCoreSupport.available) {
    // no tensor cores here: the slot decoder refuses 16-bit as the batch decoder does
    const m = randomModel();
    try {
      assert.throws(() => new WebGpuSlotDecoder(m, 2, 32, { precision: "bf16" }), /rollout engine 'webgpu': bf16 products need the tensor-core kernel, which this adapter cannot run/);
    } finally {
      m.dispose();
    }
    return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason}); the refusal was checked`);
  }
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const m = loadLlama2c(bin);
  try {
    const { want } = await batchGreedy(m, { precision: "f16" });
    const packs = PackedMatrix.packs;
    const slots = await serve(m, deviceOnly({ precision: "f16" }), STORY_PROMPTS, {});
    assert.equal(PackedMatrix.packs, packs, "the slot decoder reuses the packed weights of the unchanged model");
    assert.deepEqual(slots.map((o) => o.tokenIds), want);
  } finally {
    m.dispose();
  }
});

test("stories260K: abort while device steps are queued; the slots then serve as a fresh host server", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  if (!(await webgpu())) return t.skip(reason);
  const m = loadLlama2c(bin);
  try {
    const opts = { maxNumSeqs: 2, maxModelLen: 64, eosTokenIds: [], rng: new Rng(0) };
    const server = new ContinuousBatchingServer(m, { ...opts, decoder: deviceOnly() });
    const reqs = STORY_PROMPTS.slice(0, 3).map((p, i) => server.generate(`a${i}`, p, { ...greedy, maxTokens: 40 }));
    while (server.stats().decodeSteps < 3) await new Promise((r) => setTimeout(r, 5));
    server.abort();
    for (const r of reqs) await assert.rejects(r, { name: "RequestAbortedError" });
    // prompts extending the aborted ones reuse their parked slots
    const prompts = [[...STORY_PROMPTS[0]!, 261, 403], [...STORY_PROMPTS[1]!, 407]];
    const after = await Promise.all(prompts.map((p, i) => server.generate(`b${i}`, p, { ...greedy, maxTokens: 12 })));
    assert.ok(server.stats().reusedTokens > 0, "the aborted requests' caches were reused");
    await server.sleep();
    const host = new ContinuousBatchingServer(m, opts);
    await host.wakeUp();
    const fresh = await Promise.all(prompts.map((p, i) => host.generate(`c${i}`, p, { ...greedy, maxTokens: 12 })));
    await host.sleep();
    assert.deepEqual(after.map((o) => o.tokenIds), fresh.map((o) => o.tokenIds));
  } finally {
    m.dispose();
  }
});
