// Hugging Face model folders: config.json + model.safetensors (or shards listed
// in model.safetensors.index.json; or older folders' pytorch_model.bin, sharded or not),
// f32/f16/bf16 weights in, float32 out. A
// saved folder is what transformers' from_pretrained reads (LlamaForCausalLM /
// Qwen2ForCausalLM, or *ForTokenClassification for a value model).
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { writeDirAtomic } from "../utils/fs.js";
import type { Rng } from "../utils/rng.js";
import { fromHfConfig, toHfConfig, type ModelConfig } from "./config.js";
import { LlamaModel, toVariables } from "./llama.js";
import { requireFiniteWeights } from "./finite.js";
import { mergedHostWeights } from "./merge.js";
import { readSafetensors, serializeSafetensors, type NamedArray } from "./safetensors.js";
import { readTorchStateDict } from "./torch/torch_save.js";
import type { Tokenizer } from "./tokenizer.js";
import { ValueHeadModel } from "./value_head.js";

function readJson(path: string): Record<string, unknown> {
  try {
    return JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new Error(`${path}: ${(e as Error).message}`);
  }
}

/**
 * All tensors of a folder: model.safetensors or the shards of model.safetensors.index.json, else
 * (older checkpoints) pytorch_model.bin or the shards of pytorch_model.bin.index.json, torch.save
 * pickles read by src/models/torch (safetensors wins when a folder has both, as transformers prefers it).
 */
export function readHfWeights(dir: string): Map<string, NamedArray> {
  for (const [single, index, read] of [
    ["model.safetensors", "model.safetensors.index.json", (p: string) => readSafetensors(p).tensors],
    ["pytorch_model.bin", "pytorch_model.bin.index.json", readTorchStateDict],
  ] as const) {
    if (existsSync(join(dir, single))) return finite(read(join(dir, single)), join(dir, single));
    if (existsSync(join(dir, index))) return readSharded(dir, join(dir, index), read);
  }
  throw new Error(`${dir}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json`);
}

/** The shards an index's weight_map lists, every listed name checked to be in its shard. */
function readSharded(dir: string, index: string, read: (path: string) => Map<string, NamedArray>): Map<string, NamedArray> {
  const map = readJson(index)["weight_map"];
  if (typeof map !== "object" || map === null) throw new Error(`${index}: missing 'weight_map'`);
  const out = new Map<string, NamedArray>();
  for (const shard of new Set(Object.values(map as Record<string, string>))) {
    if (typeof shard !== "string" || !existsSync(join(dir, shard))) throw new Error(`${index}: shard ${JSON.stringify(shard)} does not exist in ${dir}`);
    for (const [name, t] of finite(read(join(dir, shard)), join(dir, shard))) out.set(name, t);
  }
  for (const name of Object.keys(map as Record<string, string>)) {
    if (!out.has(name)) throw new Error(`${index}: '${name}' is listed but not found in its shard`);
  }
  return out;
}

function finite(tensors: Map<string, NamedArray>, file: string): Map<string, NamedArray> {
  for (const [name, t] of tensors) requireFiniteWeights(t.data, name, file);
  return tensors;
}

/** Named float32 arrays -> tensors, dropping buffers that are not parameters and a tied lm_head copy. */
function toTensors(weights: Map<string, NamedArray>, config: ModelConfig): Map<string, tf.Tensor> {
  const t = new Map<string, tf.Tensor>();
  for (const [name, w] of weights) {
    if (name.endsWith("rotary_emb.inv_freq")) continue; // a buffer older checkpoints saved
    if (name === "lm_head.weight" && config.tieWordEmbeddings) continue;
    t.set(name, tf.tensor(w.data, w.shape));
  }
  return t;
}

function configOf(dir: string): { config: ModelConfig; raw: Record<string, unknown> } {
  const path = join(dir, "config.json");
  if (!existsSync(path)) throw new Error(`${dir}: no config.json (not a Hugging Face model folder)`);
  const raw = readJson(path);
  return { config: fromHfConfig(raw, path), raw };
}

/**
 * Load a causal LM folder (any family of families.ts); `configDir` holds its config.json (verl's hf_config_path).
 * `mtp: false` leaves a MiMo folder's multi-token-prediction layers out, as verl does unless model.mtp.enable
 * (it zeroes num_nextn_predict_layers): the model, and what it saves, is then the trunk alone.
 */
export async function loadHfModel(dir: string, configDir = dir, opts: { mtp?: boolean } = {}): Promise<LlamaModel> {
  const { config: read } = configOf(configDir);
  const config = opts.mtp === false && read.mtpLayers ? { ...read, mtpLayers: 0 } : read;
  const t = toTensors(readHfWeights(dir), config);
  try {
    const dropped = (n: string) => n.startsWith("score.") || (opts.mtp === false && n.startsWith("model.mtp_layers."));
    for (const n of [...t.keys()]) if (dropped(n)) { t.get(n)!.dispose(); t.delete(n); }
    return new LlamaModel(config, toVariables(t));
  } catch (e) {
    throw new Error(`${dir}: ${(e as Error).message}`);
  } finally {
    tf.dispose([...t.values()]);
  }
}

