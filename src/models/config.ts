// The architecture hyper-parameters of a decoder (the families of families.ts),
// and their mapping to and from a Hugging Face config.json.
import { FAMILIES, readFamilyConfig, SUPPORTED_ARCHITECTURES, type Family } from "./families.js";
import { ropeToHf, type RopeScaling } from "./rope.js";
import { parameterShapes } from "./shapes.js";

/** Qwen3-MoE's sparse feed-forward: top-k of numExperts SwiGLU experts per token. */
export interface MoeConfig {
  numExperts: number;
  /** num_experts_per_tok */
  topK: number;
  /** moe_intermediate_size (each expert's SwiGLU width) */
  intermediateSize: number;
  /** renormalise the top-k routing weights to sum to 1 */
  normTopkProb: boolean;
  /** per layer: sparse (experts) or a dense MLP of intermediate_size (decoder_sparse_step, mlp_only_layers) */
  sparseLayers: boolean[];
  /** router_aux_loss_coef: weight of the load-balancing loss in the training loss */
  routerAuxLossCoef: number;
  /** output_router_logits as config.json says (written back on export) */
  outputRouterLogits: boolean;
}

/** Gemma's attention and output details. */
export interface GemmaConfig {
  /** attn_logit_softcapping: scores become cap * tanh(scores / cap); null = off */
  attnSoftcap: number | null;
  /** final_logit_softcapping: the same on the logits */
  finalSoftcap: number | null;
  /** queries scale by query_pre_attn_scalar^-0.5 instead of head_dim^-0.5 */
  queryPreAttnScalar: number;
}

export interface ModelConfig {
  vocabSize: number;
  /** hidden_size */
  dim: number;
  /** intermediate_size (SwiGLU width) */
  hiddenDim: number;
  nLayers: number;
  nHeads: number;
  /** key/value heads (grouped-query attention when < nHeads) */
  nKvHeads: number;
  maxSeqLen: number;
  ropeTheta: number;
  /** rope scaling (linear, dynamic, llama3); null or absent = plain RoPE */
  ropeScaling?: RopeScaling | null;
  normEps: number;
  /** output projection shares the token embedding */
  tieWordEmbeddings: boolean;
  /** q/k/v projections carry biases (Qwen2) */
  attentionBias: boolean;
  headDim: number;
  /** HF model_type (the family, families.ts) written on save; "qwen2" when attentionBias, else "llama" unless set */
  modelType?: Family;
  /** o_proj carries a bias (attention_bias in Llama, Qwen3, Gemma) */
  attentionOutBias?: boolean;
  /** gate/up/down projections carry biases (Llama mlp_bias) */
  mlpBias?: boolean;
  /** per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3) */
  qkNorm?: boolean;
  /** attention window of the sliding layers: a query sees itself and the window - 1 keys before it */
  slidingWindow?: number;
  /** per layer: sliding-window attention (else full) */
  slidingLayers?: boolean[];
  /** RoPE of the sliding layers when it differs from the full layers' (Gemma 3's local base) */
  localRope?: { theta: number; scaling: RopeScaling | null };
  /** Gemma: (1 + w) norms, GeGLU, scaled embeddings, sandwich norms, soft-capping */
  gemma?: GemmaConfig;
  /** Qwen3-MoE experts */
  moe?: MoeConfig;
  /** MiMo: multi-token-prediction layers (num_nextn_predict_layers), model.mtp_layers.0.. ; absent or 0 = none */
  mtpLayers?: number;
  bosTokenId?: number | null;
  eosTokenId?: number | number[] | null;
  padTokenId?: number | null;
}

/** A config with defaults filled in and the invariants checked. */
export function makeConfig(c: Partial<ModelConfig> & Pick<ModelConfig, "vocabSize" | "dim" | "nLayers" | "nHeads">): ModelConfig {
  const cfg: ModelConfig = {
    hiddenDim: c.hiddenDim ?? 4 * c.dim,
    nKvHeads: c.nKvHeads ?? c.nHeads,
    maxSeqLen: c.maxSeqLen ?? 2048,
    ropeTheta: c.ropeTheta ?? 10000,
    normEps: c.normEps ?? 1e-5,
    tieWordEmbeddings: c.tieWordEmbeddings ?? true,
    attentionBias: c.attentionBias ?? false,
    headDim: c.headDim ?? c.dim / c.nHeads,
    ...c,
  } as ModelConfig;
  validateConfig(cfg);
  return cfg;
}

