// Where the policy, critic and reward models come from. `*.model.path` is one of:
//   - a llama2.c checkpoint file (`.bin`, e.g. stories260K.bin);
//   - a Hugging Face folder (config.json + safetensors);
//   - `scratch`: a fresh model, architecture from `*.model.override_config` in
//     Hugging Face config.json names (hidden_size, num_hidden_layers, ...), seeded
//     by trainer.seed, vocabulary from the tokenizer.
// The tokenizer comes from `*.model.tokenizer_path`, else from the model's folder
// (the folder of a .bin holds tok512.bin / tokenizer.bin; an HF folder its tokenizer.json).
import { existsSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import {
  fromHfConfig, initModel, loadHfModel, loadHfValueModel, loadLlama2c, ValueHeadModel, type LlamaModel, type ModelConfig, type Tokenizer,
} from "../models/index.js";
import { checkChatTemplate, loadTokenizer } from "../models/tokenizers/index.js";
import { Rng } from "../utils/rng.js";
import type { ConfigView } from "./config_view.js";
import { checkMtpFitsModel, readMtpSettings } from "./mtp_settings.js";

export const SCRATCH = "scratch";

/** Defaults for a from-scratch model when override_config leaves a key out. */
const SCRATCH_DEFAULTS: Record<string, unknown> = {
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  hidden_size: 64,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  max_position_embeddings: 2048,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  tie_word_embeddings: true,
};

export function expandHome(p: string): string {
  return p === "~" || p.startsWith("~/") ? resolve(homedir(), p.slice(2)) : resolve(p);
}

export type ModelKind = "scratch" | "llama2c" | "hf";

export function modelKind(path: string, key: string): ModelKind {
  if (path === SCRATCH) return "scratch";
  const p = expandHome(path);
  if (!existsSync(p)) throw new Error(`${key}: ${p} does not exist (give a llama2.c .bin, a Hugging Face folder, or '${SCRATCH}')`);
  if (statSync(p).isDirectory()) return "hf";
  if (p.endsWith(".bin")) return "llama2c";
  throw new Error(`${key}: ${p} is a file but not a llama2.c .bin checkpoint; give a .bin, a Hugging Face folder, or '${SCRATCH}'`);
}

/** The architecture of a from-scratch model: override_config in HF names over small defaults. */
export function scratchConfig(overrides: Record<string, unknown>, tokenizer: Tokenizer, key: string): ModelConfig {
  const j: Record<string, unknown> = { ...SCRATCH_DEFAULTS, vocab_size: tokenizer.vocabSize, ...overrides };
  j.intermediate_size ??= 4 * (j.hidden_size as number);
  try {
    return fromHfConfig(j, key);
  } catch (e) {
    throw new Error(`${(e as Error).message} (set it with +${key}.<name>=...)`);
  }
}

/**
 * The tokenizer for a model section (`actor_rollout_ref.model`, `critic.model`, ...), with the section's
 * custom_chat_template (a Jinja string) in place of the tokenizer's own, as verl sets it on its workers'
 * tokenizers: every prompt the dataset, the agent loop and the workers render then uses it.
 */
export async function loadModelTokenizer(model: ConfigView): Promise<Tokenizer> {
  return withTemplateOverride(await loadOwnTokenizer(model), model, "custom_chat_template");
}

/** The tokenizer with the Jinja template at `view`'s key `k` as its chat template, where that key is set. */
export function withTemplateOverride(tokenizer: Tokenizer, view: ConfigView, k: string): Tokenizer {
  const template = view.optStr(k);
  if (template === null) return tokenizer;
  try {
    checkChatTemplate(template);
  } catch (e) {
    throw new Error(`${view.key(k)}: ${(e as Error).message}`);
  }
  return tokenizer.withChatTemplate(template);
}

async function loadOwnTokenizer(model: ConfigView): Promise<Tokenizer> {
  const explicit = model.optStr("tokenizer_path");
  const path = model.str("path");
  if (explicit) return loadTokenizer(explicit.startsWith("char:") ? explicit : expandHome(explicit));
  const kind = modelKind(path, model.key("path"));
  if (kind === "scratch") throw new Error(`${model.key("path")}=${SCRATCH} needs ${model.key("tokenizer_path")} (a tokenizer file, folder, or char:<alphabet>)`);
  const p = expandHome(path);
  return loadTokenizer(kind === "llama2c" ? dirname(p) : p);
}

/**
 * A model section's override_config in Hugging Face config.json names. verl's Megatron layout nests them
 * under `model_config` and keeps MoE settings in `moe_config` (inert: a MoE model's experts come from its config.json); both
 * layouts read the same.
 */
export function hfOverrides(model: ConfigView): Record<string, unknown> {
  const { model_config: nested, moe_config: _moe, ...flat } = model.section("override_config");
  const inner = nested === undefined || nested === null ? {} : model.section("override_config.model_config");
  return { ...flat, ...inner };
}

/** Overrides build a `scratch` model; a loaded checkpoint keeps its config.json, so refuse them there rather than drop them. */
function refuseOverridesOnCheckpoint(model: ConfigView): void {
  const keys = Object.keys(hfOverrides(model));
  if (keys.length === 0) return;
  throw new Error(
    `${model.key("override_config")} sets ${keys.join(", ")}: config overrides shape a '${SCRATCH}' model in verl-ts; ` +
      `overriding a loaded checkpoint's config is not built (edit its config.json, or drop the override)`,
  );
}

/** The causal LM named by a model section (with its MTP layers when the section's mtp.enable says so). */
export async function loadPolicy(model: ConfigView, tokenizer: Tokenizer, seed: number): Promise<LlamaModel> {
  const mtp = readMtpSettings(model);
  const m = await loadPolicyWeights(model, tokenizer, seed, mtp.enable);
  try {
    checkMtpFitsModel(mtp, m.config, model.prefix);
  } catch (e) {
    m.dispose();
    throw e;
  }
  return m;
}

async function loadPolicyWeights(model: ConfigView, tokenizer: Tokenizer, seed: number, mtp: boolean): Promise<LlamaModel> {
  const path = model.str("path");
  const kind = modelKind(path, model.key("path"));
  if (kind === "scratch") return initModel(scratchConfig(hfOverrides(model), tokenizer, model.key("override_config")), new Rng(seed));
  refuseOverridesOnCheckpoint(model);
  const configDir = hfConfigDir(model, kind);
  if (kind === "llama2c") return loadLlama2c(expandHome(path));
  return loadHfModel(expandHome(path), configDir, { mtp });
}

/** hf_config_path: the folder whose config.json describes the weights at `path` (default: `path`). */
function hfConfigDir(model: ConfigView, kind: string): string | undefined {
  const p = model.optStr("hf_config_path");
  if (p === null) return undefined;
  if (kind !== "hf") throw new Error(`${model.key("hf_config_path")}: only a Hugging Face folder at ${model.key("path")} reads its config from elsewhere (a llama2.c checkpoint carries its own)`);
  return expandHome(p);
}

/**
 * A value model from a model section: a saved value model loads as is; a policy
 * checkpoint gives its trunk plus a fresh score head (as verl builds its critic);
 * `scratch` is a fresh trunk. `fallbackOverrides` fill a scratch architecture
 * (the critic borrows the actor's override_config).
 */
export async function loadValueModel(model: ConfigView, tokenizer: Tokenizer, seed: number, fallbackOverrides: Record<string, unknown> = {}): Promise<ValueHeadModel> {
  const path = model.str("path");
  const kind = modelKind(path, model.key("path"));
  const headRng = new Rng(seed ^ 0x5eed);
  if (kind === "scratch") {
    const cfg = scratchConfig({ ...fallbackOverrides, ...hfOverrides(model) }, tokenizer, model.key("override_config"));
    return ValueHeadModel.init(cfg, headRng);
  }
  refuseOverridesOnCheckpoint(model);
  const configDir = hfConfigDir(model, kind);
  if (kind === "hf") return loadHfValueModel(expandHome(path), headRng, configDir);
  const policy = loadLlama2c(expandHome(path));
  try {
    return ValueHeadModel.fromPolicy(policy, headRng);
  } finally {
    policy.dispose();
  }
}

/**
 * Import a user's extension module for its side effects (registering an advantage
 * estimator, a policy loss, a reward manager...): an absolute path, a path relative
 * to the working directory, or a package name.
 */
export async function importExternalLib(spec: string | null, key: string): Promise<void> {
  if (!spec) return;
  const looksLikePath = spec.startsWith(".") || spec.startsWith("/") || spec.startsWith("~") || /\.(m?js|ts)$/.test(spec);
  const target = looksLikePath ? pathToFileURL(isAbsolute(spec) ? spec : expandHome(spec)).href : spec;
  try {
    await import(target);
  } catch (e) {
    throw new Error(`${key}: cannot import '${spec}': ${(e as Error).message}`);
  }
}
