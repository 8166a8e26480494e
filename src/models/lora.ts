// LoRA adapters (verl's model.lora_rank / lora_alpha / target_modules /
// exclude_modules), with the semantics of Hugging Face peft: every targeted
// linear W [out, in] gains A [r, in] and B [out, r], and computes
// x W^T + (alpha / r) (x A^T) B^T. A starts kaiming-uniform (a = sqrt 5, i.e.
// U(-1/sqrt(in), 1/sqrt(in))), B at zero, so a fresh adapter leaves the model
// unchanged. The base weights stay frozen: only A and B train.
import * as tf from "@tensorflow/tfjs";
import type { Rng } from "../utils/rng.js";
import type { ModelConfig } from "./config.js";
import { parameterShapes } from "./llama.js";

export interface LoraSettings {
  rank: number;
  alpha: number;
  /** "all-linear" (every linear but the output layer), a list of module names (suffix match), or a regex (full match). */
  targetModules: string | string[];
  /** Same forms as targetModules; null = none. */
  excludeModules?: string | string[] | null;
  /**
   * A's initialisation: kaiming (peft's kaiming-uniform, a = sqrt 5; the default), xavier
   * (Megatron-Bridge's default: normal, std sqrt(2 / (in + r))) or normal (std 0.2).
   */
  initA?: "kaiming" | "xavier" | "normal";
  /**
   * B's initialisation: zero (the default: a fresh adapter leaves the model unchanged) or one of
   * A's methods on B [out, r] (Megatron-Bridge's lora_B_init_method). The reference policy is the
   * adapter-off model either way, as verl's Megatron worker computes it.
   */
  initB?: "zero" | "kaiming" | "xavier" | "normal";
  /**
   * Groups of modules sharing one A (Megatron's fused LoRA on linear_qkv / linear_fc1: one
   * adapter on the fused projection is A shared by its parts and B split by rows). The first
   * module of a group owns A; its name is the trainable one.
   */
  tiedA?: string[][];
}

export interface LoraModule {
  a: tf.Variable;
  b: tf.Variable;
  inFeatures: number;
  outFeatures: number;
}

/** The output layers peft's "all-linear" leaves out. */
const OUTPUT_LAYERS = new Set(["lm_head", "score"]);

/** The model's linear modules (HF module names, e.g. model.layers.0.self_attn.q_proj) with [out, in]. */
export function linearModules(config: ModelConfig): Map<string, [number, number]> {
  const out = new Map<string, [number, number]>();
  for (const [name, shape] of parameterShapes(config)) {
    if (name.endsWith("_proj.weight") || name === "lm_head.weight") out.set(name.slice(0, -".weight".length), shape as [number, number]);
  }
  return out;
}

/** Whether module `name` matches a peft module spec (list: name or a dotted suffix; string: a full-match regex). */
function matches(name: string, spec: string | string[], key: string): boolean {
  if (Array.isArray(spec)) return spec.some((t) => name === t || name.endsWith(`.${t}`));
  let re: RegExp;
  try {
    re = new RegExp(`^(?:${spec})$`);
  } catch (e) {
    throw new Error(`${key}: '${spec}' is neither 'all-linear', a list of module names, nor a valid regex (${(e as Error).message})`);
  }
  return re.test(name);
}

/** How errors name a settings key: `model.target_modules`, or a file's field (`.../adapter_config.json: target_modules`). */
export type KeyNamer = (key: string) => string;

function keyNamer(prefix: string | KeyNamer): KeyNamer {
  return typeof prefix === "function" ? prefix : (k) => `${prefix}.${k}`;
}

/**
 * The module names an adapter targets, in model order. An error when none match (as peft raises),
 * and when a listed name matches no linear module at all (a typo would otherwise leave a module
 * silently unadapted).
 */
