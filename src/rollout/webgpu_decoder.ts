// The rollout engine on the WebGPU device (issue 17, candidate (a)): the whole decode step
// stays on the GPU. Weights are the model's own tensors re-laid out once per weight change
// on the device (fused q/k/v and gate/up, transposed for tfjs matMul): syncing them is a
// device copy, never a host read. The KV cache is preallocated per layer as
// [2, rows, kvHeads, maxLen, headDim] and written in place; attention of the new tokens over
// it, RMSNorm, SwiGLU, the embedding lookup and sampling are WGSL programs
// (webgpu_programs.ts), the products tfjs's matMul. Each step reads back one small buffer
// (the sampled ids and their log-probs), and the next step is queued before that read is
// awaited, so the host's bookkeeping overlaps the GPU's work. The first decode step is recorded
// and the later ones replayed (engine/webgpu_replay.ts): every step reads its tokens from, and
// samples into, one buffer, so a step's dispatches are the same each time.
// Same interface as the host engine's `generate` (generate.ts), but asynchronous: a GPU
// buffer can only be read with an await under Node.
import * as tf from "@tensorflow/tfjs";
import type { LlamaModel } from "../models/llama.js";
import { ropeInvFreq } from "../models/llama.js";
import type { RopeScaling } from "../models/rope.js";
import { mergedTensor } from "../models/merge.js";
import { llamaGraphGap } from "../models/families.js";
import type { ModelConfig } from "../models/config.js";
import { paramIds, readParamsForDecode, sameIds, snapshotParam } from "./decode_weights.js";
import { activationGroup, quantizationKey, rolloutQuantization, rolloutWeight } from "./fp8.js";
import { vllmFusedRows } from "./torchao.js";
import type { DataProto } from "../protocol/data_proto.js";
import type { Rng } from "../utils/rng.js";
import { assembleRollout, promptRows } from "./generate.js";
import { samePromptSource } from "./prompts.js";
import type { RowSampling, SampledRows, SampledStep, SlotDecoder, SlotDecoderFactory } from "./decoder.js";
import { isGreedy, type SamplingParams } from "./sampling.js";
import { bufferOf, isRefusal, ReadBackRing, RecordedStep, type DispatchTime, type ReplayBackend } from "../engine/webgpu_replay.js";
import { PackedMatrix, tensorCoreSupport, type MatmulPrecision } from "../engine/webgpu_kernels.js";
import type { DirectTile } from "../engine/webgpu_gemm.js";
import {
  AttentionProgram, MAX_DECODE_HEAD_DIM, CacheCopyProgram, CacheWriteProgram, EmbedProgram, Fp8ActivationProgram, QkNormProgram, RmsNormProgram, SamplerProgram, SwiGluProgram,
  placementUniforms, type DecodeShape, type GpuProgram, type PackedOut, type Placement, type SamplerSettings, type UniformValue,
} from "./webgpu_programs.js";

interface TensorInfoLike { dataId: object; shape: number[]; dtype: string }
interface WebGpuBackendLike {
  runWebGPUProgram(program: GpuProgram, inputs: TensorInfoLike[], dtype: string, uniforms?: UniformValue[], output?: TensorInfoLike): TensorInfoLike;
  device: { limits: { maxStorageBufferBindingSize: number } };
}

export interface WebGpuDecodeOptions {
  /** Bound on the KV cache of one sub-batch (default 16 GiB); larger batches run in sub-batches. */
  maxCacheBytes?: number;
  /** Prompt tokens per prefill pass (default 8192); longer prompts are prefilled in column chunks. */
  maxPrefillTokens?: number;
  /** Weights stored [in, out] for tfjs matMul (default); false keeps [out, in] and multiplies by the transpose. */
  transposedWeights?: boolean;
  /**
   * Prefill each distinct prompt once (default true): rows whose prompt (ids, mask and
   * positions) equals an earlier row's in the same sub-batch, as verl's rollout.n repeats
   * give, get a device copy of that row's KV cache instead of their own prefill.
   */
  sharePrefixes?: boolean;
  /**
   * The products' precision (default f32). bf16/f16 (rollout.dtype): the weights are kept as
   * packed f16 copies made once per weight change and multiplied on the tensor cores (inputs
   * rounded to f16, or to bf16 precision held in f16; f32 accumulation). Needs an adapter with
   * the tensor-core features (tensorCoreSupport).
   */
  precision?: MatmulPrecision;
  /**
   * The KV cache's element type (default: f16 when `precision` is 16-bit, else f32). f16 halves
   * the cache's memory and what attention reads each step; values are rounded when written.
   */
  kvCache?: "f32" | "f16";
  /** The tensor-core kernel's tile for the 16-bit products (default DECODE_TILE; the weights are padded to it). */
  tile?: DirectTile;
  /** One product's own tile in place of `tile` (the benchmark's per-product sweep: gpu_decode.ts --tiles gate_up=...). */
  productTiles?: ProductTiles;
  /**
   * Record the first decode step's dispatches and replay them for the later steps (default true;
   * VERL_WEBGPU_DECODE_REPLAY=0 turns it off): the host then encodes a step in a few Dawn calls a
   * dispatch instead of recording it through tfjs (src/engine/webgpu_replay.ts). The step's
   * intermediates stay allocated while the sub-batch decodes, up to `replayMaxMiB`.
   */
  replay?: boolean;
  /** Bound on the intermediates a replayed step keeps (default VERL_WEBGPU_REPLAY_MB or 8192 MiB); over it, steps are recorded as usual. */
  replayMaxMiB?: number;
  /** Times every dispatch of this replayed decode step on the device (lastStats.stepTimes; needs 'timestamp-query'): for benchmarks. */
  profileStep?: number;
  /**
   * How attention workgroups read the KV cache: "grouped" (default) serves all the query heads of
   * a kv head in one workgroup, so each kv head's cache is read once; "per_head" gives each query
   * head its own workgroup (it reads its kv head's cache again): the benchmark's comparison.
   */
  attention?: "grouped" | "per_head";
}

interface ReplayOptions { on: boolean; maxHeldBytes: number; profileStep?: number }

