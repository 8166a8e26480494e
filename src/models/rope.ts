// Rotary position embeddings: the inverse frequencies, with the scalings transformers applies
// (modeling_rope_utils: linear, dynamic NTK, llama3), and the two config.json layouts that carry
// them: transformers 4's top-level rope_theta + rope_scaling, transformers 5's rope_parameters.
// Sums run in float32 where PyTorch's do, so the frequencies match to the last bit or two.
// applyRope rotates q and k by the tables (one fused kernel on WebGPU when the fused switch is on).
import * as tf from "@tensorflow/tfjs";
import { matmul } from "../engine/matmul.js";
import { fusedRope, fusedRopeFor, fusedRopeGrad } from "../engine/webgpu_fused_rope.js";

export type RopeScaling =
  /** Positions divided by `factor` (inv_freq / factor). */
  | { type: "linear"; factor: number }
  /** NTK-aware: past max_position_embeddings the base grows with the sequence; within it, no change. */
  | { type: "dynamic"; factor: number; maxPositionEmbeddings: number }
  /** Llama 3.1: low frequencies / factor, high ones kept, a smooth blend between. */
  | { type: "llama3"; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number };

export const ROPE_TYPES = ["default", "linear", "dynamic", "llama3"] as const;

const f32 = Math.fround;

/** theta^(-2i/d) for i < d/2, in float32 as torch computes `1 / base ** (arange(0, d, 2).float() / d)`. */
function baseInvFreq(headDim: number, theta: number): Float32Array {
  const f = new Float32Array(headDim / 2);
  for (let i = 0; i < f.length; i++) f[i] = 1 / f32(Math.pow(theta, f32((2 * i) / headDim)));
  return f;
}

/**
 * The rotary inverse frequencies. `seqLen` (max position + 1) matters only to dynamic scaling,
 * which changes nothing until the sequence outgrows max_position_embeddings.
 */
export function ropeInvFreq(headDim: number, theta: number, scaling: RopeScaling | null = null, seqLen?: number): Float32Array {
  if (!scaling) return baseInvFreq(headDim, theta);
  switch (scaling.type) {
    case "linear":
      return baseInvFreq(headDim, theta).map((x) => f32(x / scaling.factor));
    case "dynamic": {
      const max = scaling.maxPositionEmbeddings, len = Math.max(seqLen ?? max, max);
      if (len === max) return baseInvFreq(headDim, theta);
      const base = theta * Math.pow(scaling.factor * len / max - (scaling.factor - 1), headDim / (headDim - 2));
      return baseInvFreq(headDim, base);
    }
    case "llama3": {
      const { factor, lowFreqFactor: lo, highFreqFactor: hi, originalMaxPositionEmbeddings: old } = scaling;
      const lowWavelen = old / lo, highWavelen = old / hi;
      return baseInvFreq(headDim, theta).map((inv) => {
        const wavelen = f32(f32(2 * Math.PI) / inv);
        if (wavelen > lowWavelen) return f32(inv / factor);
        if (wavelen < highWavelen) return inv;
        const smooth = f32(f32(f32(old / wavelen) - lo) / (hi - lo));
        return f32(f32(f32(f32(1 - smooth) * inv) / factor) + f32(smooth * inv));
      });
    }
  }
}

type Json = Record<string, unknown>;

function positive(v: unknown, what: string, file: string): number {
  if (typeof v !== "number" || !(v > 0)) throw new Error(`${file}: ${what} must be a positive number, got ${JSON.stringify(v)}`);
  return v;
}

/**
 * rope theta and scaling from a config.json in either layout. Unknown rope types (yarn, longrope, ...)
 * are refused: running them as plain RoPE would silently give other logits.
 */