export function selectTargets(config: ModelConfig, s: LoraSettings, keyPrefix: string | KeyNamer = "model"): string[] {
  const key = keyNamer(keyPrefix);
  const mods = [...linearModules(config).keys()];
  if (Array.isArray(s.targetModules)) {
    for (const t of s.targetModules) {
      if (!mods.some((m) => matches(m, [t], key("target_modules")))) {
        const leaves = [...new Set(mods.map((m) => m.split(".").pop()!))];
        throw new Error(`${key("target_modules")} names '${t}', which matches no linear module of the model (its linear modules: ${leaves.join(", ")})`);
      }
    }
  }
  const picked = mods.filter((m) => {
    const last = m.split(".").pop()!;
    const inc = s.targetModules === "all-linear" ? !OUTPUT_LAYERS.has(last) : matches(m, s.targetModules, key("target_modules"));
    return inc && !(s.excludeModules && matches(m, s.excludeModules, key("exclude_modules")));
  });
  if (picked.length === 0) {
    throw new Error(`${key("target_modules")}=${JSON.stringify(s.targetModules)} matches no linear module of the model (it has e.g. ${mods.slice(0, 3).join(", ")})`);
  }
  return picked;
}

/** A rank above min(out, in) of a targeted layer adds nothing (B A has rank at most that) and can exhaust memory: refused before any allocation. */
export function checkRankFits(config: ModelConfig, rank: number, targets: string[], keyPrefix: string | KeyNamer = "model"): void {
  const shapes = linearModules(config);
  let smallest: [string, [number, number]] | undefined;
  for (const t of targets) {
    const shape = shapes.get(t)!;
    if (!smallest || Math.min(...shape) < Math.min(...smallest[1])) smallest = [t, shape];
  }
  if (smallest && rank > Math.min(...smallest[1])) {
    const [name, [outF, inF]] = smallest;
    throw new Error(`${keyNamer(keyPrefix)("lora_rank")}=${rank} is larger than ${name} [${outF}, ${inF}]: a LoRA rank is at most min(out, in) = ${Math.min(outF, inF)} of every targeted layer`);
  }
}

export function validateLoraSettings(s: LoraSettings, keyPrefix: string | KeyNamer = "model"): void {
  const key = keyNamer(keyPrefix);
  if (!Number.isInteger(s.rank) || s.rank < 1) throw new Error(`${key("lora_rank")} must be a positive integer to enable LoRA, got ${s.rank}`);
  if (!Number.isFinite(s.alpha) || s.alpha <= 0) throw new Error(`${key("lora_alpha")} must be a positive number, got ${s.alpha}`);
}

/**
 * A [rows, cols] weight drawn as torch initialises a Linear of `cols` inputs and `rows` outputs:
 * kaiming (peft's kaiming-uniform, a = sqrt 5: uniform within 1/sqrt(fan_in)), xavier (normal, std
 * sqrt(2 / (fan_in + fan_out))) or normal (std 0.2, Megatron-Bridge's).
 */
function drawInit(rows: number, cols: number, init: "kaiming" | "xavier" | "normal", rng: Rng): Float32Array {
  const out = new Float32Array(rows * cols);
  if (init === "kaiming") {
    const bound = 1 / Math.sqrt(cols);
    for (let i = 0; i < out.length; i++) out[i] = (2 * rng.random() - 1) * bound;
  } else {
    const std = init === "xavier" ? Math.sqrt(2 / (cols + rows)) : 0.2;
    for (let i = 0; i < out.length; i++) out[i] = rng.normal() * std;
  }
  return out;
}

let adapterSerial = 0;

export class LoraAdapter {
  /** alpha / r, peft's scaling. */
  readonly scale: number;
  readonly modules = new Map<string, LoraModule>();

  /** Module -> the module whose A it uses (tied modules only). */
  private readonly aOwner = new Map<string, string>();

