// Issue 17 on the GPU, in one process: the WebGPU rollout engine (src/rollout/webgpu_decoder.ts)
// against the host decoder, and a profile of the actor update at the 0.5B shape.
//   bash scripts/gpu-run.sh node dist/bench/gpu_decode.js [--only adapter,correct,decode,update] [--vocab 512,32000]
//     [--prompts 64] [--n 8] [--new 256] [--updates 16x16,16x16xhost,64x16] [--submit 15,1000] [--budget-s 240]
//     [--only slots --slot-rows 64 --slot-sampling device,serial,host]  (the agent loops' slot path, issue 24)
//     [--only decode,noreplay]  (the decode also with every step recorded through tfjs, no replay)
//     [--only decode,perhead]  (the decode also with one attention workgroup a query head, as before 2026-12-06)
//     [--tiles 1x1x2x4+nosplit,1x1x2x4+s512:512,1x1x2x4+p+b]  (more decode runs with other product tiles:
//                            sgMxsgNxtmxtn, +p register prefetch, +b baked strides, +u2/+u4 K unrolled, +s<workgroups>:<min K> split-K targets, +nosplit;
//                            or products' own tiles, the rest default: gate_up=1x1x4x4+p/down_proj=1x1x2x4+b, products
//                            qkv, o_proj, gate_up, down_proj, lm_head)
//     [--cpu-profile DIR]  (the update part: a V8 CPU profile of each steady update, for bench/profile_summary.ts)
//     [--repeat 10]  (the update part: steady updates timed after the first, ms_next their median)
//     [--profile-step 128]  (the decode part times each dispatch of that replayed step; VERL_DAWN_FLAGS needs
//                            disable-dawn-features=timestamp_quantization for sub-microsecond times)
// (after scripts/gpu-bundle.sh; the device tool carries .gpu and .gl). Runs on any backend with an
// adapter, e.g. here on llvmpipe with small sizes. One JSON line per measurement; each part is
// caught on its own, so one failure never loses the others' figures.
import inspector from "node:inspector";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { makeConfig, numParams, type ModelConfig } from "../src/models/config.js";
import type { LlamaModel } from "../src/models/llama.js";
import { loadLlama2c } from "../src/models/llama2c.js";
import { DataProto } from "../src/protocol/index.js";
import { readParamsForDecode } from "../src/rollout/decode_weights.js";
import { generate } from "../src/rollout/generate.js";
import { computeLogProb } from "../src/rollout/index.js";
import { defaultSamplingParams } from "../src/rollout/sampling.js";
import { leftPadPrompts } from "../src/rollout/prompts.js";
import { DECODE_TILE, WebGpuDecoder, WebGpuSlotDecoder, type DecodeProduct, type ProductTiles, type WebGpuDecodeOptions } from "../src/rollout/webgpu_decoder.js";
import type { DispatchTime } from "../src/engine/webgpu_replay.js";
import type { SlotDecoderFactory } from "../src/rollout/decoder.js";
import { ContinuousBatchingServer } from "../src/agent_loop/batching_server.js";
import { sharedPath } from "../src/utils/paths.js";
import { Rng } from "../src/utils/rng.js";
import { LoraAdapter } from "../src/models/lora.js";
import { bindGroupStats } from "../src/engine/bind_group_cache.js";
import { uniformCacheStats } from "../src/engine/uniform_cache.js";
import { freePoolStats } from "../src/engine/webgpu_buffer_pool.js";
import { buildActor, DeviceStep, deviceModel, qwenHalfB, rolloutBatch, sync } from "./gpu.js";
import { matmulPrecision, parsePrecision, setMatmulPrecision, tensorCoreStats, tensorCoreSupport, type MatmulPrecision } from "../src/engine/webgpu_kernels.js";
import { webGpuSummary } from "../src/engine/webgpu.js";
import { DEFAULT_DIRECT_TILE, type DirectTile } from "../src/engine/webgpu_gemm.js";

/** A --tiles entry: sgMxsgNxtmxtn, then +p (prefetch), +b (baked strides), +u2 / +u4 (K unrolled), +s<workgroups>:<min K> (split-K targets) or +nosplit. */
function parseDecodeTile(spec: string): DirectTile {
  const [shape, ...flags] = spec.split("+");
  const [sgM, sgN, tm, tn] = shape!.split("x").map(Number);
  if (![sgM, sgN, tm, tn].every((x) => Number.isInteger(x) && x! > 0)) throw new Error(`--tiles ${spec}: expected sgMxsgNxtmxtn, e.g. 1x1x2x4`);
  const t: DirectTile = { ...DECODE_TILE, sgM: sgM!, sgN: sgN!, tm: tm!, tn: tn! };
  for (const f of flags) {
    if (f === "p") t.prefetch = true;
    else if (f === "b") t.baked = true;
    else if (/^u[124]$/.test(f)) t.unroll = Number(f.slice(1)) as DirectTile["unroll"];
    else if (f === "nosplit") { t.splitK = false; delete t.splitTargets; }
    else if (/^s\d+:\d+$/.test(f)) { const [w, c] = f.slice(1).split(":").map(Number); t.splitK = true; t.splitTargets = { workgroups: w!, minChunk: c! }; }
    else throw new Error(`--tiles ${spec}: unknown flag +${f} (p, b, u2, u4, nosplit, s<workgroups>:<min K>)`);
  }
  return t;
}