/** What the last `generate` did, for benchmarks. */
export interface WebGpuDecodeStats {
  rows: number; steps: number; readBacks: number; tokens: number; prefillMs: number; decodeMs: number;
  /** rows whose prompt was prefilled (the others copied a sibling's cache) */
  prefillRows: number;
  /** host time spent recording the decode steps' dispatches (the rest of decodeMs is waiting for the GPU) */
  recordMs: number;
  /** decode steps replayed from the recorded first one */
  replayed: number;
  /** whether steps were replayed, and why not ("on: ...", "off: ...") */
  replay: string;
  /** each dispatch's device time in the step named by profileStep (of the last sub-batch that reached it) */
  stepTimes?: DispatchTime[];
}

/** The decoder's products, by the weights they multiply. */
export type DecodeProduct = "qkv" | "o_proj" | "gate_up" | "down_proj" | "lm_head";
export type ProductTiles = Partial<Record<DecodeProduct, DirectTile>>;
const NO_PRODUCT_TILES: ProductTiles = {};

/** A product's weight: float32 for tfjs matMul, or a packed f16 copy for the tensor cores. */
type Weight = tf.Tensor2D | PackedMatrix;
interface LayerWeights { wqkv: Weight; bqkv: tf.Tensor1D; wo: Weight; wgu: Weight; wd: Weight }
interface GpuWeights { ids: object[]; quant: string; transposed: boolean; precision: MatmulPrecision; tile: DirectTile; productTiles: ProductTiles; layers: LayerWeights[]; lmHead: Weight }

const weightCache = new WeakMap<LlamaModel, GpuWeights>();

/**
 * The decoder's tensor-core tile: one subgroup of 2 x 4 fragments, 32 x 64 a workgroup. A decode
 * product has few rows (512 at the 0.5B bench), so the trainer's 128 x 128 tile leaves most of the
 * GPU idle. On the H200 (vocab 151,936, f16 KV cache, 2026-12-04): 27.8 ms a step with 32 x 64,
 * 30.4 with 64 x 64; an earlier call (f32 cache) gave 32.8 with 64 x 64 against 37.9 with 128 x 128.
 *
 * Split-K: the products with few output tiles (at the 0.5B shape q/k/v's 288 and o_proj's and
 * down_proj's 224 workgroups of one subgroup, for 132 SMs) cut K into parts until about 1,024
 * workgroups run, parts of at least 256 (down_proj 5, the others 3); gate/up, the LM head and the
 * prefill's products have workgroups enough and are not split. H100, 512 rows (2026-12-06): 15.96
 * ms a step, against 22.10 unsplit, 18.03 with the trainer's targets (512:512), 16.75 with 2,048:256.
 */
export const DECODE_TILE: DirectTile = { sgM: 1, sgN: 1, tm: 2, tn: 4, unroll: 1, splitK: true, splitTargets: { workgroups: 1024, minChunk: 256 } };

/**
 * The LM head's tile under the default DECODE_TILE (a tile given in the options serves the head
 * too): one subgroup of 4 x 4 fragments. The head has 151,936 outputs at Qwen2.5's vocabulary, so
 * workgroups are plenty either way, and the larger tile reads each weight fragment for 64 rows
 * instead of 32: 2.12 ms a step on the H100 against 2.45-2.54 with 2 x 4 fragments (2026-12-06).
 */
export const DECODE_HEAD_TILE: DirectTile = { sgM: 1, sgN: 1, tm: 4, tn: 4, unroll: 1 };

/**
 * gate/up's tile under the default DECODE_TILE: the same fragments with register prefetch and
 * baked strides. H200, 512 rows (2026-12-06, three calls): 4.90-4.95 ms a step against 5.31
 * without (1x1x4x4: 5.45; 2x1x2x4: 5.15; 2x2x4x4 with both: 5.05). down_proj gains nothing from
 * them (2.51 against 2.44), and on the H100 they slowed the step when every product had them.
 */
export const DECODE_GATE_UP_TILE: DirectTile = { ...DECODE_TILE, prefetch: true, baked: true };

/** The products whose tile under the default DECODE_TILE is their own. */
const DECODE_PRODUCT_TILES: ProductTiles = { gate_up: DECODE_GATE_UP_TILE, lm_head: DECODE_HEAD_TILE };

function disposeWeights(w: GpuWeights, model: LlamaModel): void {
  for (const l of w.layers) [l.wqkv, l.bqkv, l.wo, l.wgu, l.wd].forEach((t) => t.dispose());
  if (w.transposed || w.precision !== "f32") w.lmHead.dispose(); // otherwise it is the model's own variable
}

/** The float32 weights as packed f16 copies (the float32 layouts are freed; the bias stays float32). */
function packWeights(layers: LayerWeights[], lmHead: tf.Tensor2D, transposed: boolean, precision: "f16" | "bf16", tile: DirectTile, productTiles: ProductTiles, headIsModels: boolean): { layers: LayerWeights[]; lmHead: PackedMatrix } {
  const tileOf = (p: DecodeProduct) => productTiles[p] ?? (tile === DECODE_TILE ? DECODE_PRODUCT_TILES[p] : undefined) ?? tile;
  // the layouts are [in, out] (transposed) or the model's [out, in], which the kernel reads column-major
  const pack = (t: Weight, p: DecodeProduct): PackedMatrix => {
    const packed = PackedMatrix.pack(t as tf.Tensor2D, !transposed, precision, tileOf(p));
    t.dispose();
    return packed;
  };
  const packed = layers.map((l) => ({ wqkv: pack(l.wqkv, "qkv"), bqkv: l.bqkv, wo: pack(l.wo, "o_proj"), wgu: pack(l.wgu, "gate_up"), wd: pack(l.wd, "down_proj") }));
  const head = PackedMatrix.pack(lmHead, !transposed, precision, tileOf("lm_head"));
  if (!headIsModels) lmHead.dispose();
  return { layers: packed, lmHead: head };
}

