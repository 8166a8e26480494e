// Dropout on the LoRA branch (Megatron-Bridge's lora.dropout / dropout_position, peft's
// lora_dropout), for training passes only. Each pass has a seed; a mask is a function of that seed
// and the adapter it belongs to, so the same seed gives the same masks, and a layer recomputed in
// the backward pass (gradient checkpointing) sees the masks of its forward.
import * as tf from "@tensorflow/tfjs";
import { Rng } from "../utils/rng.js";

/** pre: on the adapter's input, before A (Megatron-Bridge's default, peft's only form); post: on its output, after B. */
export type DropoutPosition = "pre" | "post";

/** 32-bit FNV-1a of a string: the per-adapter part of a mask's seed. */
function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

export class AdapterDropout {
  constructor(readonly p: number, readonly position: DropoutPosition, readonly seed: number) {
    if (!(p > 0 && p < 1)) throw new Error(`AdapterDropout: p must be in (0, 1), got ${p}`);
  }

  /**
   * The keep-mask [rows, cols] of the adapter `key` in this pass: 1 / (1 - p) with probability
   * 1 - p, else 0 (torch's Dropout). Drawn on the host from the seeded stream, so every backend
   * gets the same mask.
   */
  mask(key: string, rows: number, cols: number): tf.Tensor2D {
    const rng = new Rng((this.seed ^ fnv1a(key)) >>> 0);
    const keep = 1 / (1 - this.p), out = new Float32Array(rows * cols);
    for (let i = 0; i < out.length; i++) out[i] = rng.random() < this.p ? 0 : keep;
    return tf.tensor2d(out, [rows, cols]);
  }
}
