// A Llama-family decoder in TensorFlow.js: RMSNorm, rotary embeddings (Hugging
// Face's "rotate halves" convention), grouped-query attention, SwiGLU, tied or
// untied output projection, optional q/k/v biases (Qwen2). Parameters carry the
// Hugging Face names and [out, in] shapes, so a checkpoint maps one to one.
// This is the training path (real gradients); rollout decodes with a KV cache
// in src/rollout/decoder.ts, which must agree with `forward` (tested).
import * as tf from "@tensorflow/tfjs";
import { stackRows } from "../engine/copies.js";
import { frozenLinear, linear } from "../engine/matmul.js";
import { tokenAttention } from "./attention.js";
import { checkpoint } from "./checkpointing.js";
import { geGlu, rmsNorm, softcap, swiGlu } from "./layers.js";
import type { LoraAdapter } from "./lora.js";
import type { AdapterDropout } from "./lora_dropout.js";
import { loraLinear } from "./lora_linear.js";
import { topKMask } from "./moe_loss.js";
import { segmentView } from "./packing.js";
import { isSparseLayer, layerWindow, type ModelConfig } from "./config.js";
import { layerPrefix, parameterShapes } from "./shapes.js";

export { parameterShapes };
import { applyRope, ropeInvFreq, type RopeScaling } from "./rope.js";
import { cachedTensors, constTensor, exactKey } from "../engine/constants.js";

/**
 * Mask and positions are used on the host only (attention bias, rotary tables), so
 * callers should pass them as host arrays [B*T] in row order; a tensor is read back
 * synchronously, which a GPU backend under Node cannot do (WebGPU's readSync needs an
 * OffscreenCanvas) unless its values were never uploaded.
 */
export interface ForwardOptions {
  /** [B, T], 1 for real tokens and 0 for padding (left or right). */
  attentionMask?: tf.Tensor2D | ArrayLike<number>;
  /** [B, T] positions for the rotary embedding; derived from the mask when absent. */
  positionIds?: tf.Tensor2D | ArrayLike<number>;
  /** Lengths of the sequences packed back to back in a [1, N] input (remove-padding); they sum to N. */
  segments?: ArrayLike<number>;
  /** MoE: receives each sparse layer's router logits [N, numExperts], in layer order (kept: the caller disposes them). */
  routerLogits?: tf.Tensor[];
  /**
   * MoE routing replay (verl's router_replay): the experts each token must use, [N, sparseLayers, topK]
   * (N = B*T tokens in row order, or the packed N), instead of the router's own top-k. The gate weights
   * stay the router's softmax at those experts (renormalised with norm_topk_prob), so the router trains.
   */
  replayExperts?: ArrayLike<number>;
  /** MoE: receives each sparse layer's chosen experts [N, topK] int32, in layer order (kept: the caller disposes them). */
  routedExperts?: tf.Tensor[];
  /** MiMo: also run the first multi-token-prediction layer (see MtpInputs). */
  mtp?: MtpInputs;
}

/**
 * The first MTP layer's inputs and output. Position t combines the trunk's hidden state at t
 * (before the final norm, as vLLM's MiMo hands it over) with the embedding of `nextIds[t]`,
 * the token at t+1 (Megatron's roll of input_ids by -1; any id where there is none, its
 * output is then meaningless and must be masked); its logits predict the token at t+2.
 */
export interface MtpInputs {
  /** [B*T] (packed: [N]) the token after each position, in row order. */
  nextIds: ArrayLike<number>;
  /** verl's detach_encoder: no gradient from the MTP output into the trunk's hidden states or the embedding. */
  detachEncoder?: boolean;
  /** Receives the MTP layer's final-normed hidden states [B, T, dim] (kept: the caller disposes them). */
  hidden: tf.Tensor[];
}

/** Identity forward, zero gradient (torch's .detach()). */
const detach = tf.customGrad((x) => ({ value: tf.clone(x as tf.Tensor), gradFunc: (dy: tf.Tensor) => tf.zerosLike(dy) }));

/** What a sparse layer reads and writes besides its input: collected router logits and chosen experts, forced experts [N*topK]. */
interface MoeIo { logits?: tf.Tensor[]; chosen?: tf.Tensor[]; replay?: Int32Array }