/** The model's weights in the decoder's layout, rebuilt on the device when a parameter changed. */
function gpuWeights(model: LlamaModel, transposed: boolean, precision: MatmulPrecision = "f32", tile: DirectTile = DECODE_TILE, productTiles: ProductTiles = NO_PRODUCT_TILES): GpuWeights {
  const ids = paramIds(model), hit = weightCache.get(model), quant = quantizationKey(model), spec = rolloutQuantization(model);
  if (hit && hit.transposed === transposed && hit.precision === precision && hit.tile === tile && hit.productTiles === productTiles && hit.quant === quant && sameIds(hit.ids, ids)) return hit;
  if (hit) disposeWeights(hit, model);
  else model.onDispose(() => { const w = weightCache.get(model); if (w) disposeWeights(w, model); weightCache.delete(model); });
  const c = model.config, W = (c.nHeads + 2 * c.nKvHeads) * c.headDim;
  const lay = (w: tf.Tensor): tf.Tensor2D => (transposed ? w.transpose() : w.clone()) as tf.Tensor2D;
  // tidy keeps the tensors of the returned objects and frees the concatenations
  const layers: LayerWeights[] = tf.tidy(() => Array.from({ length: c.nLayers }, (_, i) => {
    const p = (n: string): tf.Tensor => {
      const name = `model.layers.${i}.${n}`;
      if (!spec) return mergedTensor(model, name);
      // fp8 rollout: quantized on the host from the snapshot the caller read (WGSL has no 8-bit float to do it in)
      const host = snapshotParam(model, name), shape = model.p(name).shape;
      if (!host) throw new Error(`fp8 rollout: ${name} was not read back before the WebGPU decoder laid out its weights (call readParamsForDecode first)`);
      return tf.tensor(rolloutWeight(name, host, shape, spec, vllmFusedRows(name, shape, c)), shape);
    };
    const proj = ["q_proj", "k_proj", "v_proj"];
    return {
      wqkv: lay(tf.concat(proj.map((n) => p(`self_attn.${n}.weight`)), 0)),
      bqkv: (c.attentionBias ? tf.concat(proj.map((n) => p(`self_attn.${n}.bias`))) : tf.zeros([W])) as tf.Tensor1D,
      wo: lay(p("self_attn.o_proj.weight")),
      wgu: lay(tf.concat([p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")], 0)),
      wd: lay(p("mlp.down_proj.weight")),
    };
  }));
  const head = model.lmHeadWeight() as tf.Tensor2D;
  const lmHead = transposed ? tf.tidy(() => head.transpose() as tf.Tensor2D) : head;
  const w: GpuWeights = precision === "f32"
    ? { ids, quant, transposed, precision, tile, productTiles, layers, lmHead }
    : { ids, quant, transposed, precision, tile, productTiles, ...packWeights(layers, lmHead, transposed, precision, tile, productTiles, !transposed) };
  weightCache.set(model, w);
  return w;
}

/** cos and sin of p * invFreq for p < n as [2, n, headDim / 2], float32 angles as the host decoder computes them. */
function ropeTable(headDim: number, theta: number, scaling: RopeScaling | null, n: number): Float32Array {
  const inv = ropeInvFreq(headDim, theta, scaling), h = headDim / 2, t = new Float32Array(2 * n * h);
  for (let p = 0; p < n; p++) {
    for (let i = 0; i < h; i++) {
      const a = Math.fround(p * inv[i]!);
      t[p * h + i] = Math.cos(a);
      t[n * h + p * h + i] = Math.sin(a);
    }
  }
  return t;
}

/**
 * A float32 zero tensor made by a fill program on the device. tf.zeros builds the zeros in a
 * host array and uploads them: for the 0.5B shape's caches (24 x 75 MB at 512 rows x 288
 * columns) that upload was most of the 2.2-3.0 s prefill on the H200.
 */
function deviceZeros(n: number, dtype: "float32" | "int32" = "float32"): tf.Tensor1D {
  return tf.fill([n], 0, dtype);
}

/**
 * State of one sub-batch on the device: caches, mask, rotary table. With `half` each cache holds
 * f16 pairs in 32-bit words (an int32 tensor of half the elements).
 */
interface Session {
  rows: number; maxLen: number; caches: tf.Tensor1D[]; mask: tf.Tensor; rope: tf.Tensor; ropeRows: number; half: boolean;
}

/** One layer's KV cache of `elements` values: float32, or f16 pairs in int32 words. */
function cacheTensor(elements: number, half: boolean): tf.Tensor1D {
  return half ? deviceZeros(elements / 2, "int32") : deviceZeros(elements);
}

/** Refuses, before anything runs, a model the WebGPU decoder cannot run: the graph's gaps, and heads wider than its attention takes. */
function refuseGaps(c: ModelConfig): void {
  const gap = llamaGraphGap(c, { qkNorm: true })
    ?? (c.headDim > MAX_DECODE_HEAD_DIM ? `head_dim ${c.headDim} (its decode attention takes up to ${MAX_DECODE_HEAD_DIM})` : undefined);
  if (gap) throw new Error(`rollout engine 'webgpu' does not serve ${gap} yet; use rollout.name=tfjs (the host decoder serves every family)`);
}

/** The products' precision, refused with the reason where 16-bit has no tensor cores to run on. */
function checkPrecision(precision: MatmulPrecision = "f32"): MatmulPrecision {
  if (precision !== "f32" && !tensorCoreSupport.available) {
    throw new Error(`rollout engine 'webgpu': ${precision} products need the tensor-core kernel, which this adapter cannot run (${tensorCoreSupport.reason})`);
  }
  return precision;
}

/** Whether the KV cache holds f16 (the default with 16-bit products). */
function halfCache(precision: MatmulPrecision, kvCache: WebGpuDecodeOptions["kvCache"]): boolean {
  return (kvCache ?? (precision === "f32" ? "f32" : "f16")) === "f16";
}

export class WebGpuDecoder {
  readonly name = "webgpu";
  lastStats: WebGpuDecodeStats = { rows: 0, steps: 0, readBacks: 0, tokens: 0, prefillMs: 0, decodeMs: 0, recordMs: 0, prefillRows: 0, replayed: 0, replay: "" };

  constructor(private readonly opts: WebGpuDecodeOptions = {}) {}

  /** Same contract as `generate` in generate.ts (verl's layout in and out), on the GPU. */
  async generate(model: LlamaModel, batch: DataProto, params: SamplingParams, rng: Rng): Promise<DataProto> {
    refuseGaps(model.config);
    if (tf.getBackend() !== "webgpu") {
      throw new Error(`rollout engine 'webgpu' decodes on the WebGPU backend (trainer.device=webgpu); this thread's backend is '${tf.getBackend()}'`);
    }
    const c = model.config, V = c.vocabSize, R = params.responseLength;
    const { data, ids, mask, pos, B, P } = promptRows(batch, params, V);
    if (c.ropeScaling?.type === "dynamic" && P + R > c.maxSeqLen) {
      throw new Error(`rollout engine 'webgpu': prompt ${P} + response ${R} passes max_position_embeddings ${c.maxSeqLen}, where dynamic rope scaling changes the frequencies (not built on the GPU); use rollout.name=tfjs`);
    }
    const backend = tf.backend() as unknown as WebGpuBackendLike;
    const precision = checkPrecision(this.opts.precision);
    if (rolloutQuantization(model)) await readParamsForDecode(model); // fp8 rollout quantizes on the host
    const w = gpuWeights(model, this.opts.transposedWeights ?? true, precision, this.opts.tile, this.opts.productTiles);
    const half = halfCache(precision, this.opts.kvCache);
    const maxLen = P + R, layerBytesPerRow = 2 * c.nKvHeads * c.headDim * maxLen * (half ? 2 : 4);
    const sub = Math.max(1, Math.min(B,
      Math.floor((this.opts.maxCacheBytes ?? 16 * 2 ** 30) / (layerBytesPerRow * c.nLayers)),
      Math.floor(backend.device.limits.maxStorageBufferBindingSize / layerBytesPerRow)));
    const out = { responses: new Int32Array(B * R).fill(params.padTokenId), responseMask: new Int32Array(B * R), logProbs: new Float32Array(B * R) };
    const stats: WebGpuDecodeStats = { rows: B, steps: 0, readBacks: 0, tokens: 0, prefillMs: 0, decodeMs: 0, recordMs: 0, prefillRows: 0, replayed: 0, replay: "" };
    const step = new DecodeStep(model, w, backend, half, this.opts.attention === "per_head");
    const replay: ReplayOptions = {
      on: this.opts.replay ?? process.env.VERL_WEBGPU_DECODE_REPLAY !== "0",
      maxHeldBytes: (this.opts.replayMaxMiB ?? Number(process.env.VERL_WEBGPU_REPLAY_MB ?? 8192)) * 2 ** 20,
      profileStep: this.opts.profileStep,
    };
    if (!replay.on) stats.replay = "off: turned off (VERL_WEBGPU_DECODE_REPLAY=0 or replay: false)";
    for (let b0 = 0; b0 < B; b0 += sub) {
      const nb = Math.min(sub, B - b0), rowsOf = (a: Int32Array) => a.subarray(b0 * P, (b0 + nb) * P);
      const seed = Math.floor(rng.random() * 2 ** 32) >>> 0;
      const [i, m, p] = [rowsOf(ids), rowsOf(mask), rowsOf(pos)];
      const source = (this.opts.sharePrefixes ?? true) ? samePromptSource(i, m, p, nb, P) : Int32Array.from({ length: nb }, (_, b) => b);
      await step.run(i, m, p, source, nb, P, params, seed, out, b0, stats, this.opts.maxPrefillTokens ?? 8192, replay);
    }
    this.lastStats = stats;
    return assembleRollout(data, { ids, mask, pos, B, P, R, ...out, logProbs: params.calculateLogProbs ? out.logProbs : undefined });
  }
}

type Outputs = { responses: Int32Array; responseMask: Int32Array; logProbs: Float32Array };


/** The forward pass and the decode loop of one sub-batch. */
class DecodeStep {
  private readonly s: DecodeShape;
  constructor(private readonly model: LlamaModel, readonly w: GpuWeights, private readonly backend: WebGpuBackendLike, private readonly kvHalf = false,
    private readonly attentionPerHead = false) {
    const c = model.config;
    this.s = { dim: c.dim, hiddenDim: c.hiddenDim, nHeads: c.nHeads, nKvHeads: c.nKvHeads, headDim: c.headDim, vocabSize: c.vocabSize, normEps: c.normEps };
  }

  private program(p: GpuProgram, inputs: TensorInfoLike[], dtype: "float32" | "int32", uniforms: UniformValue[]): tf.Tensor {
    const info = this.backend.runWebGPUProgram(p, inputs, dtype, uniforms);
    return tf.engine().makeTensorFromTensorInfo(info as tf.TensorInfo);
  }

  /** One token per row of `logits` [rows, V], each row with its own settings (SamplerProgram.rowSettings): [2 * rows] int32, ids then log-prob bits. */
  sampleRows(logits: tf.Tensor, settings: tf.Tensor, rows: number): tf.Tensor {
    return this.program(new SamplerProgram(this.s.vocabSize, rows, true), [logits, settings], "int32", [{ type: "int32", data: [rows] }]);
  }

  /** fp8 / torchao float8 rollout: the input of a quantized product rounded per token in groups (a copy; the input itself is kept). */
  private qa(x: tf.Tensor, N: number): tf.Tensor {
    const K = x.shape[1]!, group = activationGroup(rolloutQuantization(this.model), K);
    if (!group) return x;
    return this.program(new Fp8ActivationProgram(K, group, N), [x], "float32", [{ type: "int32", data: [N] }]);
  }

  /** x times w, plus `residual` where given (a 16-bit weight adds it in the pass that sums its split-K parts). */
  private mm(x: tf.Tensor, w: Weight, residual?: tf.Tensor): tf.Tensor2D {
    if (w instanceof PackedMatrix) return w.matMul(x as tf.Tensor2D, residual);
    const y = tf.matMul(x as tf.Tensor2D, w, false, !this.w.transposed) as tf.Tensor2D;
    return residual ? tf.add<tf.Tensor2D>(residual as tf.Tensor2D, y) : y;
  }

  /**
   * Where `w` is a packed 16-bit weight and the inputs are not fp8-rounded, the producer of its left
   * operand writes the padded f16 words itself (one dispatch fewer a product, issue 23's item 4).
   */
  private packedOut(w: Weight, rows: number): PackedOut | undefined {
    if (!(w instanceof PackedMatrix) || rolloutQuantization(this.model)) return undefined;
    const { mP, kP } = w.leftPadding(rows);
    return { rowsP: mP, colsP: kP, rounding: w.rounding };
  }

  /** rmsNorm(x) times w (its input fp8-rounded under fp8 rollout, except for the LM head: `quantized` false). */
  private normProduct(x: tf.Tensor, norm: tf.Tensor, rows: number, w: Weight, quantized = true): tf.Tensor2D {
    const pk = this.packedOut(w, rows);
    if (!pk) {
      const y = this.rmsNorm(x, norm, rows);
      return this.mm(quantized ? this.qa(y, rows) : y, w);
    }
    const words = this.program(new RmsNormProgram(this.s.dim, this.s.normEps, rows, pk), [x, norm], "int32", [{ type: "int32", data: [rows] }]);
    return (w as PackedMatrix).matMulPacked(words, rows);
  }

  /** residual + SwiGLU of [gate | up] times the down projection. */
  private swiGluProduct(gu: tf.Tensor, rows: number, w: Weight, residual: tf.Tensor): tf.Tensor2D {
    const pk = this.packedOut(w, rows), act = new SwiGluProgram(this.s.hiddenDim, rows, pk);
    if (!pk) return this.mm(this.qa(this.program(act, [gu], "float32", act.uniformValues()), rows), w, residual);
    const words = this.program(act, [gu], "int32", act.uniformValues());
    return (w as PackedMatrix).matMulPacked(words, rows, residual);
  }

  private rmsNorm(x: tf.Tensor, weight: tf.Tensor, rows: number): tf.Tensor {
    return this.program(new RmsNormProgram(this.s.dim, this.s.normEps, rows), [x, weight], "float32", [{ type: "int32", data: [rows] }]);
  }

  /** Qwen3: each q and k head RMS-normed over head_dim (q_norm, k_norm) before the programs rotate and cache them. */
  private headNorms(qkv: tf.Tensor, l: number, N: number): tf.Tensor {
    const p = (n: string) => this.model.p(`model.layers.${l}.self_attn.${n}`);
    return this.program(new QkNormProgram(this.s, N), [qkv, p("q_norm.weight"), p("k_norm.weight")], "float32", [{ type: "int32", data: [N] }]);
  }

  /**
   * Runs nTok tokens (tPer per cache row, rows in order) through the model, writing their
   * k and v into the caches; returns the logits [rows, V] of each row's last token, or
   * nothing when `logits` is false.
   */
  forward(sess: Session, tok: tf.Tensor, posT: tf.Tensor, place: Placement, logits: boolean, placeT?: tf.Tensor): tf.Tensor | undefined {
    const s = this.s, model = this.model, N = place.nTok, uni = placementUniforms(place), count = [{ type: "int32" as const, data: [N] }];
    // with placeT each token names its cache row and column (WebGpuSlotDecoder); else rows in order from column slot0
    const placed = <T extends GpuProgram>(p: T): T => (placeT ? placedByTensor(p) : p);
    const extra = placeT ? [placeT] : [];
    let x = this.program(new EmbedProgram(s.dim, N), [model.p("model.embed_tokens.weight"), tok], "float32", count);
    for (let l = 0; l < model.config.nLayers; l++) {
      const L = this.w.layers[l]!, p = (n: string) => model.p(`model.layers.${l}.${n}`), cache = sess.caches[l]!;
      const next = tf.tidy(() => {
        let qkv: tf.Tensor = this.normProduct(x, p("input_layernorm.weight"), N, L.wqkv);
        if (model.config.qkNorm) qkv = this.headNorms(qkv, l, N);
        this.backend.runWebGPUProgram(placed(new CacheWriteProgram(s, N, cache.size, sess.half)), [qkv, L.bqkv, sess.rope, posT, ...extra], cache.dtype, uni, cache);
        // attention writes o_proj's packed operand itself where the weight is packed (no pack dispatch)
        const pk = this.packedOut(L.wo, N);
        const att = this.program(placed(new AttentionProgram(s, N, sess.half, this.attentionPerHead, pk)), [qkv, L.bqkv, sess.rope, posT, sess.mask, cache, ...extra], pk ? "int32" : "float32", uni);
        const h = pk ? (L.wo as PackedMatrix).matMulPacked(att, N, x) : this.mm(this.qa(att, N), L.wo, x);
        const gu = this.normProduct(h, p("post_attention_layernorm.weight"), N, L.wgu);
        return this.swiGluProduct(gu, N, L.wd, h);
      });
      x.dispose();
      x = next;
    }
    if (!logits) { x.dispose(); return undefined; }
    return tf.tidy(() => {
      const rows = N / place.tPer;
      const last = place.tPer === 1 ? x : x.reshape([rows, place.tPer, s.dim]).slice([0, place.tPer - 1, 0], [rows, 1, s.dim]).reshape([rows, s.dim]);
      const out = this.normProduct(last, model.p("model.norm.weight"), rows, this.w.lmHead, false);
      x.dispose();
      return out;
    });
  }

  async run(ids: Int32Array, mask: Int32Array, pos: Int32Array, source: Int32Array, nb: number, P: number, params: SamplingParams, seed: number, out: Outputs, b0: number, stats: WebGpuDecodeStats, maxPrefill: number, replay: ReplayOptions): Promise<void> {
    const c = this.model.config, R = params.responseLength, maxLen = P + R, V = c.vocabSize;
    let maxPos = 0;
    for (const p of pos) maxPos = Math.max(maxPos, p);
    const ropeRows = maxPos + R + 1;
    const fullMask = new Int32Array(nb * maxLen).fill(1);
    for (let b = 0; b < nb; b++) fullMask.set(mask.subarray(b * P, b * P + P), b * maxLen);
    const sess: Session = {
      rows: nb, maxLen, ropeRows, half: this.kvHalf,
      caches: Array.from({ length: c.nLayers }, () => cacheTensor(2 * nb * c.nKvHeads * maxLen * c.headDim, this.kvHalf)),
      mask: tf.tensor1d(fullMask, "int32"),
      rope: tf.tensor1d(ropeTable(c.headDim, c.ropeTheta, c.ropeScaling ?? null, ropeRows)),
    };
    const place = (nTok: number, tPer: number, slot0: number, posAdd: number, advancing = false): Placement =>
      ({ nTok, tPer, slot0, posAdd, maxLen, vOff: nb * c.nKvHeads * maxLen * c.headDim, ropeOff: ropeRows * (c.headDim / 2), advancing });
    const greedy = isGreedy(params), settings = { invT: greedy ? 1 : 1 / params.temperature, topK: params.topK, topP: params.topP, greedy, seed };
    // every step reads its tokens from `sampled` and writes its own there (ids, then log-prob bits):
    // the same buffers step after step, which is what lets a recorded step be replayed
    const sampled = deviceZeros(2 * nb, "int32");
    const sampler = (logits: tf.Tensor, t: number, advancing = false) => {
      this.backend.runWebGPUProgram(new SamplerProgram(V, nb), [logits], "int32", SamplerProgram.uniforms(nb, { ...settings, step: t }, advancing), sampled);
    };
    const be = this.backend as unknown as ReplayBackend;
    const reader = new ReadBackRing(be.device, bufferOf(be, sampled.dataId), 8 * nb);
    const basePos = tf.tensor1d(Int32Array.from({ length: nb }, (_, b) => pos[b * P + P - 1]! + 1), "int32");
    bufferOf(be, basePos.dataId); // uploaded now: a recorded step may not upload host values
    const eos = new Set(params.ignoreEos ? [] : params.eosTokenIds);
    const done = new Uint8Array(nb);
    let live = nb, recorded: RecordedStep | undefined, times: Promise<DispatchTime[]> | undefined;
    // step t + 1 of the response, queued; its read-back, to be awaited
    const queueStep = (t: number): Promise<ArrayBuffer> => {
      if (recorded) {
        stats.replayed++;
        if (t !== replay.profileStep) return recorded.replay(t, reader)!;
        const timed = recorded.replayTimed(t, reader);
        times = timed.times;
        return timed.read!;
      }
      const record = () => tf.tidy(() => sampler(this.forward(sess, sampled, basePos, place(nb, 1, P + t, t, true), true)!, t + 1, true));
      if (t === 0 && replay.on) {
        // the first decode step is recorded; the later ones replay it with the cache column, rotary offset and sampler step advanced
        const r = RecordedStep.capture(be, record, { maxHeldBytes: replay.maxHeldBytes });
        if (isRefusal(r)) stats.replay = `off: ${r.reason}`;
        else { recorded = r; stats.replay = `on: ${r.dispatches} dispatches a step, ${(r.heldBytes / 2 ** 20).toFixed(0)} MiB kept`; }
      } else record();
      return reader.readNow(be);
    };
    try {
      const t0 = performance.now();
      this.prefill(sess, ids, mask, pos, source, nb, P, maxPrefill, place, sampler, stats);
      let pending = reader.readNow(be);
      await pending;
      const t1 = performance.now();
      stats.prefillMs += t1 - t0;
      for (let t = 0; t < R; t++) {
        // queue step t+1 (it reads step t's ids on the device) before waiting for step t's read
        let next: Promise<ArrayBuffer> | undefined;
        if (t + 1 < R) {
          const r0 = performance.now();
          next = queueStep(t);
          stats.recordMs += performance.now() - r0;
          stats.steps++;
        }
        const v = new Int32Array(await pending);
        stats.readBacks++;
        const lp = new Float32Array(v.buffer, nb * 4, nb);
        for (let b = 0; b < nb; b++) {
          if (done[b]) continue;
          const row = (b0 + b) * R + t, token = v[b]!;
          out.responses[row] = token;
          out.responseMask[row] = 1;
          out.logProbs[row] = lp[b]!;
          stats.tokens++;
          if (eos.has(token)) { done[b] = 1; live--; }
        }
        if (!next) break;
        pending = next;
        if (live === 0) { await pending; break; }
      }
      stats.decodeMs += performance.now() - t1;
      if (times) stats.stepTimes = await times;
    } finally {
      recorded?.dispose();
      reader.dispose();
      tf.dispose([...sess.caches, sess.mask, sess.rope, basePos, sampled]);
    }
  }

  /**
   * The prompt columns in chunks of at most maxPrefill tokens; the first tokens are sampled into the sampler's buffer.
   * Only the rows that are their own source are run (each at its own cache row); the others
   * then get their source's cache columns by a device copy and its last logits by a gather,
   * so every row samples its first token as if it had been prefilled itself.
   */
  private prefill(sess: Session, ids: Int32Array, mask: Int32Array, pos: Int32Array, source: Int32Array, nb: number, P: number, maxPrefill: number,
    place: (nTok: number, tPer: number, slot0: number, posAdd: number) => Placement, sampler: (l: tf.Tensor, t: number) => void,
    stats: WebGpuDecodeStats): void {
    const run = Array.from(source.keys()).filter((b) => source[b] === b), k = run.length, shared = k < nb;
    stats.prefillRows += k;
    let start = P - 1; // columns that are padding in every row need no work
    for (const b of run) for (let s = 0; s < start; s++) if (mask[b * P + s] !== 0) { start = s; break; }
    const chunk = Math.max(1, Math.floor(maxPrefill / k));
    for (let c0 = start; c0 < P; c0 += chunk) {
      const T = Math.min(chunk, P - c0), tok = new Int32Array(k * T), ps = new Int32Array(k * T);
      run.forEach((b, r) => {
        tok.set(ids.subarray(b * P + c0, b * P + c0 + T), r * T);
        ps.set(pos.subarray(b * P + c0, b * P + c0 + T), r * T);
      });
      const lastChunk = c0 + T >= P;
      tf.tidy(() => {
        // with sharing the prefilled rows are not contiguous: each token names its cache row and column
        const placeT = shared ? tf.tensor1d(Int32Array.from({ length: 2 * k * T }, (_, i) => (i < k * T ? run[Math.floor(i / T)]! : c0 + (i % T))), "int32") : undefined;
        let logits = this.forward(sess, tf.tensor1d(tok, "int32"), tf.tensor1d(ps, "int32"), place(k * T, T, c0, 0), lastChunk, placeT);
        if (!logits) return;
        if (shared) logits = tf.gather(logits, tf.tensor1d(Int32Array.from(source, (s) => run.indexOf(s)), "int32"));
        sampler(logits, 0);
      });
    }
    if (shared) this.copyPrefixes(sess, source, P);
  }

  /** Each row's prompt columns from its source row's, in every layer's cache. */
  private copyPrefixes(sess: Session, source: Int32Array, P: number): void {
    const pairs: number[] = [];
    source.forEach((s, b) => { if (s !== b) pairs.push(b, s); });
    const c = this.model.config, n = pairs.length / 2, pairsT = tf.tensor1d(Int32Array.from(pairs), "int32");
    const vOff = (sess.rows * c.nKvHeads * sess.maxLen * c.headDim) / (sess.half ? 2 : 1); // in the cache tensor's units
    const uni = CacheCopyProgram.uniforms(n, P, sess.maxLen, vOff);
    for (const cache of sess.caches) this.backend.runWebGPUProgram(new CacheCopyProgram(this.s, n, P, cache.size, sess.half), [pairsT], cache.dtype, uni, cache);
    pairsT.dispose();
  }
}

/**
 * A cache-placing program (CacheWriteProgram, AttentionProgram) whose token n names its cache
 * row and column in an extra int32 input `place` (rows [0, nTok), then columns), instead of
 * the block layout "row n / tPer at column slot0 + n % tPer".
 */
function placedByTensor<T extends GpuProgram>(p: T): T {
  const code = p.getUserCode(), row = "let b = n / uniforms.tPer;", col = "let slot = uniforms.slot0 + n % uniforms.tPer;";
  if (!code.includes(row) || !code.includes(col)) throw new Error(`WebGPU slot decoder: program ${p.shaderKey} no longer places tokens as "${row} ${col}"; update placedByTensor`);
  const placedCode = code.replace(row, "let b = place[n];").replace(col, "let slot = place[uniforms.nTok + n];");
  const out = Object.create(Object.getPrototypeOf(p) as object) as T;
  // a program that binds some inputs as vectors lists every input's components: "place" is scalar
  const components = (p as { variableComponents?: number[] }).variableComponents;
  return Object.assign(out, p, { variableNames: [...p.variableNames, "place"], shaderKey: `${p.shaderKey}_placed`, getUserCode: () => placedCode },
    components ? { variableComponents: [...components, 1] } : {});
}

/** The slot decoder's options: rollout.dtype as in WebGpuDecodeOptions. */
export type WebGpuSlotOptions = Pick<WebGpuDecodeOptions, "precision" | "kvCache" | "tile" | "productTiles" | "attention">;

/**
 * The WebGPU decoder's per-request entry point (a SlotDecoder for the continuous-batching
 * server of agent loops): `slots` cache rows of `maxLen` columns on the device, each row at
 * its own column, so requests join and leave between calls and a conversation's row is
 * continued at its next turn. The forward pass is the one `generate` runs, with the same
 * weights (packed f16 for rollout.dtype bf16/fp16, re-laid out only when a parameter changed)
 * and KV cache element type. `forwardSample` samples each row on the device with its
 * request's own settings and reads back only the ids and log-probs; `forwardRows` reads the
 * logits back for a server that samples on the host.
 */
export class WebGpuSlotDecoder implements SlotDecoder {
  readonly vocabSize: number;
  readonly precision: MatmulPrecision;
  /** f16 KV cache */
  readonly half: boolean;
  private readonly backend: WebGpuBackendLike;
  private step: DecodeStep;
  private readonly sess: Session;

  constructor(private readonly model: LlamaModel, readonly slots: number, readonly maxLen: number, private readonly opts: WebGpuSlotOptions = {}) {
    refuseGaps(model.config);
    if (tf.getBackend() !== "webgpu") {
      throw new Error(`rollout engine 'webgpu' decodes on the WebGPU backend (trainer.device=webgpu); this thread's backend is '${tf.getBackend()}'`);
    }
    const c = model.config;
    this.backend = tf.backend() as unknown as WebGpuBackendLike;
    this.vocabSize = c.vocabSize;
    this.precision = checkPrecision(opts.precision);
    this.half = halfCache(this.precision, opts.kvCache);
    const layerBytes = 2 * slots * c.nKvHeads * maxLen * c.headDim * (this.half ? 2 : 4), limit = this.backend.device.limits.maxStorageBufferBindingSize;
    if (layerBytes > limit) {
      throw new Error(`WebGPU slot decoder: ${slots} sequences x ${maxLen} positions need ${layerBytes} bytes of KV cache a layer, over the device's binding limit ${limit}; lower actor_rollout_ref.rollout.max_num_seqs or agent.max_concurrent_loops`);
    }
    this.step = new DecodeStep(model, gpuWeights(model, true, this.precision, opts.tile, opts.productTiles), this.backend, this.half, opts.attention === "per_head");
    this.sess = {
      rows: slots, maxLen, ropeRows: maxLen, half: this.half,
      caches: Array.from({ length: c.nLayers }, () => cacheTensor(2 * slots * c.nKvHeads * maxLen * c.headDim, this.half)),
      // each row's columns up to its token are its own sequence's: nothing to mask
      mask: tf.ones([slots * maxLen], "int32"),
      rope: tf.tensor1d(ropeTable(c.headDim, c.ropeTheta, c.ropeScaling ?? null, maxLen)),
    };
  }

  /** The decode step over the model's current weights (the layout is cached per model: rebuilt, or packed again, only when a parameter changed). */
  private current(): DecodeStep {
    const w = gpuWeights(this.model, true, this.precision, this.opts.tile, this.opts.productTiles);
    if (this.step.w !== w) this.step = new DecodeStep(this.model, w, this.backend, this.half, this.opts.attention === "per_head");
    return this.step;
  }

  async forwardRows(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number): Promise<Float32Array> {
    const logits = this.run(rows, tokens, positions, slotStart, T, (l) => l)!;
    try {
      return (await logits.data()) as Float32Array;
    } finally {
      logits.dispose();
    }
  }

  forwardSample(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number, sampling: readonly RowSampling[] | null, prev?: SampledStep): SampledStep | null {
    const R = rows.length;
    if (sampling && sampling.length !== R) throw new Error(`WebGPU slot decoder: ${sampling.length} sampling settings for ${R} rows`);
    if (prev !== undefined && !(prev instanceof DeviceSampledStep)) throw new Error("WebGPU slot decoder: prev must be a step this decoder queued");
    const settings = sampling && tf.tensor1d(SamplerProgram.rowSettings(sampling.map(samplerSettings)), "int32");
    try {
      const out = this.run(rows, tokens, positions, slotStart, T, settings ? (l) => this.step.sampleRows(l, settings, R) : undefined, prev);
      return out ? new DeviceSampledStep(out, R) : null;
    } finally {
      settings?.dispose();
    }
  }

  /** Checks and places the tokens, runs the forward pass; `head` turns the last tokens' logits into what is read back (none: no logits). */
  private run(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number, head?: (logits: tf.Tensor) => tf.Tensor, prev?: DeviceSampledStep): tf.Tensor | undefined {
    const c = this.model.config, R = rows.length, N = R * T;
    if (prev && T !== 1) throw new Error(`WebGPU slot decoder: tokens from the previous step feed one token a row (T = 1), not ${T}`);
    if (tokens.length !== N || positions.length !== N || slotStart.length !== R) throw new Error("WebGPU slot decoder: tokens/positions must hold rows x T entries and slotStart one per row");
    const place = new Int32Array(2 * N);
    for (let r = 0; r < R; r++) {
      if (rows[r]! < 0 || rows[r]! >= this.slots) throw new Error(`WebGPU slot decoder: row ${rows[r]} outside [0, ${this.slots})`);
      if (slotStart[r]! < 0 || slotStart[r]! + T > this.maxLen) throw new Error(`WebGPU slot decoder: columns ${slotStart[r]}..${slotStart[r]! + T - 1} are past the cache length ${this.maxLen}`);
      for (let t = 0; t < T; t++) {
        const n = r * T + t;
        if (positions[n]! < 0 || positions[n]! >= this.maxLen) throw new Error(`WebGPU slot decoder: position ${positions[n]} outside [0, ${this.maxLen})`);
        const fromPrev = prev !== undefined && tokens[n]! < 0;
        if (fromPrev ? -1 - tokens[n]! >= prev.rows : tokens[n]! < 0 || tokens[n]! >= c.vocabSize) {
          throw new Error(fromPrev ? `WebGPU slot decoder: token ${tokens[n]} names row ${-1 - tokens[n]!} of a previous step of ${prev.rows} rows` : `WebGPU slot decoder: token id ${tokens[n]} outside the vocabulary [0, ${c.vocabSize})`);
        }
        place[n] = rows[r]!;
        place[N + n] = slotStart[r]! + t;
      }
    }
    const step = this.current();
    const placement: Placement = { nTok: N, tPer: T, slot0: 0, posAdd: 0, maxLen: this.maxLen, vOff: this.slots * c.nKvHeads * this.maxLen * c.headDim, ropeOff: this.maxLen * (c.headDim / 2) };
    const inputs = [this.tokenTensor(tokens, prev), tf.tensor1d(positions, "int32"), tf.tensor1d(place, "int32")];
    try {
      return tf.tidy(() => {
        const logits = step.forward(this.sess, inputs[0]!, inputs[1]!, placement, head !== undefined, inputs[2]);
        return logits && head ? head(logits) : undefined;
      });
    } finally {
      tf.dispose(inputs);
    }
  }

  /** The step's tokens on the device: the host's, with -1 - j taken from the previous step's row j without a read-back. */
  private tokenTensor(tokens: Int32Array, prev?: DeviceSampledStep): tf.Tensor {
    if (!prev || tokens.every((t) => t >= 0)) return tf.tensor1d(tokens, "int32");
    return tf.tidy(() => {
      const fromPrev = tf.tensor1d(Uint8Array.from(tokens, (t) => (t < 0 ? 1 : 0)), "bool");
      const picked = tf.gather(prev.ids, tf.tensor1d(Int32Array.from(tokens, (t) => (t < 0 ? -1 - t : 0)), "int32"));
      return tf.where(fromPrev, picked, tf.tensor1d(Int32Array.from(tokens, (t) => Math.max(t, 0)), "int32"));
    });
  }

  /** Columns past `len` are written again before any token reads them: nothing to clear. */
  truncateRow(row: number, len: number): void {
    if (row < 0 || row >= this.slots) throw new Error(`WebGPU slot decoder: row ${row} outside [0, ${this.slots})`);
    if (!Number.isInteger(len) || len < 0 || len > this.maxLen) throw new Error(`WebGPU slot decoder: cannot keep ${len} columns of a cache of length ${this.maxLen}`);
  }

  dispose(): void {
    tf.dispose([...this.sess.caches, this.sess.mask, this.sess.rope]);
  }
}

/** A queued device-sampled step: [2 * rows] int32 on the device (ids, then log-prob bits), read back once. */
class DeviceSampledStep implements SampledStep {
  readonly result: Promise<SampledRows>;
  private settled = false;
  private disposed = false;
  constructor(readonly ids: tf.Tensor, readonly rows: number) {
    const R = rows;
    this.result = (ids.data() as Promise<Int32Array>).then((v) => ({ ids: v.slice(0, R), logProbs: new Float32Array(v.buffer.slice(v.byteOffset + 4 * R, v.byteOffset + 8 * R)) }));
    // a tensor is freed only after its read has finished
    void this.result.then(() => this.settle(), () => this.settle());
  }

  private settle(): void {
    this.settled = true;
    if (this.disposed) this.ids.dispose();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    if (this.settled) this.ids.dispose();
  }
}

/** A request's sampling as the device sampler's settings (greedy: temperature 1 for the log-prob, as the host sampler). */
function samplerSettings(s: RowSampling): SamplerSettings {
  const greedy = isGreedy(s);
  return { invT: greedy ? 1 : 1 / s.temperature, topK: s.topK, topP: s.topP, greedy, seed: s.seed, step: s.step };
}

/** The continuous-batching server's decoder on the WebGPU device, with rollout.dtype's precision. */
export function webGpuSlotDecoderFactory(opts: WebGpuSlotOptions = {}): SlotDecoderFactory {
  return (model, slots, maxLen) => new WebGpuSlotDecoder(model, slots, maxLen, opts);
}

/** The continuous-batching server's decoder on the WebGPU device (float32). */
export const webGpuSlotDecoder: SlotDecoderFactory = webGpuSlotDecoderFactory();