export function readRopeConfig(j: Json, file: string, maxPositionEmbeddings: number): { theta: number; scaling: RopeScaling | null } {
  const nested = j["rope_parameters"];
  const params = (nested !== null && typeof nested === "object" ? nested : j["rope_scaling"] ?? null) as Json | null;
  const where = nested !== null && typeof nested === "object" ? "rope_parameters" : "rope_scaling";
  if (params !== null && (typeof params !== "object" || Array.isArray(params))) throw new Error(`${file}: ${where} must be an object, got ${JSON.stringify(params)}`);
  const thetaRaw = params?.["rope_theta"] ?? j["rope_theta"] ?? 10000;
  const theta = positive(thetaRaw, `${params?.["rope_theta"] !== undefined ? `${where}.rope_theta` : "rope_theta"}`, file);
  const partial = params?.["partial_rotary_factor"] ?? j["partial_rotary_factor"];
  if (partial !== undefined && partial !== null && partial !== 1) throw new Error(`${file}: partial_rotary_factor ${JSON.stringify(partial)} is not supported (only 1.0)`);
  const type = params?.["rope_type"] ?? params?.["type"] ?? "default";
  const factor = () => positive(params!["factor"], `${where}.factor`, file);
  switch (type) {
    case "default": return { theta, scaling: null };
    case "linear": return { theta, scaling: { type: "linear", factor: factor() } };
    case "dynamic": return { theta, scaling: { type: "dynamic", factor: factor(), maxPositionEmbeddings } };
    case "llama3": {
      const lowFreqFactor = positive(params!["low_freq_factor"], `${where}.low_freq_factor`, file);
      const highFreqFactor = positive(params!["high_freq_factor"], `${where}.high_freq_factor`, file);
      if (!(highFreqFactor > lowFreqFactor)) throw new Error(`${file}: ${where}.high_freq_factor (${highFreqFactor}) must be greater than low_freq_factor (${lowFreqFactor})`);
      const original = positive(params!["original_max_position_embeddings"] ?? j["original_max_position_embeddings"] ?? maxPositionEmbeddings, `${where}.original_max_position_embeddings`, file);
      return { theta, scaling: { type: "llama3", factor: factor(), lowFreqFactor, highFreqFactor, originalMaxPositionEmbeddings: original } };
    }
    default:
      throw new Error(`${file}: ${where}.rope_type ${JSON.stringify(type)} is not supported (supported: ${ROPE_TYPES.join(", ")}); running it as plain RoPE would give other logits`);
  }
}

/** The rope keys of a config.json both transformers 4 (rope_theta, rope_scaling) and 5 (rope_parameters) read. */
export function ropeToHf(theta: number, scaling: RopeScaling | null): Json {
  let extra: Json | null = null;
  if (scaling?.type === "linear" || scaling?.type === "dynamic") extra = { rope_type: scaling.type, factor: scaling.factor };
  else if (scaling?.type === "llama3") {
    extra = {
      rope_type: "llama3", factor: scaling.factor, low_freq_factor: scaling.lowFreqFactor,
      high_freq_factor: scaling.highFreqFactor, original_max_position_embeddings: scaling.originalMaxPositionEmbeddings,
    };
  }
  return {
    rope_theta: theta,
    rope_scaling: extra && { ...extra, type: extra.rope_type },
    rope_parameters: { rope_type: "default", ...(extra ?? {}), rope_theta: theta },
  };
}

/**
 * Rotary embedding of q and k heads x [N, heads, hd] by cos/sin [N, 1, hd] (HF's rotate_half
 * convention): x cos + rotate_half(x) sin, with rotate_half as the product with `rot` [hd, hd].
 * cos and sin are constants (no gradient). On WebGPU with the fused kernels on, one dispatch each
 * way (engine/webgpu_fused_rope.ts); elsewhere this composite, unchanged.
 */
export function applyRope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, rot: tf.Tensor2D): tf.Tensor {
  if (fusedRopeFor(x, cos, sin)) {
    const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
      const [xs, save] = args as [tf.Tensor, tf.GradSaveFunc];
      save([cos, sin]);
      return { value: fusedRope(xs, cos, sin), gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [fusedRopeGrad(dy as tf.Tensor, saved[0]!, saved[1]!)] };
    });
    return op(x) as tf.Tensor;
  }
  const xRot = matmul(x.reshape([-1, rot.shape[0]]) as tf.Tensor2D, rot).reshape(x.shape);
  return x.mul(cos).add(xRot.mul(sin));
}