const PRODUCTS: readonly DecodeProduct[] = ["qkv", "o_proj", "gate_up", "down_proj", "lm_head"];

/**
 * A --tiles entry: one tile for every product (sgMxsgNxtmxtn[+flags]), or products' own tiles
 * with the others at their defaults (gate_up=1x1x4x4+p/down_proj=1x1x2x4+b).
 */
function parseDecodeTiles(spec: string): Pick<WebGpuDecodeOptions, "tile" | "productTiles"> {
  if (!spec.includes("=")) return { tile: parseDecodeTile(spec) };
  const productTiles: ProductTiles = {};
  for (const part of spec.split("/")) {
    const [name, tile] = part.split("=");
    if (!PRODUCTS.includes(name as DecodeProduct) || !tile) throw new Error(`--tiles ${spec}: expected product=tile with product one of ${PRODUCTS.join(", ")}`);
    productTiles[name as DecodeProduct] = parseDecodeTile(tile);
  }
  return { productTiles };
}

/** Runs fn with 16-bit matrix products asked for (or not); an adapter without tensor cores is reported. */
async function withPrecision(p: MatmulPrecision, fn: () => Promise<void>, opts: Parameters<typeof setMatmulPrecision>[1] = {}): Promise<void> {
  if (!setMatmulPrecision(p, opts)) { emit(`precision_${p}`, {}, { skipped: "no tensor-core kernel on this backend/adapter" }); return; }
  try { await fn(); } finally { setMatmulPrecision("f32"); }
}

interface Args {
  only: Set<string>; vocab: number[]; prompts: number; n: number; newTokens: number;
  budgetS: number; model?: string; layers: number; updates: string[]; submitBatches: number[];
  /** matrix-product precisions to run the update and decode parts at (f16/bf16: the tensor-core kernel) */
  precisions: MatmulPrecision[];
  /** extra tensor-core tiles (sgMxsgNxtmxtn) for the decoder's 16-bit products, each one more decode run */
  tiles: string[];
  /** slot path: concurrent requests, and where they sample (device: forwardSample, pipelined; serial: unpipelined; host: logits read back) */
  slotRows: number; slotSampling: string[];
  /** the update part with LoRA adapters of this rank on every linear module (0: full fine-tuning; "0,32": both, one after the other) */
  lora: number[];
  /**
   * Dawn's null backend (VERL_DAWN_FLAGS=backend=null,...) has the tensor-core features but no
   * subgroup-matrix configs: this takes the tensor-core path there anyway, so the update's host
   * side (recording, dispatch count) can be profiled without a GPU. Nothing runs: figures are host time only.
   */
  assumeTensorCores: boolean;
  /** the decode part times every dispatch of this replayed step on the device (timestamp queries) */
  profileStep?: number;
  /** the update part writes a V8 CPU profile of each steady (second timed) update into this folder (bench/profile_summary.ts reads it) */
  cpuProfile?: string;
  /** Steady updates timed after the first (their median is ms_next): more samples for --cpu-profile. */
  repeat?: number;
}

function parseArgs(argv: string[]): Args {
  const a: Args = {
    only: new Set(["adapter", "correct", "decode", "update", "untransposed", "device-step"]), vocab: [512, 32000], prompts: 64, n: 8, newTokens: 256,
    budgetS: 240, layers: 24, updates: ["16x16", "16x16xhost", "16x4", "64x16", "64x64"], submitBatches: [15, 1000], precisions: ["f32"], tiles: [],
    slotRows: 64, slotSampling: ["device"], lora: [0], assumeTensorCores: false,
  };
  const list = (v: string) => v.split(",").map(Number);
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i], v = argv[i + 1];
    if (v === undefined) throw new Error(`bench/gpu_decode: '${k}' needs a value`);
    if (k === "--only") a.only = new Set(v.split(","));
    else if (k === "--vocab") a.vocab = list(v);
    else if (k === "--prompts") a.prompts = Number(v);
    else if (k === "--n") a.n = Number(v);
    else if (k === "--new") a.newTokens = Number(v);
    else if (k === "--budget-s") a.budgetS = Number(v);
    else if (k === "--model") a.model = v;
    else if (k === "--layers") a.layers = Number(v);
    else if (k === "--updates") a.updates = v.split(",").filter(Boolean); // ROWSxMICRO[xhost]
    else if (k === "--submit") a.submitBatches = list(v).filter((x) => x > 0);
    else if (k === "--tiles") a.tiles = v.split(",").filter(Boolean);
    else if (k === "--slot-rows") a.slotRows = Number(v);
    else if (k === "--slot-sampling") a.slotSampling = v.split(",").filter(Boolean);
    else if (k === "--lora") a.lora = list(v);
    else if (k === "--assume-tensor-cores") a.assumeTensorCores = v === "1";
    else if (k === "--profile-step") a.profileStep = Number(v);
    else if (k === "--cpu-profile") a.cpuProfile = v;
    else if (k === "--repeat") a.repeat = Number(v);
    else if (k === "--precision") a.precisions = v.split(",").map((x) => parsePrecision(x, "--precision"));
    else throw new Error(`bench/gpu_decode: unknown argument '${k}'`);
  }
  return a;
}

const started = performance.now();
const elapsedS = () => (performance.now() - started) / 1e3;
const emit = (name: string, config: object, figures: object) => console.log(JSON.stringify({ name, config, figures, at_s: +elapsedS().toFixed(1) }));