export function validateConfig(c: ModelConfig): void {
  const ints: (keyof ModelConfig)[] = ["vocabSize", "dim", "hiddenDim", "nLayers", "nHeads", "nKvHeads", "maxSeqLen", "headDim"];
  for (const k of ints) {
    const v = c[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) throw new Error(`model config: ${k} must be a positive integer, got ${String(v)}`);
  }
  if (c.nHeads % c.nKvHeads !== 0) throw new Error(`model config: nHeads (${c.nHeads}) must be a multiple of nKvHeads (${c.nKvHeads})`);
  if (c.headDim % 2 !== 0) throw new Error(`model config: headDim (${c.headDim}) must be even for rotary embeddings`);
  if (!(c.ropeTheta > 0) || !(c.normEps > 0)) throw new Error("model config: ropeTheta and normEps must be positive");
  if (c.slidingLayers && c.slidingLayers.length !== c.nLayers) throw new Error(`model config: slidingLayers lists ${c.slidingLayers.length} layers, the model has ${c.nLayers}`);
  if (c.slidingLayers?.some(Boolean) && !(Number.isInteger(c.slidingWindow) && c.slidingWindow! > 0)) throw new Error(`model config: sliding layers need a positive integer slidingWindow, got ${String(c.slidingWindow)}`);
  if (c.mtpLayers !== undefined && !(Number.isInteger(c.mtpLayers) && c.mtpLayers >= 0)) throw new Error(`model config: mtpLayers must be a non-negative integer, got ${String(c.mtpLayers)}`);
  if (c.mtpLayers && familyOfConfig(c) !== "mimo") throw new Error(`model config: multi-token-prediction layers are built for MiMo only (modelType 'mimo'), not ${familyOfConfig(c)}`);
  if (c.moe && c.moe.sparseLayers.length !== c.nLayers) throw new Error(`model config: moe.sparseLayers lists ${c.moe.sparseLayers.length} layers, the model has ${c.nLayers}`);
}

/** The family of a config (llama unless it says otherwise; biased q/k/v without one means Qwen2). */
export function familyOfConfig(c: ModelConfig): Family {
  return c.modelType ?? (c.attentionBias ? "qwen2" : "llama");
}

/** The attention window of layer `i` (null: full attention). */
export function layerWindow(c: ModelConfig, i: number): number | null {
  return c.slidingLayers?.[i] ? c.slidingWindow! : null;
}

/** The rotary theta and scaling of layer `i`. */
export function layerRope(c: ModelConfig, i: number): { theta: number; scaling: RopeScaling | null } {
  return c.localRope && c.slidingLayers?.[i] ? c.localRope : { theta: c.ropeTheta, scaling: c.ropeScaling ?? null };
}

/** Whether layer `i` has experts. */
export function isSparseLayer(c: ModelConfig, i: number): boolean {
  return c.moe?.sparseLayers[i] ?? false;
}

/** How many layers route to experts (0 for a dense model): routed_experts' sparse-layer dimension. */
export function sparseLayerCount(c: ModelConfig): number {
  return c.moe ? c.moe.sparseLayers.filter(Boolean).length : 0;
}

/** The number of parameters (embedding counted once when tied). */
export function numParams(c: ModelConfig): number {
  let n = 0;
  for (const shape of parameterShapes(c).values()) n += shape.reduce((a, b) => a * b, 1);
  return n;
}

type Json = Record<string, unknown>;

export { SUPPORTED_ARCHITECTURES };

/** Parse a Hugging Face config.json object (any family of families.ts). `file` names the source in errors. */
export function fromHfConfig(j: Json, file = "config.json"): ModelConfig {
  return makeConfig(readFamilyConfig(j, file));
}