  constructor(readonly settings: LoraSettings, readonly config: ModelConfig, tensors: Map<string, { a: tf.Tensor; b: tf.Tensor }>) {
    validateLoraSettings(settings);
    this.scale = settings.alpha / settings.rank;
    const shapes = linearModules(config);
    const serial = adapterSerial++;
    for (const group of settings.tiedA ?? []) for (const m of group.slice(1)) if (tensors.has(m) && tensors.has(group[0]!)) this.aOwner.set(m, group[0]!);
    for (const [name, t] of tensors) {
      const shape = shapes.get(name);
      if (!shape) throw new Error(`LoRA: '${name}' is not a linear module of the model`);
      const [outF, inF] = shape, r = settings.rank;
      if (t.a.shape.join(",") !== `${r},${inF}`) throw new Error(`LoRA: ${name}.lora_A has shape [${t.a.shape}], expected [${r}, ${inF}]`);
      if (t.b.shape.join(",") !== `${outF},${r}`) throw new Error(`LoRA: ${name}.lora_B has shape [${t.b.shape}], expected [${outF}, ${r}]`);
      const v = (x: tf.Tensor, part: string) => tf.variable(x.toFloat(), true, `lora${serial}/${name}.${part}`);
      const owner = this.aOwner.get(name);
      // a tied module uses its owner's A variable (created first: owners precede their parts in model order)
      const a = owner ? this.modules.get(owner)?.a : v(t.a, "lora_A");
      if (!a) throw new Error(`LoRA: '${name}' shares the A of '${owner}', which comes after it`);
      this.modules.set(name, { a, b: v(t.b, "lora_B"), inFeatures: inF, outFeatures: outF });
    }
  }

  /** The trainable name of a module's A or B (a tied module's A is its owner's). */
  paramName(module: string, part: "A" | "B"): string {
    return `${part === "A" ? this.aOwner.get(module) ?? module : module}.lora_${part}.weight`;
  }

  /** A fresh adapter: A from `rng` by settings.initA (kaiming-uniform, a = sqrt 5, by default), B by settings.initB (zero by default). */
  static init(config: ModelConfig, settings: LoraSettings, rng: Rng, keyPrefix: string | KeyNamer = "model"): LoraAdapter {
    validateLoraSettings(settings, keyPrefix);
    const shapes = linearModules(config), r = settings.rank;
    const targets = selectTargets(config, settings, keyPrefix);
    checkRankFits(config, r, targets, keyPrefix);
    const tensors = new Map<string, { a: tf.Tensor; b: tf.Tensor }>();
    const tied = new Set((settings.tiedA ?? []).flatMap((g) => g.slice(1)));
    for (const name of targets) {
      const [outF, inF] = shapes.get(name)!;
      // a tied module's A is its owner's: drawn once, so the seeded stream is the fused adapter's
      const a = tied.has(name) ? tf.zeros([r, inF]) : tf.tensor2d(drawInit(r, inF, settings.initA ?? "kaiming", rng), [r, inF]);
      tensors.set(name, { a, b: tf.zeros([outF, r]) });
    }
    // B after every A, from the same stream and only when asked: the As are the same whatever B's init
    const initB = settings.initB ?? "zero";
    if (initB !== "zero") {
      for (const name of targets) {
        const t = tensors.get(name)!, outF = shapes.get(name)![0];
        t.b.dispose();
        t.b = tf.tensor2d(drawInit(outF, r, initB, rng), [outF, r]);
      }
    }
    try {
      return new LoraAdapter(settings, config, tensors);
    } finally {
      for (const t of tensors.values()) tf.dispose([t.a, t.b]);
    }
  }

  has(module: string): boolean {
    return this.modules.has(module);
  }

  /** scale * B A, the update a merge adds to W [out, in]. */
  mergedDelta(name: string): tf.Tensor2D {
    const m = this.modules.get(name)!;
    return tf.tidy(() => tf.matMul(m.b, m.a).mul(this.scale) as tf.Tensor2D);
  }

  /**
   * The trainable tensors by internal name (`<module>.lora_A.weight` / `.lora_B.weight`), in a fixed
   * order; a shared A appears once, under its owner's name (one optimizer state, one gradient).
   */
  namedParams(): Map<string, tf.Variable> {
    if (this.named.size === 0) {
      for (const [name, m] of this.modules) {
        if (!this.aOwner.has(name)) this.named.set(`${name}.lora_A.weight`, m.a);
        this.named.set(`${name}.lora_B.weight`, m.b);
      }
    }
    return this.named;
  }

  private readonly named = new Map<string, tf.Variable>();

  trainableVariables(): tf.Variable[] {
    return [...this.namedParams().values()];
  }

  dispose(): void {
    for (const [name, m] of this.modules) tf.dispose(this.aOwner.has(name) ? [m.b] : [m.a, m.b]);
    this.modules.clear();
    this.named.clear();
  }
}