async function part(name: string, fn: () => Promise<void>): Promise<void> {
  try {
    await fn();
  } catch (e) {
    emit(name, {}, { error: (e as Error).stack ?? String(e) });
  }
}


/** Counts what the backend does: program dispatches, queue submits, read-backs and uploads. */
interface Counters { dispatches: number; submits: number; reads: number; readBytes: number; writes: number; writeBytes: number; uploads: number; uploadBytes: number; by_program?: Record<string, number> }
function instrument(): { counters: Counters; reset(): Counters } {
  const be = tf.backend() as unknown as Record<string, unknown> & { queue: Record<string, unknown> };
  const zero = (): Counters => ({ dispatches: 0, submits: 0, reads: 0, readBytes: 0, writes: 0, writeBytes: 0, uploads: 0, uploadBytes: 0 });
  const c = zero();
  /** dispatches by program class (the last reset's window), for VERL_BENCH_PROGRAMS=1 */
  const byProgram = new Map<string, number>();
  const wrap = (obj: Record<string, unknown>, key: string, count: (args: unknown[]) => void) => {
    const orig = obj[key] as (...a: unknown[]) => unknown;
    if (typeof orig !== "function") return;
    obj[key] = function (this: unknown, ...args: unknown[]) { count(args); return orig.apply(this, args); };
  };
  if (tf.getBackend() === "webgpu") {
    wrap(be, "runWebGPUProgram", (a) => { c.dispatches++; const n = (a[0] as object).constructor.name; byProgram.set(n, (byProgram.get(n) ?? 0) + 1); });
    wrap(be, "submitQueue", () => { c.submits++; });
    wrap(be, "getBufferData", (a) => { c.reads++; c.readBytes += (a[0] as { size: number }).size; });
    // host arrays that become GPU buffers (tensor data; uniforms go through writeBuffer)
    const tensorMap = be.tensorMap as { get(id: object): { values?: ArrayBufferView | null; resource?: unknown } | undefined };
    wrap(be, "uploadToGPU", (a) => { const d = tensorMap.get(a[0] as object); if (d?.values && !d.resource) { c.uploads++; c.uploadBytes += d.values.byteLength; } });
    wrap(be.queue, "writeBuffer", (a) => { c.writes++; c.writeBytes += typeof a[4] === "number" ? a[4] : (a[2] as ArrayBufferView).byteLength ?? 0; });
  }
  return {
    counters: c,
    reset: () => {
      const snap: Counters = { ...c };
      if (process.env.VERL_BENCH_PROGRAMS === "1") snap.by_program = Object.fromEntries([...byProgram].sort((x, y) => y[1] - x[1]));
      Object.assign(c, zero());
      byProgram.clear();
      return snap;
    },
  };
}

async function adapterInfo(): Promise<void> {
  const gpu = (globalThis as { navigator?: { gpu?: { requestAdapter(): Promise<{ features: Set<string>; limits: Record<string, number>; info?: Record<string, string> } | null> } } }).navigator?.gpu;
  if (!gpu) { emit("adapter", {}, { skipped: "no navigator.gpu (not the webgpu backend)" }); return; }
  const ad = await gpu.requestAdapter();
  if (!ad) { emit("adapter", {}, { skipped: "no adapter" }); return; }
  const limits: Record<string, number> = {};
  for (const k of ["maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize", "maxComputeInvocationsPerWorkgroup", "maxStorageBuffersPerShaderStage", "maxComputeWorkgroupsPerDimension"]) limits[k] = ad.limits[k]!;
  const info = ad.info ? { vendor: ad.info.vendor, architecture: ad.info.architecture, device: ad.info.device, description: ad.info.description } : {};
  const features = [...ad.features].sort();
  emit("adapter", {}, { info, features, limits, "shader-f16": features.includes("shader-f16"), subgroups: features.includes("subgroups"), subgroup_matrix: features.some((f) => f.includes("subgroup-matrix")) });
}

/** stories260K: the WebGPU engine's greedy tokens and log-probs against the host decoder's. */
async function correctness(modelPath: string): Promise<void> {
  const m = loadLlama2c(modelPath);
  const prompts = [[1, 403, 407, 261, 378], [1, 403], [1, 378, 261, 407], [1, 261, 403, 407, 378, 261], [1, 500, 301, 280], [1, 45, 67, 89, 101, 123, 145], [1, 410], [1, 333, 444]];
  const batch = leftPadPrompts(prompts, 0);
  const params = defaultSamplingParams({ temperature: 0, responseLength: 64, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true });
  const gpu = await new WebGpuDecoder().generate(m, batch, params, new Rng(0));
  await readParamsForDecode(m);
  const host = generate(m, batch, params, new Rng(0));
  const R = 64, g = gpu.batch["responses"]!.data, h = host.batch["responses"]!.data;
  const gm = gpu.batch["response_mask"]!.data, gl = gpu.batch["rollout_log_probs"]!.data, hl = host.batch["rollout_log_probs"]!.data;
  const firstDiff: (number | null)[] = [];
  let same = 0, maxLp = 0;
  for (let b = 0; b < prompts.length; b++) {
    let d: number | null = null;
    for (let t = 0; t < R; t++) if (g[b * R + t] !== h[b * R + t]) { d = t; break; }
    firstDiff.push(d);
    if (d === null) same++;
    for (let t = 0; t < (d ?? R); t++) if (gm[b * R + t]) maxLp = Math.max(maxLp, Math.abs(gl[b * R + t]! - hl[b * R + t]!));
  }
  emit("decode_correctness_stories260K", { prompts: prompts.length, new_tokens: R, greedy: true }, { prompts_identical: same, first_divergence: firstDiff, max_logprob_diff_before_divergence: maxLp });
  m.dispose();
}