function hostInts(x: tf.Tensor2D | ArrayLike<number> | undefined, B: number, T: number, what: string): ArrayLike<number> | undefined {
  if (x === undefined) return undefined;
  const v = x instanceof tf.Tensor ? x.dataSync() : x;
  if (v.length !== B * T) throw new Error(`LlamaModel: ${what} holds ${v.length} values, input_ids [${B}, ${T}] needs ${B * T}`);
  return v;
}

/** Check that `params` holds exactly the expected names and shapes. */
export function checkParameters(expected: Map<string, number[]>, params: Map<string, tf.Tensor>, source: string): void {
  for (const [name, shape] of expected) {
    const t = params.get(name);
    if (!t) throw new Error(`${source}: missing parameter '${name}' [${shape}]`);
    if (t.shape.join(",") !== shape.join(",")) throw new Error(`${source}: parameter '${name}' has shape [${t.shape}], expected [${shape}]`);
  }
  for (const name of params.keys()) {
    if (!expected.has(name)) throw new Error(`${source}: unexpected parameter '${name}'`);
  }
}

/** Positions from the attention mask (verl: cumsum(mask) - 1, clipped at 0), else 0..T-1. */
export function positionsFromMask(mask: ArrayLike<number> | undefined, B: number, T: number): Int32Array {
  const pos = new Int32Array(B * T);
  for (let b = 0; b < B; b++) {
    let c = 0;
    for (let t = 0; t < T; t++) {
      if (!mask) pos[b * T + t] = t;
      else { c += mask[b * T + t]!; pos[b * T + t] = Math.max(c - 1, 0); }
    }
  }
  return pos;
}

export { ropeInvFreq };

/** cos and sin of position * invFreq, laid out as HF does: the half-table repeated twice. */
export function ropeTables(positions: ArrayLike<number>, headDim: number, theta: number, scaling: RopeScaling | null = null): { cos: Float32Array; sin: Float32Array } {
  let maxPos = 0;
  for (let n = 0; n < positions.length; n++) maxPos = Math.max(maxPos, positions[n]!);
  const inv = ropeInvFreq(headDim, theta, scaling, maxPos + 1), h = headDim / 2;
  const cos = new Float32Array(positions.length * headDim), sin = new Float32Array(positions.length * headDim);
  for (let n = 0; n < positions.length; n++) {
    for (let i = 0; i < h; i++) {
      const a = Math.fround(positions[n]! * inv[i]!);
      cos[n * headDim + i] = cos[n * headDim + i + h] = Math.cos(a);
      sin[n * headDim + i] = sin[n * headDim + i + h] = Math.sin(a);
    }
  }
  return { cos, sin };
}

/** rotate_half as a matrix: x @ R = concat(-x[d/2:], x[:d/2]). */
export function rotateHalfMatrix(d: number): tf.Tensor2D {
  const r = new Float32Array(d * d), h = d / 2;
  for (let j = 0; j < h; j++) { r[(j + h) * d + j] = -1; r[j * d + j + h] = 1; }
  return tf.tensor2d(r, [d, d]);
}

/**
 * Per sequence, the first real column, when the mask is padding, real tokens,
 * padding (in that order): then real queries see exactly the keys from there to
 * themselves. Undefined when some sequence has a hole.
 */
export function contiguousKeyStart(mask: ArrayLike<number> | undefined, B: number, T: number): Int32Array | undefined {
  const start = new Int32Array(B);
  if (!mask) return start;
  for (let b = 0; b < B; b++) {
    let t = 0;
    while (t < T && mask[b * T + t] === 0) t++;
    start[b] = t;
    while (t < T && mask[b * T + t] !== 0) t++;
    while (t < T && mask[b * T + t] === 0) t++;
    if (t < T) return undefined;
  }
  return start;
}

/**
 * Additive attention bias [B, 1, T, 1, T]: 0 where query t may see key s (s <= t and s is real), else -1e9.
 * With a sliding `window` (transformers' sliding_window_overlay: kv_idx > q_idx - window), only the keys
 * t - window < s <= t: a query sees itself and the window - 1 columns before it.
 */