/** A config.json object that transformers reads back as the same architecture (same family, same flags). */
export function toHfConfig(c: ModelConfig, opts: { valueHead?: boolean } = {}): Json {
  const family = familyOfConfig(c), spec = FAMILIES[family];
  if (spec.qkvBiasAlways && !c.attentionBias) throw new Error("toHfConfig: Qwen2 always has q/k/v biases; set attentionBias or modelType 'llama'");
  if (spec.qkvBiasAlways && c.attentionOutBias) throw new Error("toHfConfig: Qwen2 has no o_proj bias");
  if (!spec.qkvBiasAlways && c.attentionBias !== (c.attentionOutBias ?? c.attentionBias) && family !== "llama") {
    throw new Error(`toHfConfig: ${family}'s attention_bias biases q, k, v and o together`);
  }
  if (family === "llama" && c.attentionBias && c.attentionOutBias === false) {
    throw new Error("toHfConfig: a Llama with q/k/v biases but no o_proj bias has no transformers architecture (save it as modelType 'qwen2')");
  }
  if (c.mlpBias && family !== "llama") throw new Error(`toHfConfig: only Llama has mlp_bias, not ${family}`);
  if (c.qkNorm !== undefined && c.qkNorm !== spec.qkNorm) throw new Error(`toHfConfig: ${family} ${spec.qkNorm ? "always has" : "has no"} q/k norms`);
  const arch = opts.valueHead ? spec.aliases.find((a) => a.endsWith("ForTokenClassification")) : spec.arch;
  if (!arch) throw new Error(`toHfConfig: ${family} has no *ForTokenClassification class to save a value model as`);
  const rope = c.localRope
    ? { rope_parameters: { full_attention: ropeToHf(c.ropeTheta, c.ropeScaling ?? null)["rope_parameters"], sliding_attention: ropeToHf(c.localRope.theta, c.localRope.scaling)["rope_parameters"] },
        rope_theta: c.ropeTheta, rope_local_base_freq: c.localRope.theta, rope_scaling: ropeToHf(c.ropeTheta, c.ropeScaling ?? null)["rope_scaling"] }
    : ropeToHf(c.ropeTheta, c.ropeScaling ?? null);
  const j: Json = {
    architectures: [arch],
    model_type: family,
    vocab_size: c.vocabSize,
    hidden_size: c.dim,
    intermediate_size: c.hiddenDim,
    num_hidden_layers: c.nLayers,
    num_attention_heads: c.nHeads,
    num_key_value_heads: c.nKvHeads,
    head_dim: c.headDim,
    max_position_embeddings: c.maxSeqLen,
    ...rope,
    rms_norm_eps: c.normEps,
    tie_word_embeddings: c.tieWordEmbeddings,
    [spec.gemma ? "hidden_activation" : "hidden_act"]: spec.act,
    initializer_range: 0.02,
    torch_dtype: "float32",
    use_cache: true,
    attention_dropout: 0.0,
    bos_token_id: c.bosTokenId ?? null,
    eos_token_id: c.eosTokenId ?? null,
    pad_token_id: c.padTokenId ?? null,
  };
  if (!spec.qkvBiasAlways && family !== "mistral") j["attention_bias"] = c.attentionBias;
  if (family === "llama") { j["mlp_bias"] = c.mlpBias ?? false; j["pretraining_tp"] = 1; }
  // sliding window: the window and which layers use it, in the keys each config class reads
  const sliding = c.slidingLayers ?? new Array<boolean>(c.nLayers).fill(false);
  const anySliding = sliding.some(Boolean);
  if (family !== "llama") j["sliding_window"] = anySliding ? c.slidingWindow! : null;
  if (family === "mistral" && anySliding && !sliding.every(Boolean)) throw new Error("toHfConfig: Mistral's sliding window applies to every layer");
  if (family === "qwen2" || family === "mimo" || family === "qwen3" || family === "qwen3_moe") {
    const first = sliding.indexOf(true);
    if (anySliding && !sliding.every((s, i) => s === i >= first)) throw new Error(`toHfConfig: ${family}'s sliding layers must be the last ones (from max_window_layers on)`);
    j["use_sliding_window"] = anySliding;
    j["max_window_layers"] = anySliding ? first : c.nLayers;
  }
  if (family !== "llama" && family !== "mistral") j["layer_types"] = sliding.map((s) => (s ? "sliding_attention" : "full_attention"));
  if (c.gemma) {
    j["attn_logit_softcapping"] = c.gemma.attnSoftcap;
    j["final_logit_softcapping"] = c.gemma.finalSoftcap;
    j["query_pre_attn_scalar"] = c.gemma.queryPreAttnScalar;
  }
  if (c.moe) {
    Object.assign(j, {
      num_experts: c.moe.numExperts, num_experts_per_tok: c.moe.topK, moe_intermediate_size: c.moe.intermediateSize,
      norm_topk_prob: c.moe.normTopkProb, router_aux_loss_coef: c.moe.routerAuxLossCoef, output_router_logits: c.moe.outputRouterLogits,
      decoder_sparse_step: 1, mlp_only_layers: c.moe.sparseLayers.flatMap((s, i) => (s ? [] : [i])),
    });
  }
  if (family === "mimo") j["num_nextn_predict_layers"] = c.mtpLayers ?? 0;
  if (opts.valueHead) { j["num_labels"] = 1; j["id2label"] = { "0": "LABEL_0" }; j["label2id"] = { LABEL_0: 0 }; }
  return j;
}
