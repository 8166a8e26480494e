// LoRA adapters on disk in Hugging Face peft's layout, which
// `PeftModel.from_pretrained(base, dir)` loads:
//   adapter_config.json         peft_type LORA, r, lora_alpha, target_modules, ...
//   adapter_model.safetensors   base_model.model.<module>.lora_A.weight [r, in]
//                               base_model.model.<module>.lora_B.weight [out, r]
//                               base_model.model.<module>.lora_magnitude_vector [out]  (DoRA: use_dora true;
//                               peft saves the magnitude without a ".weight" suffix)
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { writeDirAtomic } from "../utils/fs.js";
import type { ModelConfig } from "./config.js";
import { requireFiniteWeights } from "./finite.js";
import { LoraAdapter, linearModules, selectTargets, type LoraSettings, type LoraTensors } from "./lora.js";
import { readSafetensors, serializeSafetensors, type NamedArray } from "./safetensors.js";

export const ADAPTER_CONFIG = "adapter_config.json";
export const ADAPTER_WEIGHTS = "adapter_model.safetensors";
const PREFIX = "base_model.model.";

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/**
 * target_modules as peft should read them back: the leaf names (q_proj, ...) when
 * the adapter covers every module with those names, else a full-match regex of the
 * exact module names (peft applies a string as re.fullmatch over module names).
 */
function savedTargets(adapter: LoraAdapter): string | string[] {
  const names = [...adapter.modules.keys()];
  const leaves = [...new Set(names.map((n) => n.split(".").pop()!))].sort();
  const all = [...linearModules(adapter.config).keys()].filter((m) => leaves.includes(m.split(".").pop()!));
  if (all.length === names.length) return leaves;
  return `(${names.map(escapeRe).join("|")})`;
}

/** Write `adapter` to `dir` (atomically) in peft's layout. */
export async function saveLoraAdapter(adapter: LoraAdapter, dir: string, opts: { baseModel?: string; taskType?: string } = {}): Promise<void> {
  const s = adapter.settings;
  const config: Record<string, unknown> = {
    peft_type: "LORA",
    task_type: opts.taskType ?? "CAUSAL_LM",
    base_model_name_or_path: opts.baseModel ?? null,
    r: s.rank,
    lora_alpha: s.alpha,
    lora_dropout: s.dropout ?? 0,
    target_modules: savedTargets(adapter),
    bias: "none",
    fan_in_fan_out: false,
    inference_mode: true,
    init_lora_weights: true,
    modules_to_save: null,
    use_rslora: false,
    use_dora: s.useDora === true,
    layers_to_transform: null,
    layers_pattern: null,
    rank_pattern: {},
    alpha_pattern: {},
    revision: null,
  };
  const arrays = new Map<string, NamedArray>();
  // every module's own A and B, a shared A written under each module that uses it (peft has no tying)
  for (const [mod, m] of adapter.modules) {
    for (const [name, v] of [[`${mod}.lora_A.weight`, m.a], [`${mod}.lora_B.weight`, m.b]] as const) {
      arrays.set(PREFIX + name, { data: Float32Array.from((await v.data()) as Float32Array), shape: [...v.shape] });
    }
    if (m.magnitude) arrays.set(`${PREFIX}${mod}.lora_magnitude_vector`, { data: Float32Array.from((await m.magnitude.data()) as Float32Array), shape: [...m.magnitude.shape] });
  }
  await writeDirAtomic(dir, (tmp) => {
    writeFileSync(join(tmp, ADAPTER_CONFIG), JSON.stringify(config, null, 2) + "\n");
    writeFileSync(join(tmp, ADAPTER_WEIGHTS), serializeSafetensors(arrays, { format: "pt" }));
  });
}