function attentionBias(mask: ArrayLike<number> | undefined, B: number, T: number, window: number | null = null): tf.Tensor {
  const bias = new Float32Array(B * T * T);
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      for (let s = 0; s < T; s++) {
        const visible = s <= t && (window === null || s > t - window) && (!mask || mask[b * T + s] !== 0);
        bias[(b * T + t) * T + s] = visible ? 0 : -1e9;
      }
    }
  }
  return tf.tensor(bias, [B, 1, T, 1, T]);
}

/** The per-forward constants every decoder layer reads (rebuilt from saved copies when a layer is recomputed). */
interface LayerContext {
  cos: tf.Tensor; sin: tf.Tensor; rot: tf.Tensor2D; bias: tf.Tensor;
  /** Sliding layers: their windowed bias, and their own rotary tables when their RoPE differs (Gemma 3). */
  slidingBias?: tf.Tensor; localCos?: tf.Tensor; localSin?: tf.Tensor;
  /** Packed input: gathers between packed token rows and the per-segment attention view. */
  toPadded?: tf.Tensor1D; toPacked?: tf.Tensor1D;
}

const CONTEXT_KEYS = ["cos", "sin", "rot", "bias", "slidingBias", "localCos", "localSin", "toPadded", "toPacked"] as const;

/** Host-side shape of the attention: batch and length of the (possibly per-segment) view. */
interface AttentionView { batch: number; seqLen: number; keyStart?: Int32Array }

/** The linear modules of one layer that run as one fused product. */
const QKV = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];

export class LlamaModel {
  /** False for the trunk of a value model saved without an (untied) lm_head. */
  readonly hasLmHead: boolean;
  private adapter: LoraAdapter | undefined;
  /** Recompute each decoder layer in the backward pass instead of keeping its activations. */
  gradientCheckpointing = false;
  private readonly disposeHooks: (() => void)[] = [];
  /** A view sharing another model's weights (the reference policy under LoRA): dispose leaves them alone. */
  private sharedWeights = false;

  constructor(readonly config: ModelConfig, readonly params: Map<string, tf.Variable>, opts: { lmHead?: boolean } = {}) {
    this.hasLmHead = opts.lmHead !== false || config.tieWordEmbeddings;
    checkParameters(parameterShapes(config, { lmHead: this.hasLmHead }), params, "LlamaModel");
  }

  p(name: string): tf.Variable {
    const v = this.params.get(name);
    if (!v) throw new Error(`LlamaModel: no parameter '${name}'`);
    return v;
  }

  /** The LoRA adapter, if any: while one is set, the base weights are frozen and only the adapter trains. */
  get lora(): LoraAdapter | undefined {
    return this.adapter;
  }

  set lora(adapter: LoraAdapter | undefined) {
    for (const v of this.params.values()) v.trainable = adapter === undefined;
    this.adapter = adapter;
  }

  /** The base model with the adapter off, sharing the weights (no copy): verl's reference policy under LoRA. */
  withoutAdapter(): LlamaModel {
    const m = new LlamaModel(this.config, this.params, { lmHead: this.hasLmHead });
    m.sharedWeights = true;
    m.gradientCheckpointing = this.gradientCheckpointing;
    return m;
  }

  /** What the optimizer trains, by name: the adapter under LoRA, else every weight. */
  trainableParams(): Map<string, tf.Variable> {
    return this.lora ? this.lora.namedParams() : this.params;
  }

  /** A weight or adapter tensor by full name. */
  private tensor(name: string): tf.Tensor {
    return this.params.get(name) ?? this.lora?.namedParams().get(name) ?? this.p(name);
  }