/**
 * stories260K: greedy tokens of the 16-bit decoders (rollout.dtype=fp16/bf16) against the f32
 * decoder's for `count` prompts, and the rollout log-probs of greedy and sampled (T = 1) rows
 * against the float32 trainer's recomputation: rollout_corr/kl = mean(rollout - trainer).
 */
async function precisionCheck(modelPath: string, count: number): Promise<void> {
  const m = loadLlama2c(modelPath), R = 64, rng = new Rng(4);
  const batch = leftPadPrompts(Array.from({ length: count }, () => [1, ...Array.from({ length: 1 + rng.int(8) }, () => 3 + rng.int(509))]), 0);
  const greedy = defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true });
  const sampled = { ...greedy, temperature: 1 };
  const ref = await new WebGpuDecoder().generate(m, batch, greedy, new Rng(0));
  const corr = async (out: DataProto) => {
    const lp = (await computeLogProb(m, out, { microBatchSize: 64, temperature: 1 })).logProbs.data;
    const mask = out.batch["response_mask"]!.data, roll = out.batch["rollout_log_probs"]!.data;
    let sum = 0, n = 0, max = 0;
    for (let i = 0; i < mask.length; i++) if (mask[i]) { const d = roll[i]! - lp[i]!; sum += d; n++; max = Math.max(max, Math.abs(d)); }
    return { kl: sum / n, max_abs_logprob_diff: max, tokens: n };
  };
  for (const precision of ["f32", "f16", "bf16"] as const) {
    await part(`precision_${precision}`, async () => {
      const dec = new WebGpuDecoder({ precision });
      const out = precision === "f32" ? ref : await dec.generate(m, batch, greedy, new Rng(0));
      const a = ref.batch["responses"]!.data, b = out.batch["responses"]!.data, firstDiff: number[] = [];
      let same = 0;
      for (let r = 0; r < count; r++) {
        let d = -1;
        for (let t = 0; t < R; t++) if (a[r * R + t] !== b[r * R + t]) { d = t; break; }
        if (d < 0) same++; else firstDiff.push(d);
      }
      const samp = await dec.generate(m, batch, sampled, new Rng(1));
      emit("decode_precision_stories260K", { precision, prompts: count, new_tokens: R },
        { greedy_rows_identical_to_f32: same, first_divergence: firstDiff, greedy_vs_trainer_f32: await corr(out), sampled_vs_trainer_f32: await corr(samp) });
    });
  }
  m.dispose();
}

/** Left-padded random prompts of 16..P tokens. */
function randomPrompts(count: number, P: number, vocab: number, seed: number): DataProto {
  const rng = new Rng(seed);
  return leftPadPrompts(Array.from({ length: count }, () => Array.from({ length: 16 + rng.int(P - 15) }, () => 3 + rng.int(vocab - 3))), 0);
}

async function decode(a: Args, vocab: number, opts: WebGpuDecodeOptions, newTokens: number, label: string): Promise<void> {
  const cfg = qwenHalfB(vocab, a.layers);
  const model = deviceModel(cfg, 1);
  try {
    const prompts = randomPrompts(a.prompts, 32, vocab, 3);
    const dec = new WebGpuDecoder({ ...opts, profileStep: a.profileStep }), ins = instrument();
    const params = defaultSamplingParams({ temperature: 1, topK: -1, topP: 1, responseLength: newTokens, ignoreEos: true, padTokenId: 0, calculateLogProbs: true, n: a.n });
    const w0 = performance.now();
    await dec.generate(model, prompts, { ...params, responseLength: 4 }, new Rng(1)); // shader compilation, weight layout
    const warmMs = performance.now() - w0;
    ins.reset();
    const t0 = performance.now();
    const out = await dec.generate(model, prompts, params, new Rng(2));
    const ms = performance.now() - t0;
    const c = ins.reset(), s = dec.lastStats, rows = a.prompts * a.n;
    const lp = out.batch["rollout_log_probs"]!.data;
    let finite = true;
    for (const x of lp) if (!Number.isFinite(x)) { finite = false; break; }
    emit(`webgpu_decode_${label}`, { params: numParams(cfg), vocab, rows, new_tokens: newTokens, layers: cfg.nLayers, matmul: matmulPrecision(), tensor_core_calls: tensorCoreStats().calls, ...opts }, {
      tokens_per_s: (rows * newTokens) / (ms / 1e3), wall_ms: ms, warmup_ms: warmMs, prefill_ms: s.prefillMs, prefill_rows: s.prefillRows, decode_ms: s.decodeMs,
      ms_per_step: s.decodeMs / Math.max(1, s.steps + 1), record_ms_per_step: s.recordMs / Math.max(1, s.steps), steps: s.steps, read_backs: s.readBacks,
      replay: s.replay, replayed_steps: s.replayed,
      dispatches_per_step: c.dispatches / Math.max(1, s.steps + 1), submits: c.submits, read_bytes: c.readBytes, logprobs_finite: finite,
      decode_tflops: (2 * numParams(cfg) * rows * (s.steps + 1)) / (s.decodeMs / 1e3) / 1e12, numTensors: tf.memory().numTensors,
      ...(s.stepTimes ? stepProfile(s.stepTimes) : {}),
    });
  } finally {
    model.dispose();
  }
}

