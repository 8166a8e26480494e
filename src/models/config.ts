// The architecture hyper-parameters of a Llama-family decoder, and their mapping
// to and from a Hugging Face config.json (LlamaForCausalLM / Qwen2ForCausalLM).
import { readRopeConfig, ropeToHf, type RopeScaling } from "./rope.js";

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
  /** HF model_type written on save; "qwen2" when attentionBias, else "llama" unless set */
  modelType?: "llama" | "qwen2";
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
}

/** The number of parameters (embedding counted once when tied). */
export function numParams(c: ModelConfig): number {
  const attn = c.dim * c.nHeads * c.headDim * 2 + c.dim * c.nKvHeads * c.headDim * 2 +
    (c.attentionBias ? (c.nHeads + 2 * c.nKvHeads) * c.headDim : 0);
  const layer = attn + 3 * c.dim * c.hiddenDim + 2 * c.dim;
  return c.vocabSize * c.dim * (c.tieWordEmbeddings ? 1 : 2) + c.nLayers * layer + c.dim;
}

type Json = Record<string, unknown>;

function num(j: Json, key: string, file: string, fallback?: number): number {
  const v = j[key];
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new Error(`${file}: missing '${key}'`);
  }
  if (typeof v !== "number") throw new Error(`${file}: '${key}' must be a number, got ${JSON.stringify(v)}`);
  return v;
}

export const SUPPORTED_ARCHITECTURES = [
  "LlamaForCausalLM", "Qwen2ForCausalLM", "LlamaForTokenClassification", "Qwen2ForTokenClassification",
] as const;

/** Parse a Hugging Face config.json object. `file` names the source in errors. */
export function fromHfConfig(j: Json, file = "config.json"): ModelConfig {
  const archs = Array.isArray(j["architectures"]) ? (j["architectures"] as unknown[]).map(String) : [];
  const modelType = typeof j["model_type"] === "string" ? (j["model_type"] as string) : undefined;
  const known = archs.some((a) => (SUPPORTED_ARCHITECTURES as readonly string[]).includes(a)) || modelType === "llama" || modelType === "qwen2";
  if (!known) {
    throw new Error(`${file}: unsupported model (architectures ${JSON.stringify(archs)}, model_type ${String(modelType)}); supported: ${SUPPORTED_ARCHITECTURES.join(", ")}`);
  }
  const isQwen2 = modelType === "qwen2" || archs.some((a) => a.startsWith("Qwen2"));
  const dim = num(j, "hidden_size", file);
  const nHeads = num(j, "num_attention_heads", file);
  const maxSeqLen = num(j, "max_position_embeddings", file, 2048);
  const rope = readRopeConfig(j, file, maxSeqLen);
  return makeConfig({
    vocabSize: num(j, "vocab_size", file),
    dim,
    hiddenDim: num(j, "intermediate_size", file),
    nLayers: num(j, "num_hidden_layers", file),
    nHeads,
    nKvHeads: num(j, "num_key_value_heads", file, nHeads),
    maxSeqLen,
    ropeTheta: rope.theta,
    ropeScaling: rope.scaling,
    normEps: num(j, "rms_norm_eps", file, 1e-6),
    // LlamaConfig and Qwen2Config both default to untied when the key is absent.
    tieWordEmbeddings: Boolean(j["tie_word_embeddings"] ?? false),
    attentionBias: isQwen2 ? true : Boolean(j["attention_bias"]),
    headDim: num(j, "head_dim", file, dim / nHeads),
    modelType: isQwen2 ? "qwen2" : "llama",
    bosTokenId: typeof j["bos_token_id"] === "number" ? (j["bos_token_id"] as number) : null,
    eosTokenId: typeof j["eos_token_id"] === "number" || Array.isArray(j["eos_token_id"]) ? (j["eos_token_id"] as number | number[]) : null,
    padTokenId: typeof j["pad_token_id"] === "number" ? (j["pad_token_id"] as number) : null,
  });
}

/** A config.json object that transformers reads back as the same architecture. */
export function toHfConfig(c: ModelConfig, opts: { valueHead?: boolean } = {}): Json {
  const qwen = (c.modelType ?? (c.attentionBias ? "qwen2" : "llama")) === "qwen2";
  if (qwen && !c.attentionBias) throw new Error("toHfConfig: Qwen2 always has q/k/v biases; set attentionBias or modelType 'llama'");
  const arch = (qwen ? "Qwen2" : "Llama") + (opts.valueHead ? "ForTokenClassification" : "ForCausalLM");
  const j: Json = {
    architectures: [arch],
    model_type: qwen ? "qwen2" : "llama",
    vocab_size: c.vocabSize,
    hidden_size: c.dim,
    intermediate_size: c.hiddenDim,
    num_hidden_layers: c.nLayers,
    num_attention_heads: c.nHeads,
    num_key_value_heads: c.nKvHeads,
    head_dim: c.headDim,
    max_position_embeddings: c.maxSeqLen,
    ...ropeToHf(c.ropeTheta, c.ropeScaling ?? null),
    rms_norm_eps: c.normEps,
    tie_word_embeddings: c.tieWordEmbeddings,
    hidden_act: "silu",
    initializer_range: 0.02,
    torch_dtype: "float32",
    use_cache: true,
    bos_token_id: c.bosTokenId ?? null,
    eos_token_id: c.eosTokenId ?? null,
    pad_token_id: c.padTokenId ?? null,
  };
  if (!qwen) { j["attention_bias"] = c.attentionBias; j["mlp_bias"] = false; j["pretraining_tp"] = 1; }
  if (opts.valueHead) { j["num_labels"] = 1; j["id2label"] = { "0": "LABEL_0" }; j["label2id"] = { LABEL_0: 0 }; }
  return j;
}