  /**
   * x through the fused linear modules `mods` of layer `i`: one product with the
   * concatenated base weights (frozen under LoRA: no weight gradient is formed),
   * plus each adapted module's scale * (x A^T) B^T (DoRA-scaled, and with the training pass's
   * adapter dropout `drop`, where the adapter has them).
   */
  private project(x: tf.Tensor, i: number, mods: string[], w: (n: string) => tf.Tensor, drop: AdapterDropout | null): tf.Tensor {
    const L = layerPrefix(this.config, i);
    const base = mods.map((m) => w(`${L}${m}.weight`) as tf.Tensor2D);
    const lora = this.lora;
    if (!lora) return linear(x, stackRows(base) as tf.Tensor2D);
    const names = mods.map((m) => `${L}${m}`);
    if (!names.some((n) => lora.has(n))) return frozenLinear(x, base);
    const inMasks = new Map<string, tf.Tensor2D>();
    const blocks = names.map((n, j) => (lora.has(n) ? lora.block(n, base[j]!, x.shape[0]!, w, drop, inMasks) : { w: base[j]! }));
    return loraLinear(x as tf.Tensor2D, blocks, lora.scale);
  }

  /** Names of what trains in layer `i` (the inputs a recomputed layer differentiates). */
  private layerTrainables(i: number): string[] {
    const p = layerPrefix(this.config, i);
    return [...this.trainableParams().keys()].filter((n) => n.startsWith(p));
  }

  /** RMSNorm with Gemma's (1 + w) weight where the family has it. */
  private norm(x: tf.Tensor, w: tf.Tensor): tf.Tensor {
    return rmsNorm(x, this.config.gemma ? tf.add(w, 1) : w, this.config.normEps); // w * x / sqrt(mean(x^2) + eps)
  }