/**
 * A replayed decode step's device time (--profile-step): the total, and by program; the products by
 * layout and workgroup grid (which tells the product apart: the LM head's grid is the widest).
 */
function stepProfile(times: DispatchTime[]): Record<string, unknown> {
  const by: Record<string, { n: number; ms: number }> = {};
  for (const d of times) {
    const m = /verlDirectGemm_(\w+?)_(\w+?)_u\d+p?(_split)?_(NN|NT|TN|TT)/.exec(d.program);
    const key = m ? `gemm_${m[4]}${m[3] ? "_split" : ""}_${m[1]} grid ${d.groups.join("x")}` : d.program.split(" ")[0]!;
    const e = (by[key] ??= { n: 0, ms: 0 });
    e.n++;
    e.ms += d.ms;
  }
  const sorted = Object.entries(by).sort((x, y) => y[1].ms - x[1].ms).map(([k, v]) => [k, { n: v.n, ms: +v.ms.toFixed(3) }]);
  return { step_device_ms: +times.reduce((s, d) => s + d.ms, 0).toFixed(3), step_dispatches: times.length, step_by_program: Object.fromEntries(sorted) };
}

/**
 * The agent loops' decode path (issue 24): `slotRows` requests at once through the continuous-batching
 * server over WebGpuSlotDecoder at the 0.5B shape, prompts of 16..32 tokens, `newTokens` each (no
 * stop ids), temperature 1 with log-probs. sampling "device": the decoder samples (forwardSample,
 * ids and log-probs read back), each step queued before the previous one is read back; "serial":
 * the same, each step read back first; "host": the logits [rows, vocab] are read back and sampled
 * on the host (the path before issue 24, and the one other engines keep).
 */
async function slots(a: Args, vocab: number, precision: MatmulPrecision, sampling: string): Promise<void> {
  if (!["device", "serial", "host"].includes(sampling)) throw new Error(`bench/gpu_decode: --slot-sampling takes device, serial or host, got '${sampling}'`);
  const cfg = qwenHalfB(vocab, a.layers), rows = a.slotRows, newTokens = a.newTokens;
  const model = deviceModel(cfg, 1);
  const factory: SlotDecoderFactory = (m, n, len) => {
    const d = new WebGpuSlotDecoder(m, n, len, { precision });
    // host: the decoder without forwardSample, so the server reads the logits back
    return sampling !== "host" ? d : { vocabSize: d.vocabSize, forwardRows: d.forwardRows.bind(d), truncateRow: d.truncateRow.bind(d), dispose: d.dispose.bind(d) };
  };
  const server = new ContinuousBatchingServer(model, { maxNumSeqs: rows, maxModelLen: 32 + newTokens, eosTokenIds: [], rng: new Rng(1), decoder: factory, pipelineDeviceSteps: sampling === "device" });
  const prompts = (seed: number) => {
    const rng = new Rng(seed);
    return Array.from({ length: rows }, () => Array.from({ length: 16 + rng.int(17) }, () => 3 + rng.int(vocab - 3)));
  };
  const run = (ps: number[][], maxTokens: number) => Promise.all(ps.map((p, i) => server.generate(`r${i}`, p, { temperature: 1, topK: -1, topP: 1, logprobs: true, maxTokens, stopTokenIds: [], seed: i })));
  try {
    const ins = instrument();
    const w0 = performance.now();
    await run(prompts(11), 4); // shader compilation, weight layout (packing for f16)
    const warmMs = performance.now() - w0;
    const before = server.stats();
    ins.reset();
    const t0 = performance.now();
    const outs = await run(prompts(12), newTokens);
    const ms = performance.now() - t0, c = ins.reset(), st = server.stats();
    const steps = st.decodeSteps - before.decodeSteps, decoded = st.decodeTokens - before.decodeTokens, tokens = outs.reduce((n, o) => n + o.tokenIds.length, 0);
    let finite = true;
    for (const o of outs) for (const x of o.logProbs ?? []) if (!Number.isFinite(x)) finite = false;
    emit(`webgpu_slots_v${vocab}_${precision}_${sampling}`, { params: numParams(cfg), vocab, rows, new_tokens: newTokens, layers: cfg.nLayers, precision, sampling },
      { tokens_per_s: tokens / (ms / 1e3), wall_ms: ms, warmup_ms: warmMs, tokens, decode_steps: steps, decode_tokens: decoded, max_batch: st.maxBatch,
        ms_per_step: ms / Math.max(1, steps), prefill_tokens: st.prefillTokens - before.prefillTokens, read_backs: c.reads, read_bytes_per_step: c.readBytes / Math.max(1, steps),
        dispatches_per_step: c.dispatches / Math.max(1, steps), logprobs_finite: finite, numTensors: tf.memory().numTensors });
  } finally {
    await server.sleep();
    model.dispose();
  }
}

/**
 * The actor update at the 0.5B shape through DataParallelPPOActor.updatePolicy (the worker's
 * path): wall time, dispatches, submits, read-backs and uploads, per rows x micro-batch size,
 * with the optimizer step on the device (one rank, the default on WebGPU) or through the host
 * (flat gradient read back, clipped and re-uploaded: what every rank count did before), and
 * per submit batch; and the all-on-device DeviceStep of bench/gpu.ts for comparison.
 */
