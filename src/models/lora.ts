// LoRA adapters (verl's model.lora_rank / lora_alpha / target_modules /
// exclude_modules), with the semantics of Hugging Face peft: every targeted
// linear W [out, in] gains A [r, in] and B [out, r], and computes
// x W^T + (alpha / r) (x A^T) B^T. A starts kaiming-uniform (a = sqrt 5, i.e.
// U(-1/sqrt(in), 1/sqrt(in))), B at zero, so a fresh adapter leaves the model
// unchanged. The base weights stay frozen: only A and B train (and, under DoRA, the
// magnitude vector m [out], which starts at the row norms of W + s B A).
import * as tf from "@tensorflow/tfjs";
import type { Rng } from "../utils/rng.js";
import type { ModelConfig } from "./config.js";
import { parameterShapes } from "./llama.js";
import { AdapterDropout, type DropoutPosition } from "./lora_dropout.js";
import type { LoraBlock } from "./lora_linear.js";

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
  /** Dropout probability on the adapter branch in training passes (0 = none: the default). */
  dropout?: number;
  /** Where the dropout applies: pre (the default) or post; see lora_dropout.ts. */
  dropoutPosition?: DropoutPosition;
  /** DoRA (peft's use_dora, Megatron-Bridge's type=dora): a trained magnitude per output row. */
  useDora?: boolean;
}

export interface LoraModule {
  a: tf.Variable;
  b: tf.Variable;
  /** DoRA's magnitude m [out] (peft's lora_magnitude_vector). */
  magnitude?: tf.Variable;
  inFeatures: number;
  outFeatures: number;
}

/** What a module's adapter is made of: A, B and, under DoRA, the magnitude m. */
export interface LoraTensors { a: tf.Tensor; b: tf.Tensor; m?: tf.Tensor }