/** The settings in a peft adapter_config.json (LoRA and DoRA; rank/alpha patterns, rsLoRA are refused). */
export function readAdapterSettings(dir: string): LoraSettings {
  const path = join(dir, ADAPTER_CONFIG);
  if (!existsSync(path)) throw new Error(`LoRA adapter: ${path} does not exist (a peft adapter folder holds ${ADAPTER_CONFIG} and ${ADAPTER_WEIGHTS})`);
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
  } catch (e) {
    throw new Error(`LoRA adapter: cannot parse ${path}: ${(e as Error).message}`);
  }
  if (j.peft_type !== undefined && j.peft_type !== "LORA") throw new Error(`LoRA adapter: ${path} has peft_type '${String(j.peft_type)}'; only LORA is supported`);
  for (const k of ["use_rslora", "fan_in_fan_out"]) if (j[k] === true) throw new Error(`LoRA adapter: ${path} sets ${k}=true, which verl-ts does not implement`);
  for (const k of ["rank_pattern", "alpha_pattern"]) {
    if (j[k] && Object.keys(j[k] as object).length > 0) throw new Error(`LoRA adapter: ${path} sets ${k}, which verl-ts does not implement`);
  }
  if (j.bias !== undefined && j.bias !== "none") throw new Error(`LoRA adapter: ${path} has bias '${String(j.bias)}'; only 'none' is supported`);
  const r = j.r, alpha = j.lora_alpha, targets = j.target_modules;
  if (typeof r !== "number") throw new Error(`LoRA adapter: ${path} lacks a numeric 'r'`);
  if (typeof alpha !== "number") throw new Error(`LoRA adapter: ${path} lacks a numeric 'lora_alpha'`);
  if (!(typeof targets === "string" || (Array.isArray(targets) && targets.every((t) => typeof t === "string")))) {
    throw new Error(`LoRA adapter: ${path} has no target_modules (a string or a list of strings)`);
  }
  const dropout = j.lora_dropout ?? 0;
  if (typeof dropout !== "number" || !(dropout >= 0 && dropout < 1)) throw new Error(`LoRA adapter: ${path} has lora_dropout ${JSON.stringify(dropout)}; it must be a number in [0, 1)`);
  const ex = j.exclude_modules;
  // peft trains a loaded adapter with its saved lora_dropout (on the adapter's input) and use_dora
  return {
    rank: r, alpha, targetModules: targets as string | string[], excludeModules: (ex as string | string[] | null | undefined) ?? null,
    ...(dropout > 0 ? { dropout, dropoutPosition: "pre" as const } : {}), ...(j.use_dora === true ? { useDora: true } : {}),
  };
}

/** Load a peft LoRA folder for a model of `config` (weights upcast to float32). */
export function loadLoraAdapter(dir: string, config: ModelConfig): LoraAdapter {
  const settings = readAdapterSettings(dir);
  const file = join(dir, ADAPTER_WEIGHTS);
  if (!existsSync(file)) throw new Error(`LoRA adapter: ${file} does not exist (.bin adapters are not read; save with safetensors)`);
  // a typo in target_modules would otherwise leave its modules silently unadapted
  selectTargets(config, settings, (k) => `LoRA adapter ${join(dir, ADAPTER_CONFIG)}: ${k}`);
  const { tensors } = readSafetensors(file);
  const linear = linearModules(config);
  const parts = new Map<string, { a?: NamedArray; b?: NamedArray; m?: NamedArray }>();
  for (const [key, t] of tensors) {
    const m = /^base_model\.model\.(.+)\.(?:lora_([AB])(?:\.default)?\.weight|lora_(magnitude)_vector(?:\.default)?(?:\.weight)?)$/.exec(key);
    if (!m) throw new Error(`LoRA adapter: ${file} holds '${key}', which is not a LoRA A/B weight or DoRA magnitude (modules_to_save is not supported)`);
    if (m[3] && !settings.useDora) throw new Error(`LoRA adapter: ${file} holds the DoRA magnitude '${key}' but ${join(dir, ADAPTER_CONFIG)} does not set use_dora`);
    if (!linear.has(m[1]!)) {
      throw new Error(`LoRA adapter: ${file} holds '${key}' for '${m[1]}', which is not a linear module of the model (a different model's adapter? e.g. ${[...linear.keys()].slice(0, 2).join(", ")})`);
    }
    requireFiniteWeights(t.data, key, file);
    const e = parts.get(m[1]!) ?? {};
    if (m[3]) e.m = t;
    else if (m[2] === "A") e.a = t;
    else e.b = t;
    parts.set(m[1]!, e);
  }
  const made = new Map<string, LoraTensors>();
  try {
    for (const [mod, e] of parts) {
      if (!e.a || !e.b) throw new Error(`LoRA adapter: ${file} has lora_${e.a ? "A" : "B"} but not lora_${e.a ? "B" : "A"} for '${mod}'`);
      if (settings.useDora && !e.m) throw new Error(`LoRA adapter: ${file} has no lora_magnitude_vector for '${mod}' (use_dora is set)`);
      made.set(mod, { a: tf.tensor(e.a.data, e.a.shape), b: tf.tensor(e.b.data, e.b.shape), ...(e.m ? { m: tf.tensor(e.m.data, e.m.shape) } : {}) });
    }
    if (made.size === 0) throw new Error(`LoRA adapter: ${file} holds no LoRA weights`);
    return new LoraAdapter(settings, config, made);
  } finally {
    for (const t of made.values()) tf.dispose([t.a, t.b, ...(t.m ? [t.m] : [])]);
  }
}