/** One worker-path update of `spec` (ROWSxMICRO[xhost]) on `model` as it is (with an adapter of rank `rank` when > 0), timed after a warm-up. */
async function updateOnce(a: Args, model: LlamaModel, ins: ReturnType<typeof instrument>, spec: string, rank: number): Promise<void> {
  const cfg = model.config, P = 32, R = 64;
  const [B, micro, where] = spec.split("x") as [string, string, string?];
  const rows = Number(B), mb = Number(micro), onDevice = where !== "host", tokens = rows * (P + R), flop = 6 * numParams(cfg) * tokens;
  const fig = (ms: number, c: Counters) => ({ ms, tokens_per_s: tokens / (ms / 1e3), tflops: flop / (ms / 1e3) / 1e12, ...c });
  const data = rolloutBatch(rows, P, R, cfg.vocabSize, 7);
  const actor = buildActor(model, rows, mb, 1e-4, [], onDevice);
  const f0 = performance.now();
  data.batch.old_log_probs = (await actor.computeLogProb(data, { microBatchSize: mb, maxTokenLen: null }, 1.0, false)).logProbs;
  const fwdMs = performance.now() - f0, fwd = ins.reset();
  await actor.updatePolicy(data); // warm-up: shader compilation, optimizer state
  ins.reset();
  const bg0 = bindGroupStats(), uc0 = uniformCacheStats();
  const t0 = performance.now();
  await actor.updatePolicy(data);
  const ms = performance.now() - t0;
  // bind groups found again / made, uniform blocks found / written, over the timed update
  const delta = <T extends object>(a: T | undefined, b: T | undefined) => (a && b ? Object.fromEntries(Object.entries(b).map(([k, v]) => [k, (v as number) - ((a as Record<string, number>)[k] ?? 0)])) : undefined);
  const pool = () => ({ ...freePoolStats((tf.backend() as unknown as { bufferManager: object }).bufferManager) });
  const churn = (p: ReturnType<typeof pool>) => ({ trims: p.trims ?? 0, bytesDestroyed: p.bytesDestroyed ?? 0, created: p.created ?? 0, bytesCreated: p.bytesCreated ?? 0 });
  const host = { bind_groups: delta(bg0, bindGroupStats()), uniforms: delta(uc0, uniformCacheStats()), pool: pool() };
  const counted = ins.reset();
  // a second timed update: a loop's steady state (uniform blocks are kept from their second sight,
  // so the first timed update still makes bind groups for them)
  const profiler = a.cpuProfile ? await startCpuProfile() : undefined;
  const bg1 = bindGroupStats(), pool1 = pool(), repeat = Math.max(1, a.repeat ?? 1), nextMs: number[] = [];
  for (let i = 0; i < repeat; i++) {
    const t1 = performance.now();
    await actor.updatePolicy(data);
    nextMs.push(performance.now() - t1);
  }
  const msNext = [...nextMs].sort((x, y) => x - y)[Math.floor(repeat / 2)]!;
  if (profiler) await profiler.stop(join(a.cpuProfile!, `update_lora${rank}_${spec}.cpuprofile`));
  const again = { ms_next: msNext, ...(repeat > 1 ? { ms_next_all: nextMs } : {}), dispatches_next: ins.reset().dispatches / repeat, bind_groups_next: delta(bg1, bindGroupStats()), pool_next: pool(),
    // the buffer pool's churn over the steady updates alone (pool_next counts from the pool's start)
    pool_churn_next: delta(churn(pool1), churn(pool())) };
  emit("update_0.5B_worker_path", { B: rows, P, R, micro: mb, lora_rank: rank, host_only: a.assumeTensorCores, optimizer: onDevice ? "device" : "host", params: numParams(cfg), matmul: matmulPrecision(), tensor_core_calls: tensorCoreStats().calls, submit_batch: tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE") },
    { ...fig(ms, counted), ...host, ...again, forward_only_ms: fwdMs, forward_tflops: flop / 3 / (fwdMs / 1e3) / 1e12, forward_dispatches: fwd.dispatches, forward_reads: fwd.reads, ...(fwd.by_program ? { forward_by_program: fwd.by_program } : {}) });
  actor.optimizer?.dispose();
}

/** V8's sampling profiler on this thread from now until stop(file) (100 us samples), for a steady update's host time. */
async function startCpuProfile(): Promise<{ stop(file: string): Promise<void> }> {
  const session = new inspector.Session();
  session.connect();
  const post = <T>(method: string, params: object = {}) => new Promise<T>((res, rej) => session.post(method, params, (e, v) => (e ? rej(e) : res(v as T))));
  await post("Profiler.enable");
  await post("Profiler.setSamplingInterval", { interval: 100 });
  await post("Profiler.start");
  return {
    async stop(file: string) {
      const { profile } = await post<{ profile: object }>("Profiler.stop");
      session.disconnect();
      mkdirSync(dirname(file), { recursive: true });
      writeFileSync(file, JSON.stringify(profile));
    },
  };
}

async function updateProfile(a: Args): Promise<void> {
  const cfg = qwenHalfB(512, a.layers), P = 32, R = 64;
  const model = deviceModel(cfg, 5);
  const ins = instrument();
  try {
    for (const rank of a.lora) {
      model.lora = rank > 0 ? LoraAdapter.init(cfg, { rank, alpha: rank, targetModules: "all-linear" }, new Rng(2)) : undefined;
      try {
        for (const spec of a.updates) {
          await part(`update_${spec}${rank > 0 ? `_lora${rank}` : ""}`, () => updateOnce(a, model, ins, spec, rank));
          if (elapsedS() > a.budgetS) break;
        }
      } finally {
        model.lora?.dispose();
        model.lora = undefined;
      }
      if (elapsedS() > a.budgetS) return;
    }
    for (const batch of a.submitBatches) {
      await part(`update_submit${batch}`, async () => {
        const rows = 16, mb = 16, tokens = rows * (P + R), flop = 6 * numParams(cfg) * tokens;
        const prev = tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE");
        tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", batch);
        try {
          const data = rolloutBatch(rows, P, R, cfg.vocabSize, 7);
          const actor = buildActor(model, rows, mb);
          data.batch.old_log_probs = (await actor.computeLogProb(data, { microBatchSize: mb, maxTokenLen: null }, 1.0, false)).logProbs;
          await actor.updatePolicy(data);
          ins.reset();
          const t0 = performance.now();
          await actor.updatePolicy(data);
          const ms = performance.now() - t0;
          emit("update_0.5B_worker_path", { B: rows, P, R, micro: mb, optimizer: "device", submit_batch: batch }, { ms, tokens_per_s: tokens / (ms / 1e3), tflops: flop / (ms / 1e3) / 1e12, ...ins.reset() });
          actor.optimizer?.dispose();
        } finally {
          tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", prev);
        }
      });
      if (elapsedS() > a.budgetS) return;
    }
    if (a.only.has("device-step")) {
      await part("update_device_step", async () => {
        const rows = 16, tokens = rows * (P + R), flop = 6 * numParams(cfg) * tokens;
        const data = rolloutBatch(rows, P, R, cfg.vocabSize, 7);
        const stepper = new DeviceStep(model, 1e-4), old = stepper.oldLogProbs(data);
        await stepper.step(data, old);
        ins.reset();
        const t0 = performance.now();
        await stepper.step(data, old);
        const ms = performance.now() - t0;
        emit("update_0.5B_device_step", { B: rows, P, R, micro: rows }, { ms, tokens_per_s: tokens / (ms / 1e3), tflops: flop / (ms / 1e3) / 1e12, ...ins.reset() });
        old.dispose();
      });
    }
  } finally {
    model.dispose();
  }
}

/**
 * --only kernels: where the device time of one forward + backward pass goes, at the update's shape
 * (rows x 96 tokens of the 0.5B shape, a next-token loss), full fine-tuning and LoRA (--lora): tf.time
 * with tfjs's timestamp queries times every dispatch on the GPU (each in its own pass, so the sum is
 * device time without overlap; the host's recording is not in it). Figures per program class, the
 * products split by layout (NN, NT, TN; split-K marked), and the host wall time of the same pass
 * untimed for comparison.
 */
async function kernelTimes(a: Args): Promise<void> {
  const cfg = qwenHalfB(512, a.layers), rows = Number(a.updates[0]?.split("x")[0] ?? 64), T = 96;
  const model = deviceModel(cfg, 5);
  const be = tf.backend() as unknown as { runWebGPUProgram: (p: { shaderKey: string; constructor: { name: string } }, ...r: unknown[]) => unknown; supportTimestampQuery?: boolean };
  if (!be.supportTimestampQuery) { emit("kernels", {}, { skipped: "the device has no timestamp-query" }); model.dispose(); return; }
  const ids = tf.tensor2d(Int32Array.from({ length: rows * T }, (_, i) => (i * 7919) % cfg.vocabSize), [rows, T], "int32");
  const label = (p: { shaderKey: string; constructor: { name: string } }) => {
    const m = /^verlDirectGemm_(\w+?)_(\w+?)_u\d+p?(_split)?_(NN|NT|TN|TT)/.exec(p.shaderKey);
    return m ? `gemm_${m[4]}${m[3] ? "_split" : ""}_${m[1]}` : p.constructor.name;
  };
  try {
    for (const rank of a.lora) {
      model.lora = rank > 0 ? LoraAdapter.init(cfg, { rank, alpha: rank, targetModules: "all-linear" }, new Rng(2)) : undefined;
      const vars = model.trainableVariables();
      const pass = () => {
        const { value, grads } = tf.variableGrads(() => tf.tidy(() => {
          const logits = model.forward(ids).slice([0, 0, 0], [rows, T - 1, cfg.vocabSize]);
          return tf.losses.softmaxCrossEntropy(tf.oneHot(ids.slice([0, 1], [rows, T - 1]), cfg.vocabSize), logits) as tf.Scalar;
        }), vars);
        return [value, ...Object.values(grads)];
      };
      // warm-up (compiles), then the host wall time of one untimed pass
      tf.dispose(pass());
      await sync(); // the warm-up's work done before the clock starts
      let t0 = performance.now();
      const out = pass();
      await out[0]!.data();
      const wallMs = performance.now() - t0;
      tf.dispose(out);
      const labels: string[] = [], run = be.runWebGPUProgram;
      be.runWebGPUProgram = function (this: unknown, p, ...r) { labels.push(label(p)); return run.call(this, p, ...r); };
      let info: tf.TimingInfo;
      t0 = performance.now();
      try {
        info = await tf.time(() => tf.dispose(pass()));
      } finally {
        be.runWebGPUProgram = run;
      }
      const timedWall = performance.now() - t0;
      const times = ((info as unknown as { getExtraProfileInfo?: () => string }).getExtraProfileInfo?.() ?? "").split(", ").map((x) => Number(x.slice(x.lastIndexOf(": ") + 2)));
      const by: Record<string, { n: number; ms: number }> = {};
      labels.forEach((l, i) => { const e = (by[l] ??= { n: 0, ms: 0 }); e.n++; e.ms += times[i] ?? NaN; });
      const sorted = Object.fromEntries(Object.entries(by).sort((x, y) => y[1].ms - x[1].ms).map(([k, v]) => [k, { n: v.n, ms: +v.ms.toFixed(3) }]));
      emit("kernels_0.5B_forward_backward", { rows, T, layers: cfg.nLayers, lora_rank: rank, matmul: matmulPrecision(), flop: 6 * numParams(cfg) * rows * T },
        { wall_ms_untimed: wallMs, kernel_ms: info.kernelMs, timed_wall_ms: timedWall, dispatches: labels.length, timers: times.length, by_program: sorted });
      model.lora?.dispose();
      model.lora = undefined;
    }
  } finally {
    ids.dispose();
    model.dispose();
  }
}

async function main(): Promise<void> {
  const a = parseArgs(process.argv.slice(2));
  const backend = await initBackend("webgpu");
  if (a.assumeTensorCores) Object.assign(tensorCoreSupport, { available: true, reason: "", fragments: "assumed: 16x16x16, subgroups of 32" });
  if (backend === "webgpu") emit("webgpu", {}, { summary: webGpuSummary() });
  emit("backend", {}, { backend, submit_batch: tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE"), dawn_flags: process.env.VERL_DAWN_FLAGS ?? "enable-dawn-features=skip_validation" });
  if (a.only.has("adapter")) await part("adapter", adapterInfo);
  const modelPath = a.model ?? sharedPath("models", "stories260K", "stories260K.bin") ?? ".gpu/stories260K/stories260K.bin";
  if (a.only.has("correct")) await part("decode_correctness_stories260K", () => correctness(modelPath));
  if (a.only.has("precision")) await part("decode_precision_stories260K", () => precisionCheck(modelPath, 64));
  const [first, ...rest] = a.vocab;
  for (const p of a.precisions) {
    if (a.only.has("kernels") && elapsedS() < a.budgetS) await withPrecision(p, () => part(`kernels_${p}`, () => kernelTimes(a)));
    if (a.only.has("update") && elapsedS() < a.budgetS) await withPrecision(p, () => part(`update_profile_${p}`, () => updateProfile(a)),
      // the null device's subgroups are 128 lanes: the 64-lane thin tile cannot compile there (a copy of the default tile turns it off)
      a.assumeTensorCores ? { direct: { ...DEFAULT_DIRECT_TILE } } : {});
  }
  for (const p of a.precisions) {
    for (const v of [first, ...rest]) {
      // the decoder's own 16-bit path (weights packed once), not the trainer's BatchMatMul override
      if (v && a.only.has("decode") && elapsedS() < a.budgetS) await part(`webgpu_decode_v${v}_${p}`, () => decode(a, v, { precision: p }, a.newTokens, `v${v}_${p}`));
      for (const tl of p === "f32" ? [] : a.tiles) {
        if (v && a.only.has("decode") && elapsedS() < a.budgetS) await part(`webgpu_decode_v${v}_${p}_${tl}`, () => decode(a, v, { precision: p, ...parseDecodeTiles(tl) }, a.newTokens, `v${v}_${p}_tile${tl}`));
      }
      if (v && p !== "f32" && a.only.has("perhead") && elapsedS() < a.budgetS) await part(`webgpu_decode_v${v}_${p}_perhead`, () => decode(a, v, { precision: p, attention: "per_head" }, a.newTokens, `v${v}_${p}_perhead`));
      if (v && p !== "f32" && a.only.has("kv32") && elapsedS() < a.budgetS) await part(`webgpu_decode_v${v}_${p}_kv32`, () => decode(a, v, { precision: p, kvCache: "f32" }, a.newTokens, `v${v}_${p}_kv_f32`));
      if (v && a.only.has("noreplay") && elapsedS() < a.budgetS) await part(`webgpu_decode_v${v}_${p}_noreplay`, () => decode(a, v, { precision: p, replay: false }, a.newTokens, `v${v}_${p}_noreplay`));
      if (v && a.only.has("noshare") && elapsedS() < a.budgetS) await part(`webgpu_decode_v${v}_${p}_noshare`, () => decode(a, v, { precision: p, sharePrefixes: false }, a.newTokens, `v${v}_${p}_noshare`));
    }
  }
  for (const p of a.precisions) {
    for (const v of a.only.has("slots") ? a.vocab : []) {
      for (const sampling of a.slotSampling) {
        if (elapsedS() < a.budgetS) await part(`webgpu_slots_v${v}_${p}_${sampling}`, () => slots(a, v, p, sampling));
      }
    }
  }
  if (a.only.has("untransposed") && first && elapsedS() < a.budgetS) {
    await part("webgpu_decode_untransposed", () => decode(a, first, { transposedWeights: false }, 32, `v${first}_untransposed_weights`));
  }
  emit("done", {}, { elapsed_s: elapsedS() });
}

main().then(() => process.exit(0), (e: unknown) => {
  console.error(`bench/gpu_decode failed: ${(e as Error).stack ?? String(e)}`);
  process.exit(1);
});
