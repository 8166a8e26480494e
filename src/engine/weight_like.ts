// Data that changes only at an optimizer step, as a weight's does, though it is no tf.Variable: a
// LoRA call's stacked A factors and its block-diagonal B (src/models/lora_linear.ts), rebuilt once a
// step. The 16-bit products keep their packed copies as they keep a weight's (PackedWeightCache in
// webgpu_kernels.ts), instead of packing them again on every product.
import type * as tf from "@tensorflow/tfjs";

const weightLike = new WeakSet<object>();

/** Marks t's data as weight-like: packed copies of it are kept until the data is released. */
export function markWeightLike(t: tf.Tensor): void {
  weightLike.add(t.dataId);
}

export function isWeightLike(dataId: object): boolean {
  return weightLike.has(dataId);
}
