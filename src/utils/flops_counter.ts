// Model FLOPs utilisation as verl counts it (verl/utils/flops_counter.py): the FLOPs of a forward
// and backward pass over the batch's sequences, estimated from the architecture by model_type
// (6 x non-attention parameters per token, plus the attention products over each sequence's length),
// over the device's promised dense bf16 FLOPs from verl's table. A model_type verl has no estimator
// for counts 0 FLOPs (MFU 0), and an unknown device promises infinite FLOPs (MFU 0), as in verl.
import { familyOfConfig, layerWindow, type ModelConfig } from "../models/config.js";
import type { Family } from "../models/families.js";

/** Promised FLOP/s by device name, verl's _DEVICE_FLOPS. */
export const DEVICE_FLOPS: Readonly<Record<string, number>> = {
  CPU: 448e9,
  GB200: 2.5e15,
  B200: 2.25e15,
  MI300X: 1336e12,
  H100: 989e12,
  H800: 989e12,
  H200: 989e12,
  A100: 312e12,
  A800: 312e12,
  L40S: 362.05e12,
  L40: 181.05e12,
  A40: 149.7e12,
  L20: 119.5e12,
  H20: 148e12,
  "910B": 354e12,
  Ascend910: 354e12,
  "RTX 3070 Ti": 21.75e12,
};

// verl scans the names in reverse sorted order and takes the first contained in the device name,
// so "H200" is tried before "H20" and "GB200" before "B200".
const NAMES_SCANNED = Object.keys(DEVICE_FLOPS).sort().reverse();

/** The device's promised FLOP/s: the first table name (reverse sorted) contained in `deviceName`; Infinity when none is. */
export function getDeviceFlops(deviceName: string): number {
  const key = NAMES_SCANNED.find((k) => deviceName.includes(k));
  return key === undefined ? Infinity : DEVICE_FLOPS[key]!;
}

/** Σ seqlen² over the batch. */
function sumSquares(seqlens: readonly number[]): number {
  return seqlens.reduce((a, s) => a + s * s, 0);
}

/** q, k, v and o projections of one layer (verl counts o as heads x head_dim wide). */
function attnLinearParams(c: ModelConfig): number {
  const q = c.nHeads * c.headDim, kv = c.nKvHeads * c.headDim;
  return c.dim * (q + kv + kv + c.nHeads * c.headDim);
}

/** Embedding and output head, counted twice whether tied or not (as verl). */
function embedAndHeadParams(c: ModelConfig): number {
  return c.vocabSize * c.dim * 2;
}

/** llama, qwen2, mimo (its trunk), mistral, qwen3: dense SwiGLU decoders (verl's _estimate_qwen2_flops). */
function denseFlops(c: ModelConfig, tokens: number, seqlens: readonly number[]): number {
  const mlp = c.dim * c.hiddenDim * 3;
  const dense = (mlp + attnLinearParams(c)) * c.nLayers + embedAndHeadParams(c);
  return 6 * dense * tokens + 6 * sumSquares(seqlens) * c.headDim * c.nHeads * c.nLayers;
}

/**
 * qwen3_moe (verl's _estimate_qwen2_moe_flops): every layer counted as sparse, top-k experts of
 * moe_intermediate_size plus the router; verl ignores mlp_only_layers, and so does this count.
 */
function moeFlops(c: ModelConfig, tokens: number, seqlens: readonly number[]): number {
  const moe = c.moe!;
  const mlp = c.dim * moe.topK * moe.intermediateSize * 3 + c.dim * moe.numExperts;
  const dense = (mlp + attnLinearParams(c)) * c.nLayers + embedAndHeadParams(c);
  return 6 * dense * tokens + 6 * sumSquares(seqlens) * c.headDim * c.nHeads * c.nLayers;
}

/** gemma3_text (verl's _estimate_gemma3_flops): GeGLU's 3 matrices; a sliding layer attends to min(seqlen, window) keys. */
function gemma3Flops(c: ModelConfig, tokens: number, seqlens: readonly number[]): number {
  const mlp = c.dim * c.hiddenDim * 3;
  const dense = (mlp + attnLinearParams(c)) * c.nLayers + embedAndHeadParams(c);
  let attended = 0;
  for (let i = 0; i < c.nLayers; i++) {
    const window = layerWindow(c, i);
    for (const s of seqlens) attended += s * (window === null ? s : Math.min(s, window));
  }
  return 6 * dense * tokens + 6 * attended * c.headDim * c.nHeads;
}

type Estimator = (c: ModelConfig, tokens: number, seqlens: readonly number[]) => number;

/** verl's ESTIMATE_FUNC for the families verl-ts runs; gemma2 has no entry in verl's either. */
const ESTIMATORS: Partial<Record<Family, Estimator>> = {
  llama: denseFlops,
  qwen2: denseFlops,
  mimo: denseFlops,
  mistral: denseFlops,
  qwen3: denseFlops,
  qwen3_moe: moeFlops,
  gemma3_text: gemma3Flops,
};

const warnedFamilies = new Set<string>();

/** Counts a model's training FLOPs and relates them to the device (verl's FlopsCounter). */
export class FlopsCounter {
  readonly modelType: Family;
  readonly promisedFlops: number;
  private readonly estimator: Estimator | undefined;

  /** `warn` receives one line, once per process and model_type, when the model_type has no estimator. */
  constructor(readonly config: ModelConfig, readonly deviceName: string, warn?: (line: string) => void) {
    this.modelType = familyOfConfig(config);
    this.estimator = ESTIMATORS[this.modelType];
    this.promisedFlops = getDeviceFlops(deviceName);
    if (!this.estimator && warn && !warnedFamilies.has(this.modelType)) {
      warnedFamilies.add(this.modelType);
      warn(`MFU: verl has a FLOPs estimator for ${Object.keys(ESTIMATORS).join(", ")}, not model_type ${this.modelType}; perf/mfu and train/mfu will be 0`);
    }
  }

  /** FLOPs of one forward and backward pass over sequences of these token counts (0 for a model_type without an estimator). */
  flops(batchSeqlens: readonly number[]): number {
    const tokens = batchSeqlens.reduce((a, b) => a + b, 0);
    return this.estimator ? this.estimator(this.config, tokens, batchSeqlens) : 0;
  }

  /** Achieved and promised FLOP/s for a pass over `batchSeqlens` that took `seconds`. */
  estimateFlops(batchSeqlens: readonly number[], seconds: number): { estimated: number; promised: number } {
    return { estimated: this.flops(batchSeqlens) / seconds, promised: this.promisedFlops };
  }

  /**
   * verl's MFU of one rank: the whole batch's FLOPs per second of this rank's wall time, times the
   * passes over the data (ppo_epochs), over the promised FLOP/s and the world size; a forward-only
   * pass does a third of the work.
   */
  mfu(batchSeqlens: readonly number[], seconds: number, opts: { passes?: number; worldSize?: number; forwardOnly?: boolean } = {}): number {
    const { estimated, promised } = this.estimateFlops(batchSeqlens, seconds);
    const m = (estimated * (opts.passes ?? 1)) / promised / (opts.worldSize ?? 1);
    return opts.forwardOnly ? m / 3 : m;
  }
}