/** ||W + s B A|| per output row [out]: DoRA's norm (the 2-norm over the input axis, as peft and Megatron-Bridge take it). */
export function doraWeightNorm(w: tf.Tensor2D, a: tf.Tensor2D, b: tf.Tensor2D, scale: number): tf.Tensor1D {
  return tf.tidy(() => tf.sqrt(tf.sum(tf.square(tf.add(w, tf.matMul(b, a).mul(scale))), 1)) as tf.Tensor1D);
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
  const p = s.dropout ?? 0;
  if (!(p >= 0 && p < 1)) throw new Error(`${key("lora_dropout")} must be in [0, 1), got ${p}`);
  if (s.dropoutPosition !== undefined && s.dropoutPosition !== "pre" && s.dropoutPosition !== "post") {
    throw new Error(`${key("dropout_position")} is ${JSON.stringify(s.dropoutPosition)}; choose pre or post`);
  }
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

  /** Dropout on the adapter branch in training passes, or null (none). */
  readonly dropout: { p: number; position: DropoutPosition } | null;

  /** Module -> the module whose A it uses (tied modules only). */
  private readonly aOwner = new Map<string, string>();

  /** The dropout of the training pass under way (trainingPass), else null: inference passes have none. */
  private pass: AdapterDropout | null = null;

  constructor(readonly settings: LoraSettings, readonly config: ModelConfig, tensors: Map<string, LoraTensors>) {
    validateLoraSettings(settings);
    this.scale = settings.alpha / settings.rank;
    const p = settings.dropout ?? 0;
    this.dropout = p > 0 ? { p, position: settings.dropoutPosition ?? "pre" } : null;
    const shapes = linearModules(config);
    const serial = adapterSerial++;
    for (const group of settings.tiedA ?? []) for (const m of group.slice(1)) if (tensors.has(m) && tensors.has(group[0]!)) this.aOwner.set(m, group[0]!);
    for (const [name, t] of tensors) {
      const shape = shapes.get(name);
      if (!shape) throw new Error(`LoRA: '${name}' is not a linear module of the model`);
      const [outF, inF] = shape, r = settings.rank;
      if (t.a.shape.join(",") !== `${r},${inF}`) throw new Error(`LoRA: ${name}.lora_A has shape [${t.a.shape}], expected [${r}, ${inF}]`);
      if (t.b.shape.join(",") !== `${outF},${r}`) throw new Error(`LoRA: ${name}.lora_B has shape [${t.b.shape}], expected [${outF}, ${r}]`);
      if (settings.useDora && !t.m) throw new Error(`LoRA: ${name} has no lora_magnitude_vector, which DoRA (use_dora) needs`);
      if (!settings.useDora && t.m) throw new Error(`LoRA: ${name} has a lora_magnitude_vector but the adapter is not DoRA (use_dora is false)`);
      if (t.m && t.m.shape.join(",") !== `${outF}`) throw new Error(`LoRA: ${name}.lora_magnitude_vector has shape [${t.m.shape}], expected [${outF}]`);
      const v = (x: tf.Tensor, part: string) => tf.variable(x.toFloat(), true, `lora${serial}/${name}.${part}`);
      const owner = this.aOwner.get(name);
      // a tied module uses its owner's A variable (created first: owners precede their parts in model order)
      const a = owner ? this.modules.get(owner)?.a : v(t.a, "lora_A");
      if (!a) throw new Error(`LoRA: '${name}' shares the A of '${owner}', which comes after it`);
      this.modules.set(name, { a, b: v(t.b, "lora_B"), ...(t.m ? { magnitude: v(t.m, "lora_magnitude_vector") } : {}), inFeatures: inF, outFeatures: outF });
    }
  }

  /** The trainable name of a module's A, B or DoRA magnitude M (a tied module's A is its owner's). */
  paramName(module: string, part: "A" | "B" | "M"): string {
    if (part === "M") return `${module}.lora_magnitude_vector`;
    return `${part === "A" ? this.aOwner.get(module) ?? module : module}.lora_${part}.weight`;
  }

  /**
   * A fresh adapter: A from `rng` by settings.initA (kaiming-uniform, a = sqrt 5, by default), B by
   * settings.initB (zero by default); under DoRA m = ||W + s B A|| per row, so the adapted model
   * starts as the base one. `baseWeight` gives a module's W [out, in] (DoRA needs it).
   */
  static init(config: ModelConfig, settings: LoraSettings, rng: Rng, keyPrefix: string | KeyNamer = "model", baseWeight?: (module: string) => tf.Tensor2D): LoraAdapter {
    validateLoraSettings(settings, keyPrefix);
    const shapes = linearModules(config), r = settings.rank;
    const targets = selectTargets(config, settings, keyPrefix);
    checkRankFits(config, r, targets, keyPrefix);
    const tensors = new Map<string, LoraTensors>();
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
    if (settings.useDora) {
      if (!baseWeight) throw new Error("LoraAdapter.init: DoRA needs the base weights (its magnitude starts at their row norms)");
      // a tied module's A is zeros here: take its owner's
      const owner = new Map((settings.tiedA ?? []).flatMap((g) => g.slice(1).map((m) => [m, g[0]!] as const)));
      const scale = settings.alpha / settings.rank;
      for (const name of targets) {
        const t = tensors.get(name)!, a = tensors.get(owner.get(name) ?? name)?.a ?? t.a;
        t.m = doraWeightNorm(baseWeight(name), a as tf.Tensor2D, t.b as tf.Tensor2D, scale);
      }
    }
    try {
      return new LoraAdapter(settings, config, tensors);
    } finally {
      for (const t of tensors.values()) tf.dispose([t.a, t.b, ...(t.m ? [t.m] : [])]);
    }
  }

  has(module: string): boolean {
    return this.modules.has(module);
  }

  /** W [out, in] with the adapter merged in: W + s B A, or under DoRA m (W + s B A) / ||W + s B A|| per row. */
  mergedWeight(name: string, w: tf.Tensor2D): tf.Tensor2D {
    const m = this.modules.get(name)!;
    return tf.tidy(() => {
      // on WebGPU one fused product with W as its bias (the GPU merges every adapted module for
      // every rollout: a product, a scale and an add were three kernels each); wasm's fused product
      // takes no matrix bias
      const merged = (tf.getBackend() === "webgpu"
        ? tf.fused.matMul({ a: this.scale === 1 ? m.b : (tf.mul(m.b, this.scale) as tf.Tensor2D), b: m.a, bias: w })
        : tf.add(w, tf.matMul(m.b, m.a).mul(this.scale))) as tf.Tensor2D;
      if (!m.magnitude) return merged;
      const norm = tf.sqrt(tf.sum(tf.square(merged), 1, true));
      return tf.mul(merged, tf.div(m.magnitude.reshape([-1, 1]), norm)) as tf.Tensor2D;
    });
  }

  /**
   * The loraLinear block of adapted module `name` on `rows` input rows: its A, B (and DoRA's m) as
   * `tensor` resolves their trainable names (a recomputed layer passes its own copies), DoRA's
   * detached norm, and the pass's dropout masks (one input mask per A, so the parts of a fused
   * module share it, as Megatron's single adapter on linear_qkv does).
   */
  block(name: string, w: tf.Tensor2D, rows: number, tensor: (n: string) => tf.Tensor, drop: AdapterDropout | null, inMasks?: Map<string, tf.Tensor2D>): LoraBlock {
    const m = this.modules.get(name)!;
    const a = tensor(this.paramName(name, "A")) as tf.Tensor2D, b = tensor(this.paramName(name, "B")) as tf.Tensor2D;
    const bl: LoraBlock = { w, a, b };
    if (m.magnitude) {
      bl.magnitude = tensor(this.paramName(name, "M")) as tf.Tensor1D;
      bl.weightNorm = doraWeightNorm(w, a, b, this.scale);
    }
    if (drop?.position === "pre") {
      // modules sharing an A share its input mask: one tensor (a memo per fused call), so the fused product masks once
      const key = this.aOwner.get(name) ?? name;
      bl.dropIn = inMasks?.get(key) ?? drop.mask(key, rows, m.inFeatures);
      inMasks?.set(key, bl.dropIn);
    } else if (drop) bl.dropOut = drop.mask(name, rows, m.outFeatures);
    return bl;
  }

  /**
   * Runs `fn` (synchronously) as a training pass: the adapter's dropout applies, with masks drawn
   * from `seed`. Everything else (log-probs, values, the rollout's merged weights) runs without,
   * as verl's Megatron workers compute them in eval mode.
   */
  trainingPass<T>(seed: number, fn: () => T): T {
    if (!this.dropout) return fn();
    const prev = this.pass;
    this.pass = new AdapterDropout(this.dropout.p, this.dropout.position, seed);
    try {
      return fn();
    } finally {
      this.pass = prev;
    }
  }

  /** The dropout of the training pass under way, or null. */
  activeDropout(): AdapterDropout | null {
    return this.pass;
  }

  /**
   * The trainable tensors by internal name (`<module>.lora_A.weight` / `.lora_B.weight`, DoRA's
   * `.lora_magnitude_vector`), in a fixed
   * order; a shared A appears once, under its owner's name (one optimizer state, one gradient).
   */
  namedParams(): Map<string, tf.Variable> {
    if (this.named.size === 0) {
      for (const [name, m] of this.modules) {
        if (!this.aOwner.has(name)) this.named.set(`${name}.lora_A.weight`, m.a);
        this.named.set(`${name}.lora_B.weight`, m.b);
        if (m.magnitude) this.named.set(`${name}.lora_magnitude_vector`, m.magnitude);
      }
    }
    return this.named;
  }

  private readonly named = new Map<string, tf.Variable>();

  trainableVariables(): tf.Variable[] {
    return [...this.namedParams().values()];
  }

  dispose(): void {
    for (const [name, m] of this.modules) tf.dispose([...(this.aOwner.has(name) ? [m.b] : [m.a, m.b]), ...(m.magnitude ? [m.magnitude] : [])]);
    this.modules.clear();
    this.named.clear();
  }
}

/**
 * `fn` as a training pass of `adapter`: its dropout on, the masks seeded from `rng` (drawn only
 * when the adapter has dropout, so a run without keeps its random stream).
 */
export function trainingForward<T>(adapter: LoraAdapter | undefined, rng: Rng, fn: () => T): T {
  return adapter?.dropout ? adapter.trainingPass(rng.nextU32(), fn) : fn();
}
