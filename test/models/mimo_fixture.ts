// A tiny random MiMo folder, written by the tests (no transformers reference exists offline:
// MiMo's modeling code is remote code). Weights are drawn wide enough (norm weights around 1,
// non-zero biases) that every parameter moves the outputs; the tokenizer is the qwen3 family
// fixture's (320 ids). `trunkOnly` writes the same trunk as a plain Qwen2 folder.
import { copyFileSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fromHfConfig } from "../../src/models/config.js";
import { parameterShapes } from "../../src/models/shapes.js";
import { serializeSafetensors, type NamedArray } from "../../src/models/safetensors.js";
import { Rng } from "../../src/utils/rng.js";
import { fixtureDir } from "./families_fixtures.js";

/** A MiMo config.json as XiaomiMiMo's checkpoints spell it (Qwen2's keys plus num_nextn_predict_layers). */
export function mimoConfigJson(mtpLayers = 1): Record<string, unknown> {
  return {
    architectures: ["MiMoForCausalLM"], model_type: "mimo", attention_bias: true, attention_dropout: 0.0,
    bos_token_id: 0, eos_token_id: 0, hidden_act: "silu", hidden_size: 32, intermediate_size: 48, initializer_range: 0.02,
    max_position_embeddings: 256, max_window_layers: 2, num_attention_heads: 4, num_hidden_layers: 2, num_key_value_heads: 2,
    num_nextn_predict_layers: mtpLayers, rms_norm_eps: 1e-6, rope_theta: 10000.0, sliding_window: 256, tie_word_embeddings: false,
    torch_dtype: "float32", use_cache: true, use_mtp: false, use_sliding_window: false, vocab_size: 320,
  };
}

/** Random weights for `config` (seeded), by Hugging Face name. */
export function mimoWeights(configJson: Record<string, unknown>, seed: number): Map<string, NamedArray> {
  const c = fromHfConfig(configJson), rng = new Rng(seed), out = new Map<string, NamedArray>();
  for (const [name, shape] of parameterShapes(c)) {
    const n = shape.reduce((a, b) => a * b, 1), data = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const z = rng.normal();
      data[i] = name.endsWith("norm.weight") ? 1 + 0.2 * z : name.endsWith(".bias") ? 0.1 * z : 0.15 * z;
    }
    out.set(name, { data, shape });
  }
  return out;
}

/** Write the folder: config.json, model.safetensors and the tokenizer; returns `dir`. */
export function writeTinyMimo(dir: string, opts: { seed?: number; mtpLayers?: number; trunkOnly?: boolean; chatTemplate?: boolean } = {}): string {
  const cfg = mimoConfigJson(opts.mtpLayers ?? 1);
  let weights = mimoWeights(cfg, opts.seed ?? 7);
  let written = cfg;
  if (opts.trunkOnly) {
    weights = new Map([...weights].filter(([n]) => !n.startsWith("model.mtp_layers.")));
    const { num_nextn_predict_layers: _n, use_mtp: _u, ...rest } = cfg;
    written = { ...rest, architectures: ["Qwen2ForCausalLM"], model_type: "qwen2" };
  }
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), JSON.stringify(written, null, 2));
  writeFileSync(join(dir, "model.safetensors"), serializeSafetensors(weights));
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(fixtureDir("qwen3"), f), join(dir, f));
  if (opts.chatTemplate) writeFileSync(join(dir, "chat_template.jinja"), "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  return dir;
}