/**
 * A value model from a folder: a saved *ForTokenClassification (with score.*)
 * loads as is; a causal LM gets a fresh score head (seeded by `rng`), as verl
 * initialises a critic from the actor's weights.
 */
export async function loadHfValueModel(dir: string, rng: Rng, configDir = dir): Promise<ValueHeadModel> {
  // a value model has no use for MiMo's MTP layers: its trunk is the causal LM's alone
  const { config: read } = configOf(configDir);
  const config = read.mtpLayers ? { ...read, mtpLayers: 0 } : read;
  const t = toTensors(readHfWeights(dir), config);
  try {
    for (const n of [...t.keys()]) if (n.startsWith("model.mtp_layers.")) { t.get(n)!.dispose(); t.delete(n); }
    if (!t.has("score.weight")) {
      const policy = new LlamaModel(config, toVariables(t));
      try { return ValueHeadModel.fromPolicy(policy, rng); } finally { policy.dispose(); }
    }
    t.get("lm_head.weight")?.dispose();
    t.delete("lm_head.weight");
    return new ValueHeadModel(config, toVariables(t));
  } catch (e) {
    throw new Error(`${dir}: ${(e as Error).message}`);
  } finally {
    tf.dispose([...t.values()]);
  }
}

/**
 * Save a model as a Hugging Face folder (atomically): config.json,
 * generation_config.json, model.safetensors (float32; a tied lm_head is not
 * stored, as transformers does) and the tokenizer's files when it can write them.
 */
export async function saveHfModel(model: LlamaModel | ValueHeadModel, dir: string, tokenizer?: Tokenizer): Promise<void> {
  const valueHead = model instanceof ValueHeadModel;
  const c = model.config;
  const cfg = toHfConfig(c, { valueHead });
  if (tokenizer) {
    if (cfg["bos_token_id"] === null && tokenizer.bosTokenId !== null) cfg["bos_token_id"] = tokenizer.bosTokenId;
    if (cfg["eos_token_id"] === null) cfg["eos_token_id"] = tokenizer.eosTokenId;
  }
  const arrays = new Map<string, NamedArray>();
  // under LoRA the export is the merged model (W + scale B A), loadable without peft
  const trunk = valueHead ? model.trunk : model;
  for (const [name, a] of await mergedHostWeights(trunk)) arrays.set(name, a);
  for (const [name, v] of model.params) if (!arrays.has(name)) arrays.set(name, { data: await v.data() as Float32Array, shape: [...v.shape] });
  await writeDirAtomic(dir, (tmp) => {
    writeFileSync(join(tmp, "config.json"), configJson(cfg));
    if (!valueHead) {
      // The stop ids go to generation_config.json, where generation reads them back (tokenizers/hf.ts).
      const stops = tokenizer ? (tokenizer.eosTokenIds.length === 1 ? tokenizer.eosTokenIds[0] : [...tokenizer.eosTokenIds]) : cfg["eos_token_id"];
      const gen = {
        _from_model_config: true, bos_token_id: cfg["bos_token_id"], eos_token_id: stops,
        ...(cfg["pad_token_id"] === null ? {} : { pad_token_id: cfg["pad_token_id"] }),
      };
      writeFileSync(join(tmp, "generation_config.json"), JSON.stringify(gen, null, 2) + "\n");
    }
    writeFileSync(join(tmp, "model.safetensors"), serializeSafetensors(arrays));
    tokenizer?.saveTo?.(tmp);
  });
}

/**
 * Keys transformers types as float: JSON has one number type, but transformers 5 validates its
 * configs strictly and refuses `"final_logit_softcapping": 30` for a float field, so integral values
 * of these keys are written with a decimal point (30.0), as Python's json writes them.
 */
const FLOAT_CONFIG_KEYS = new Set([
  "rms_norm_eps", "rope_theta", "rope_local_base_freq", "attention_dropout", "initializer_range", "attn_logit_softcapping",
  "final_logit_softcapping", "router_aux_loss_coef", "partial_rotary_factor", "factor", "low_freq_factor", "high_freq_factor",
  "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "embedding_multiplier", "logits_scaling",
]);

/** config.json text: JSON.stringify with FLOAT_CONFIG_KEYS' integral values written as floats. */
export function configJson(cfg: unknown): string {
  const text = JSON.stringify(cfg, null, 2);
  return text.replace(/^(\s*)"([A-Za-z_]+)": (-?\d+)(,?)$/gm, (all, ind: string, key: string, num: string, comma: string) =>
    FLOAT_CONFIG_KEYS.has(key) ? `${ind}"${key}": ${num}.0${comma}` : all) + "\n";
}
