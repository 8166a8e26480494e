// The model families verl-ts runs, as data: what each Hugging Face config.json
// means for the shared decoder in llama.ts. A family is one row of FAMILIES (its
// architecture name and the math it switches on); the flags a config.json can set
// are read by name in readFamilyConfig, and a value that would change the math in
// a way not built is refused by name rather than run as something else.
import type { ModelConfig, MoeConfig } from "./config.js";
import { readRopeConfig, type RopeScaling } from "./rope.js";

export type Family = "llama" | "qwen2" | "mimo" | "mistral" | "qwen3" | "qwen3_moe" | "gemma2" | "gemma3_text";

export interface FamilySpec {
  /** the *ForCausalLM class transformers builds */
  arch: string;
  /** other architecture names that mean this family (value models, the multimodal wrapper's text part) */
  aliases: string[];
  /** q/k/v biases whatever attention_bias says (Qwen2) */
  qkvBiasAlways: boolean;
  /** per-head RMSNorm on q and k before RoPE (Qwen3, Gemma 3) */
  qkNorm: boolean;
  /** Gemma: (1 + w) RMSNorm, GeGLU, sqrt(hidden) embedding scale, pre/post feed-forward norms */
  gemma: boolean;
  /** tie_word_embeddings when config.json leaves it out (the config class's default) */
  tiedByDefault: boolean;
  /** the keys that name the activation, with the one value built */
  act: "silu" | "gelu_pytorch_tanh";
}

export const FAMILIES: Record<Family, FamilySpec> = {
  llama: { arch: "LlamaForCausalLM", aliases: ["LlamaForTokenClassification"], qkvBiasAlways: false, qkNorm: false, gemma: false, tiedByDefault: false, act: "silu" },
  qwen2: { arch: "Qwen2ForCausalLM", aliases: ["Qwen2ForTokenClassification"], qkvBiasAlways: true, qkNorm: false, gemma: false, tiedByDefault: false, act: "silu" },
  // MiMo: Qwen2's decoder plus multi-token-prediction layers (model.mtp_layers.*, num_nextn_predict_layers)
  mimo: { arch: "MiMoForCausalLM", aliases: [], qkvBiasAlways: true, qkNorm: false, gemma: false, tiedByDefault: false, act: "silu" },
  mistral: { arch: "MistralForCausalLM", aliases: ["MistralForTokenClassification"], qkvBiasAlways: false, qkNorm: false, gemma: false, tiedByDefault: false, act: "silu" },
  qwen3: { arch: "Qwen3ForCausalLM", aliases: ["Qwen3ForTokenClassification"], qkvBiasAlways: false, qkNorm: true, gemma: false, tiedByDefault: false, act: "silu" },
  qwen3_moe: { arch: "Qwen3MoeForCausalLM", aliases: ["Qwen3MoeForTokenClassification"], qkvBiasAlways: false, qkNorm: true, gemma: false, tiedByDefault: false, act: "silu" },
  gemma2: { arch: "Gemma2ForCausalLM", aliases: ["Gemma2ForTokenClassification"], qkvBiasAlways: false, qkNorm: false, gemma: true, tiedByDefault: true, act: "gelu_pytorch_tanh" },
  gemma3_text: { arch: "Gemma3ForCausalLM", aliases: ["Gemma3TextForTokenClassification"], qkvBiasAlways: false, qkNorm: true, gemma: true, tiedByDefault: true, act: "gelu_pytorch_tanh" },
};

export const SUPPORTED_ARCHITECTURES: string[] = Object.values(FAMILIES).flatMap((f) => [f.arch, ...f.aliases]);

type Json = Record<string, unknown>;

/** The family a config.json names: model_type first (a scratch override sets it), else architectures. */
export function familyOf(j: Json, file: string): Family {
  const archs = Array.isArray(j["architectures"]) ? (j["architectures"] as unknown[]).map(String) : [];
  const mt = typeof j["model_type"] === "string" ? (j["model_type"] as string) : undefined;
  if (mt !== undefined && mt in FAMILIES) return mt as Family;
  for (const [name, f] of Object.entries(FAMILIES)) if (archs.some((a) => a === f.arch || f.aliases.includes(a))) return name as Family;
  const hint = mt === "gemma3" ? " (a Gemma 3 multimodal folder: only its text model, Gemma3ForCausalLM / model_type gemma3_text, is supported)" : "";
  throw new Error(`${file}: unsupported model (architectures ${JSON.stringify(archs)}, model_type ${String(mt)})${hint}; supported: ${Object.keys(FAMILIES).join(", ")} (${SUPPORTED_ARCHITECTURES.join(", ")})`);
}