  /** One decoder layer on token rows x [N, dim] (i >= nLayers: the decoder layer inside MTP layer i - nLayers). */
  private decoderLayer(i: number, x: tf.Tensor, ctx: LayerContext, view: AttentionView, w: (n: string) => tf.Tensor, drop: AdapterDropout | null, io: MoeIo = {}): tf.Tensor {
    const c = this.config, hd = c.headDim, g = c.nHeads / c.nKvHeads, N = x.shape[0]!;
    const { batch: B, seqLen: T } = view, L = layerPrefix(c, i);
    const sliding = layerWindow(c, i) !== null;
    // attention: one fused q/k/v projection, rotary on q and k together
    const n1 = this.norm(x, w(L + "input_layernorm.weight"));
    let qkv = this.project(n1, i, QKV, w, drop);
    if (c.attentionBias) qkv = qkv.add(stackRows(QKV.map((m) => w(`${L}${m}.bias`))));
    let [qk0, v0] = tf.split(qkv.reshape([N, c.nHeads + 2 * c.nKvHeads, hd]), [c.nHeads + c.nKvHeads, c.nKvHeads], 1);
    if (c.qkNorm) { // Qwen3 / Gemma 3: each head's q and k RMS-normed over head_dim before RoPE
      const [q, k] = tf.split(qk0!, [c.nHeads, c.nKvHeads], 1);
      qk0 = tf.concat([
        this.norm(q!.reshape([-1, hd]), w(L + "self_attn.q_norm.weight")).reshape([N, c.nHeads, hd]),
        this.norm(k!.reshape([-1, hd]), w(L + "self_attn.k_norm.weight")).reshape([N, c.nKvHeads, hd]),
      ], 1);
    }
    const cos = sliding && ctx.localCos ? ctx.localCos : ctx.cos, sin = sliding && ctx.localSin ? ctx.localSin : ctx.sin;
    let qk = applyRope(qk0!, cos, sin, ctx.rot), vv: tf.Tensor = v0!;
    // packed rows: attention runs per sequence, on a right-padded [segments, longest] view
    if (ctx.toPadded) { qk = tf.gather(qk, ctx.toPadded); vv = tf.gather(vv, ctx.toPadded); }
    const scale = c.gemma ? 1 / Math.sqrt(c.gemma.queryPreAttnScalar) : 1 / Math.sqrt(hd);
    // softmax(q k^T + bias) v on the token rows, computed in attention.ts to keep the backward pass lean; sliding layers see a window
    const shape = { batch: B, kvHeads: c.nKvHeads, group: g, seqLen: T, softcap: c.gemma?.attnSoftcap ?? null, scale };
    let att = tokenAttention(qk as tf.Tensor3D, vv as tf.Tensor3D, sliding ? ctx.slidingBias! : ctx.bias, shape, sliding ? undefined : view.keyStart);
    if (ctx.toPacked) att = tf.gather(att, ctx.toPacked);
    let ao = this.project(att, i, ["self_attn.o_proj"], w, drop);
    if (c.attentionOutBias) ao = ao.add(w(L + "self_attn.o_proj.bias"));
    // Gemma normalises the attention output before the residual, and has its own pre-feed-forward norm
    if (c.gemma) ao = this.norm(ao, w(L + "post_attention_layernorm.weight"));
    const h = x.add(ao);
    const n2 = this.norm(h, w(L + (c.gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")));
    let f = isSparseLayer(c, i) ? this.experts(n2, i, w, drop, io) : this.mlp(n2, i, "mlp.", w, drop);
    if (c.gemma) f = this.norm(f, w(L + "post_feedforward_layernorm.weight"));
    return h.add(f);
  }

  /** The gated feed-forward under `prefix` (mlp. or mlp.experts.e.): one fused gate/up product, act(gate) * up, down. */
  private mlp(x: tf.Tensor, i: number, prefix: string, w: (n: string) => tf.Tensor, drop: AdapterDropout | null): tf.Tensor {
    const c = this.config, L = layerPrefix(c, i) + prefix, bias = c.mlpBias && prefix === "mlp.";
    let gu = this.project(x, i, [prefix + "gate_proj", prefix + "up_proj"], w, drop) as tf.Tensor2D;
    if (bias) gu = gu.add(stackRows([w(L + "gate_proj.bias"), w(L + "up_proj.bias")])) as tf.Tensor2D;
    const hidden = c.gemma ? geGlu(gu) : swiGlu(gu); // gelu_tanh(gate) * up, or silu(gate) * up
    const out = this.project(hidden, i, [prefix + "down_proj"], w, drop);
    return bias ? out.add(w(L + "down_proj.bias")) : out;
  }

  /**
   * Qwen3-MoE's sparse block: router logits x W_gate^T, softmax, the top-k experts of each token
   * (their weights renormalised to 1 with norm_topk_prob), out = sum_k weight_k * expert_k(x).
   * Correct first: every expert runs on every token and unselected ones are weighted 0 (no
   * gather/scatter kernel yet), so the cost is numExperts / topK times a routed one.
   * Routing replay (io.replay) swaps the top-k for given experts; the weights stay the softmax's.
   */
  private experts(x: tf.Tensor, i: number, w: (n: string) => tf.Tensor, drop: AdapterDropout | null, io: MoeIo): tf.Tensor {
    const moe = this.config.moe!, N = x.shape[0]!;
    const logits = this.project(x, i, ["mlp.gate"], w, drop); // [N, E]
    if (io.logits) io.logits.push(tf.keep(logits));
    const probs = tf.softmax(logits);
    // replay: the forced experts' one-hot sum is the mask (a constant, as the router's own top-k mask is)
    // (a recording pass takes the top-k once, for the record and the mask)
    const forced = io.replay ? tf.tensor2d(io.replay, [N, moe.topK], "int32") : undefined;
    const idx = forced ?? (io.chosen ? tf.topk(probs, moe.topK).indices : undefined);
    if (io.chosen) io.chosen.push(tf.keep(idx!));
    const mask = idx ? tf.minimum(tf.oneHot(idx, moe.numExperts).sum(-2), 1).toFloat() : topKMask(probs, moe.topK);
    let weights = probs.mul(mask);
    if (moe.normTopkProb) weights = weights.div(weights.sum(-1, true));
    let out: tf.Tensor | undefined;
    for (let e = 0; e < moe.numExperts; e++) {
      const y = this.mlp(x, i, `mlp.experts.${e}.`, w, drop).mul(weights.slice([0, e], [-1, 1]));
      out = out ? out.add(y) : y;
    }
    return out!;
  }

  /** Per layer, the forced experts [N*topK] of `replay` [N, sparseLayers, topK] (undefined for dense layers), checked. */
  private replayByLayer(replay: ArrayLike<number>, N: number): (Int32Array | undefined)[] {
    const c = this.config, moe = c.moe;
    if (!moe) throw new Error("LlamaModel: replayExperts given to a model without experts (router replay needs a MoE model such as qwen3_moe)");
    const sparse = [...Array(c.nLayers).keys()].filter((i) => isSparseLayer(c, i)), S = sparse.length, K = moe.topK;
    if (replay.length !== N * S * K) throw new Error(`LlamaModel: replayExperts holds ${replay.length} values, ${N} tokens x ${S} sparse layers x top-${K} need ${N * S * K}`);
    for (let n = 0; n < replay.length; n++) {
      const e = replay[n]!;
      if (!Number.isInteger(e) || e < 0 || e >= moe.numExperts) throw new Error(`LlamaModel: replayExperts holds expert ${e}, outside [0, ${moe.numExperts})`);
    }
    const out: (Int32Array | undefined)[] = new Array(c.nLayers).fill(undefined);
    sparse.forEach((layer, j) => {
      const a = new Int32Array(N * K);
      for (let n = 0; n < N; n++) for (let k = 0; k < K; k++) a[n * K + k] = replay[(n * S + j) * K + k]!;
      out[layer] = a;
    });
    return out;
  }

  /**
   * Final-norm hidden states [B, T, dim]. With `opts.segments`, input_ids is [1, N]
   * holding several sequences back to back (padding removed): attention stays
   * within each sequence, and positions should restart per sequence.
   */
  hiddenStates(inputIds: tf.Tensor2D, opts: ForwardOptions = {}): tf.Tensor3D {
    const c = this.config, [B, T] = inputIds.shape, hd = c.headDim;
    return tf.tidy(() => {
      const mask = hostInts(opts.attentionMask, B, T, "attentionMask");
      const pos = hostInts(opts.positionIds, B, T, "positionIds") ?? positionsFromMask(mask, B, T);
      const seg = opts.segments ? segmentView(opts.segments, B, T) : undefined;
      const view: AttentionView = seg
        ? { batch: seg.count, seqLen: seg.maxLen, keyStart: new Int32Array(seg.count) }
        : { batch: B, seqLen: T, keyStart: contiguousKeyStart(mask, B, T) };
      const window = c.slidingLayers?.some(Boolean) ? c.slidingWindow! : null;
      // host-made, so kept across calls: the same micro-batch (log-probs, then the update; each PPO
      // epoch) reuses its tables, keyed by everything they are made from (engine/constants.ts)
      const viewMask = seg ? seg.mask : mask;
      const key = ["llama-ctx", hd, c.ropeTheta, JSON.stringify(c.ropeScaling ?? null), JSON.stringify(c.localRope ?? null), window, B, T,
        seg ? exactKey(opts.segments!) : "-", exactKey(pos), viewMask ? exactKey(Array.from(viewMask, (m) => (m !== 0 ? 1 : 0))) : "-"].join("|");
      const has: Partial<Record<(typeof CONTEXT_KEYS)[number], boolean>> = { rot: false, slidingBias: window !== null, localCos: !!c.localRope, localSin: !!c.localRope, toPadded: !!seg, toPacked: !!seg };
      const tableKeys = CONTEXT_KEYS.filter((k) => has[k] ?? true); // what the cache holds, in order
      const tables = cachedTensors(key, () => {
        const rope = ropeTables(pos, hd, c.ropeTheta, c.ropeScaling ?? null);
        const local = c.localRope ? ropeTables(pos, hd, c.localRope.theta, c.localRope.scaling) : undefined;
        const made: Partial<Record<(typeof CONTEXT_KEYS)[number], tf.Tensor>> = {
          cos: tf.tensor(rope.cos, [B * T, 1, hd]), sin: tf.tensor(rope.sin, [B * T, 1, hd]),
          bias: attentionBias(viewMask, view.batch, view.seqLen),
          ...(window !== null ? { slidingBias: attentionBias(viewMask, view.batch, view.seqLen, window) } : {}),
          ...(local ? { localCos: tf.tensor(local.cos, [B * T, 1, hd]), localSin: tf.tensor(local.sin, [B * T, 1, hd]) } : {}),
          ...(seg ? { toPadded: tf.tensor1d(seg.toPadded, "int32"), toPacked: tf.tensor1d(seg.toPacked, "int32") } : {}),
        };
        return tableKeys.map((k) => made[k]!);
      });
      const built: Partial<Record<(typeof CONTEXT_KEYS)[number], tf.Tensor>> = {
        ...Object.fromEntries(tableKeys.map((k, j) => [k, tables[j]!])),
        rot: tf.clone(constTensor(`rotateHalf:${hd}`, () => rotateHalfMatrix(hd))), // depends on head_dim alone
      };
      const keys = CONTEXT_KEYS.filter((k) => built[k] !== undefined);
      const consts = keys.map((k) => built[k]!);
      const context = (cs: tf.Tensor[]): LayerContext => Object.fromEntries(keys.map((k, j) => [k, cs[j]!])) as unknown as LayerContext;
      const ctx = context(consts);
      const plain = (n: string) => this.tensor(n);
      const replay = opts.replayExperts ? this.replayByLayer(opts.replayExperts, B * T) : undefined;
      // captured now: a layer recomputed in the backward pass (after the training pass) redraws the same masks
      const drop = this.lora?.activeDropout() ?? null;

      let x: tf.Tensor = tf.gather(this.p("model.embed_tokens.weight"), inputIds.reshape([-1]).toInt()); // [B*T, dim]
      if (c.gemma) x = x.mul(Math.fround(Math.sqrt(c.dim))); // Gemma scales the embeddings by sqrt(hidden_size)
      for (let i = 0; i < c.nLayers; i++) {
        const io: MoeIo = { logits: opts.routerLogits, chosen: opts.routedExperts, replay: replay?.[i] };
        // a sparse layer whose router logits or experts are collected keeps its activations: not recomputed
        if (!this.gradientCheckpointing || ((opts.routerLogits || opts.routedExperts) && isSparseLayer(c, i))) { x = this.decoderLayer(i, x, ctx, view, plain, drop, io); continue; }
        // recompute in backward: only the layer's input (and the shared constants) stays alive
        const names = this.layerTrainables(i);
        x = checkpoint((xs, ps, cs) => {
          const given = new Map(names.map((n, j) => [n, ps[j]!]));
          return this.decoderLayer(i, xs, context(cs), view, (n) => given.get(n) ?? this.tensor(n), drop, { replay: io.replay });
        }, x, names.map(plain), consts);
      }
      if (opts.mtp) opts.mtp.hidden.push(tf.keep(this.mtpLayer(x, opts.mtp, ctx, view, plain, drop).reshape([B, T, c.dim])));
      return this.norm(x, this.p("model.norm.weight")).reshape([B, T, c.dim]) as tf.Tensor3D;
    });
  }

  /**
   * MiMo's MTP layer 0 on the trunk's pre-norm rows h [N, dim]: input_proj(concat(hidden_layernorm(h),
   * token_layernorm(embed(next)))), one Qwen2 decoder layer with the trunk's positions and mask, final_layernorm.
   */
  private mtpLayer(h: tf.Tensor, mtp: MtpInputs, ctx: LayerContext, view: AttentionView, w: (n: string) => tf.Tensor, drop: AdapterDropout | null): tf.Tensor {
    const c = this.config, N = h.shape[0]!;
    if (!c.mtpLayers) throw new Error("LlamaModel: MTP asked of a model without multi-token-prediction layers (num_nextn_predict_layers is 0 or absent; MiMo has them)");
    if (mtp.nextIds.length !== N) throw new Error(`LlamaModel: mtp.nextIds holds ${mtp.nextIds.length} ids, the forward has ${N} tokens`);
    const P = layerPrefix(c, c.nLayers);
    let e: tf.Tensor = tf.gather(this.p("model.embed_tokens.weight"), tf.tensor1d(Int32Array.from(mtp.nextIds), "int32"));
    let hh = h;
    if (mtp.detachEncoder) { e = detach(e); hh = detach(h); }
    const joined = tf.concat([this.norm(hh, w(P + "hidden_layernorm.weight")), this.norm(e, w(P + "token_layernorm.weight"))], 1);
    const x = this.project(joined, c.nLayers, ["input_proj"], w, drop);
    return this.norm(this.decoderLayer(c.nLayers, x, ctx, view, w, drop), w(P + "final_layernorm.weight"));
  }

  /** The output projection weight [vocab, dim] (the embedding when tied). */
  lmHeadWeight(): tf.Variable {
    if (!this.hasLmHead) throw new Error("LlamaModel: this trunk has no lm_head (it belongs to a value model)");
    return this.p(this.config.tieWordEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  }

  /** Logits [..., vocab] for hidden states [..., dim] (soft-capped where the family says: Gemma 2's final_logit_softcapping). */
  lmHead(hidden: tf.Tensor): tf.Tensor {
    const cap = this.config.gemma?.finalSoftcap ?? null;
    const logits = this.rawLmHead(hidden);
    return cap === null ? logits : tf.tidy(() => softcap(logits, cap));
  }

  private rawLmHead(hidden: tf.Tensor): tf.Tensor {
    const w = this.lmHeadWeight() as tf.Tensor2D;
    const lora = this.lora;
    if (lora?.has("lm_head")) {
      return tf.tidy(() => {
        const x = hidden.reshape([-1, w.shape[1]]) as tf.Tensor2D;
        const y = loraLinear(x, [lora.block("lm_head", w, x.shape[0], (n) => this.tensor(n), lora.activeDropout())], lora.scale);
        return y.reshape([...hidden.shape.slice(0, -1), w.shape[0]]);
      });
    }
    return this.lora ? frozenLinear(hidden, w) : linear(hidden, w);
  }

  /** Logits [B, T, vocab]. */
  forward(inputIds: tf.Tensor2D, opts: ForwardOptions = {}): tf.Tensor3D {
    return tf.tidy(() => this.lmHead(this.hiddenStates(inputIds, opts)) as tf.Tensor3D);
  }

  /**
   * MiMo: the trunk's logits and the first MTP layer's, both [B, T, vocab]; the MTP logits at t
   * predict the token at t+2 from the trunk's state at t and the token at t+1. `nextIds` [B*T]
   * defaults to input_ids rolled left by one per row (the last column reads id 0: mask it).
   */
  forwardWithMtp(inputIds: tf.Tensor2D, opts: ForwardOptions & { nextIds?: ArrayLike<number>; detachEncoder?: boolean } = {}): { logits: tf.Tensor3D; mtpLogits: tf.Tensor3D } {
    const [B, T] = inputIds.shape;
    let next = opts.nextIds;
    if (!next) {
      const ids = inputIds.dataSync(), rolled = new Int32Array(B * T);
      for (let b = 0; b < B; b++) for (let t = 0; t + 1 < T; t++) rolled[b * T + t] = ids[b * T + t + 1]!;
      next = rolled;
    }
    const mtp: MtpInputs = { nextIds: next, detachEncoder: opts.detachEncoder, hidden: [] };
    return tf.tidy(() => {
      const logits = this.lmHead(this.hiddenStates(inputIds, { ...opts, mtp })) as tf.Tensor3D;
      const mtpLogits = this.lmHead(mtp.hidden[0]!) as tf.Tensor3D;
      tf.dispose(mtp.hidden);
      return { logits, mtpLogits };
    });
  }

  trainableVariables(): tf.Variable[] {
    return [...this.trainableParams().values()];
  }

  /** Run `fn` when the model is disposed (caches derived from its weights release themselves). */
  onDispose(fn: () => void): void {
    this.disposeHooks.push(fn);
  }

  dispose(): void {
    for (const fn of this.disposeHooks.splice(0)) fn();
    if (this.sharedWeights) return;
    this.lora?.dispose();
    for (const v of this.params.values()) v.dispose();
    this.params.clear();
  }
}

/** Wrap named tensors as trainable float32 variables (the caller still owns, and may dispose, `tensors`). */
export function toVariables(tensors: Map<string, tf.Tensor>): Map<string, tf.Variable> {
  const vars = new Map<string, tf.Variable>();
  for (const [name, t] of tensors) {
    const f = t.dtype === "float32" ? t.clone() : t.toFloat();
    // tfjs variable names are global: a serial keeps two models from colliding.
    vars.set(name, tf.variable(f, true, `${name}#${variableSerial++}`));
    f.dispose();
  }
  return vars;
}
let variableSerial = 0;