function num(j: Json, key: string, file: string, fallback?: number): number {
  const v = j[key];
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new Error(`${file}: missing '${key}'`);
  }
  if (typeof v !== "number") throw new Error(`${file}: '${key}' must be a number, got ${JSON.stringify(v)}`);
  return v;
}

function bool(j: Json, key: string, file: string, fallback: boolean): boolean {
  const v = j[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "boolean") throw new Error(`${file}: '${key}' must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

function optNum(j: Json, key: string, file: string): number | null {
  const v = j[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== "number" || !(v > 0)) throw new Error(`${file}: '${key}' must be a positive number or null, got ${JSON.stringify(v)}`);
  return v;
}

/** Refuse a key whose value would change the math in a way verl-ts does not build. */
function refuse(j: Json, key: string, file: string, ok: (v: unknown) => boolean, why: string): void {
  if (key in j && !ok(j[key])) throw new Error(`${file}: ${key}=${JSON.stringify(j[key])} is not supported (${why})`);
}

const off = (v: unknown) => v === undefined || v === null || v === false || v === 0;

/**
 * Per-layer attention kinds: `layer_types` when config.json has it (transformers >= 4.53 writes it),
 * else what each family's config class derives from its older keys.
 */
function layerTypes(j: Json, family: Family, nLayers: number, window: number | null, file: string): boolean[] {
  const lt = j["layer_types"];
  if (lt !== undefined && lt !== null) {
    if (!Array.isArray(lt) || lt.length !== nLayers) throw new Error(`${file}: layer_types must list ${nLayers} entries (num_hidden_layers), got ${JSON.stringify(lt)}`);
    return lt.map((t, i) => {
      if (t !== "full_attention" && t !== "sliding_attention") throw new Error(`${file}: layer_types[${i}]=${JSON.stringify(t)} is not supported (full_attention or sliding_attention)`);
      if (t === "sliding_attention" && window === null) throw new Error(`${file}: layer_types[${i}] is sliding_attention but sliding_window is null`);
      return t === "sliding_attention";
    });
  }
  const all = (f: (i: number) => boolean) => Array.from({ length: nLayers }, (_, i) => window !== null && f(i));
  switch (family) {
    case "mistral": return all(() => true);
    case "qwen2": case "mimo": case "qwen3": case "qwen3_moe": {
      const from = num(j, "max_window_layers", file, nLayers);
      return all((i) => bool(j, "use_sliding_window", file, false) && i >= from);
    }
    case "gemma2": return all((i) => (i + 1) % 2 !== 0);
    case "gemma3_text": {
      const pattern = num(j, "sliding_window_pattern", file, num(j, "_sliding_window_pattern", file, 6));
      return all((i) => (i + 1) % pattern !== 0);
    }
    default: return all(() => false);
  }
}

/** The window a family's config.json means for its sliding layers (null: every layer is full attention). */
function slidingWindow(j: Json, family: Family, file: string): number | null {
  const w = optNum(j, "sliding_window", file);
  // Qwen's configs carry a sliding_window that is off unless use_sliding_window says so.
  if ((family === "qwen2" || family === "mimo" || family === "qwen3" || family === "qwen3_moe") && !bool(j, "use_sliding_window", file, false)) return null;
  if (w !== null && !Number.isInteger(w)) throw new Error(`${file}: sliding_window must be an integer, got ${w}`);
  return w;
}

/** Gemma 3's two RoPE bases: per layer type in transformers 5, rope_theta + rope_local_base_freq in 4. */
function gemma3Rope(j: Json, file: string, maxPos: number): { full: { theta: number; scaling: RopeScaling | null }; sliding: { theta: number; scaling: RopeScaling | null } } {
  const rp = j["rope_parameters"] as Json | undefined | null;
  if (rp && typeof rp === "object" && ("full_attention" in rp || "sliding_attention" in rp)) {
    const part = (k: string) => {
      const p = rp[k];
      if (!p || typeof p !== "object") throw new Error(`${file}: rope_parameters.${k} must be an object`);
      return readRopeConfig({ rope_parameters: p }, `${file} (rope_parameters.${k})`, maxPos);
    };
    return { full: part("full_attention"), sliding: part("sliding_attention") };
  }
  return {
    full: readRopeConfig({ ...j, rope_theta: j["rope_theta"] ?? 1_000_000 }, file, maxPos),
    sliding: { theta: num(j, "rope_local_base_freq", file, 10_000), scaling: null },
  };
}

function readMoe(j: Json, nLayers: number, file: string): MoeConfig {
  const numExperts = num(j, "num_experts", file, num(j, "num_local_experts", file, 0));
  if (!Number.isInteger(numExperts) || numExperts < 1) throw new Error(`${file}: num_experts must be a positive integer for qwen3_moe, got ${numExperts}`);
  const topK = num(j, "num_experts_per_tok", file, 8);
  if (!Number.isInteger(topK) || topK < 1 || topK > numExperts) throw new Error(`${file}: num_experts_per_tok must be an integer in [1, ${numExperts}], got ${topK}`);
  const step = num(j, "decoder_sparse_step", file, 1);
  if (!Number.isInteger(step) || step < 1) throw new Error(`${file}: decoder_sparse_step must be a positive integer, got ${step}`);
  const only = j["mlp_only_layers"] ?? [];
  if (!Array.isArray(only) || !only.every((i) => Number.isInteger(i))) throw new Error(`${file}: mlp_only_layers must be a list of layer indices, got ${JSON.stringify(only)}`);
  const sparseLayers = Array.from({ length: nLayers }, (_, i) => !(only as number[]).includes(i) && (i + 1) % step === 0);
  refuse(j, "shared_expert_intermediate_size", file, off, "Qwen3-MoE has no shared expert");
  return {
    numExperts, topK, sparseLayers,
    intermediateSize: num(j, "moe_intermediate_size", file),
    normTopkProb: bool(j, "norm_topk_prob", file, false),
    routerAuxLossCoef: num(j, "router_aux_loss_coef", file, 0.001),
    outputRouterLogits: bool(j, "output_router_logits", file, false),
  };
}

/** A config.json object as a ModelConfig (before defaults and checks; makeConfig applies those). */
export function readFamilyConfig(j: Json, file: string): Partial<ModelConfig> & Pick<ModelConfig, "vocabSize" | "dim" | "nLayers" | "nHeads"> {
  const family = familyOf(j, file), spec = FAMILIES[family];
  const dim = num(j, "hidden_size", file), nHeads = num(j, "num_attention_heads", file), nLayers = num(j, "num_hidden_layers", file);
  const maxSeqLen = num(j, "max_position_embeddings", file, 2048);
  // flags no family here builds
  refuse(j, "attention_dropout", file, off, "dropout in attention is not built; set it to 0.0");
  refuse(j, "use_bidirectional_attention", file, off, "verl-ts trains causal decoders");
  refuse(j, "pretraining_tp", file, (v) => off(v) || v === 1, "only 1: the split is an inference detail that changes the sums");
  const act = j[spec.gemma ? "hidden_activation" : "hidden_act"] ?? (spec.gemma ? j["hidden_act"] : undefined) ?? spec.act;
  if (act !== spec.act && !(spec.gemma && act === "gelu_pytorch_tanh")) {
    throw new Error(`${file}: ${spec.gemma ? "hidden_activation" : "hidden_act"}=${JSON.stringify(act)} is not supported for ${family} (only ${spec.act})`);
  }
  if (!spec.gemma) {
    refuse(j, "attn_logit_softcapping", file, off, `${family} has no attention soft-capping`);
    refuse(j, "final_logit_softcapping", file, off, `${family} has no logit soft-capping`);
    refuse(j, "query_pre_attn_scalar", file, off, `${family} scales queries by 1/sqrt(head_dim)`);
  }
  if (family !== "llama") refuse(j, "mlp_bias", file, off, `only Llama's MLP has biases`);
  if (family === "qwen2" || family === "mimo" || family === "mistral") refuse(j, "attention_bias", file, (v) => off(v) || (family !== "mistral" && v === true), `${family}'s attention biases are fixed by the architecture`);
  if (family !== "mimo") refuse(j, "num_nextn_predict_layers", file, off, `multi-token-prediction layers are built for MiMo only, not ${family}`);
  const mtpLayers = family === "mimo" ? num(j, "num_nextn_predict_layers", file, 0) : 0;
  if (!Number.isInteger(mtpLayers) || mtpLayers < 0) throw new Error(`${file}: num_nextn_predict_layers must be a non-negative integer, got ${mtpLayers}`);
  const window = slidingWindow(j, family, file);
  const sliding = layerTypes(j, family, nLayers, window, file);
  let rope: { theta: number; scaling: RopeScaling | null }, localRope: { theta: number; scaling: RopeScaling | null } | undefined;
  if (family === "gemma3_text") ({ full: rope, sliding: localRope } = gemma3Rope(j, file, maxSeqLen));
  else rope = readRopeConfig(j, file, maxSeqLen);
  const bias = spec.qkvBiasAlways || bool(j, "attention_bias", file, false);
  const gemma = spec.gemma ? {
    attnSoftcap: optNum(j, "attn_logit_softcapping", file),
    finalSoftcap: optNum(j, "final_logit_softcapping", file),
    queryPreAttnScalar: num(j, "query_pre_attn_scalar", file, 256),
  } : undefined;
  return {
    modelType: family,
    vocabSize: num(j, "vocab_size", file),
    dim, nLayers, nHeads,
    hiddenDim: num(j, "intermediate_size", file),
    nKvHeads: num(j, "num_key_value_heads", file, nHeads),
    maxSeqLen,
    ropeTheta: rope.theta,
    ropeScaling: rope.scaling,
    ...(localRope ? { localRope } : {}),
    normEps: num(j, "rms_norm_eps", file, 1e-6),
    tieWordEmbeddings: bool(j, "tie_word_embeddings", file, spec.tiedByDefault),
    attentionBias: bias,
    // Llama, Qwen3 and Gemma put attention_bias on o_proj too; Qwen2 biases q/k/v only.
    attentionOutBias: !spec.qkvBiasAlways && bias,
    mlpBias: family === "llama" && bool(j, "mlp_bias", file, false),
    qkNorm: spec.qkNorm,
    headDim: num(j, "head_dim", file, dim / nHeads),
    ...(window !== null && sliding.some(Boolean) ? { slidingWindow: window, slidingLayers: sliding } : {}),
    ...(gemma ? { gemma } : {}),
    ...(family === "qwen3_moe" ? { moe: readMoe(j, nLayers, file) } : {}),
    ...(mtpLayers > 0 ? { mtpLayers } : {}),
    bosTokenId: typeof j["bos_token_id"] === "number" ? (j["bos_token_id"] as number) : null,
    eosTokenId: typeof j["eos_token_id"] === "number" || Array.isArray(j["eos_token_id"]) ? (j["eos_token_id"] as number | number[]) : null,
    padTokenId: typeof j["pad_token_id"] === "number" ? (j["pad_token_id"] as number) : null,
  };
}

/**
 * What an engine that knows only the Llama/Qwen2 graph (the WebGPU decoder, llama.cpp's
 * `llama` architecture through GGUF) cannot run of config `c`: the family or flag by name, or
 * null when it serves it. The host decoder and the tfjs forward run every family.
 */
export function llamaGraphGap(c: ModelConfig, opts: { qkNorm?: boolean } = {}): string | null {
  const family = c.modelType ?? (c.attentionBias ? "qwen2" : "llama");
  if (family === "qwen3_moe") return `${family} (routed experts)`;
  // an engine with Qwen3's q/k norms (the WebGPU decoder) applies them before its fused bias add, so without q/k/v biases only
  if (family === "qwen3" && !opts.qkNorm) return `${family} (per-head q/k RMSNorm)`;
  if (family === "qwen3" && c.attentionBias) return `${family} with attention_bias (q/k/v biases before the q/k norms)`;
  if (family === "gemma2" || family === "gemma3_text") return `${family} ((1 + w) norms, GeGLU, sandwich norms, soft-capping)`;
  if (c.slidingLayers?.some(Boolean)) return `${family} with sliding_window ${c.slidingWindow} (sliding-window attention)`;
  if (c.attentionOutBias) return `${family} with attention_bias (an o_proj bias)`;
  if (c.mlpBias) return `${family} with mlp_bias`;
  return null;
}
