// Frozen weights stacked along the output axis (LoRA's fused q/k/v and gate/up base weights),
// packed once for the tensor cores. Without this, every pass of every micro-batch concatenated the
// stack (a float32 copy of the modules' weights) and packed the copy to f16 again: 4 of the ~35
// dispatches of an adapted fused call site's forward and backward, and the update is bound by the
// host's cost per dispatch (docs/gpu.md). The stack's packed words serve both products a pass
// needs, x W^T forward and g W backward (one packing per layout; where the extents pad alike, as at
// the 0.5B shape's 1152 x 896 and 9728 x 896, the two layouts share one set of words). Only the f16
// words are kept (half the stack's float32 bytes), not the float32 stack itself.
import * as tf from "@tensorflow/tfjs";
import { matmulPrecision, onTensorCores, PackedMatrix } from "./webgpu_kernels.js";
import { onRelease } from "./data_release.js";

/** A stack's packed copies, per layout, and the data they were made from. */
interface FrozenStack { ids: object[]; rounding: string; layouts: Map<boolean, PackedMatrix>; dropped: boolean }

/** Frees a stack's words (once: the layouts may share them). */
function drop(stack: FrozenStack): void {
  if (stack.dropped) return;
  stack.dropped = true;
  for (const m of stack.layouts.values()) m.dispose();
}

/** By the first part's data: found from the variables and from their copies (the tensors a backward pass saved). */
const byData = new WeakMap<object, FrozenStack>();

/** Whether frozen stacks are packed here: 16-bit products on WebGPU, unless VERL_FROZEN_PACK=0. */
export function packsFrozenStacks(): boolean {
  return process.env.VERL_FROZEN_PACK !== "0" && onTensorCores();
}

const isFrozenVariable = (t: tf.Tensor) => t instanceof tf.Variable && !t.trainable;

/** Stacks made so far in this thread (tests check that an unchanged stack is packed once). */
export const frozenStackCounts = { stacks: 0, packs: 0 };

function stackFor(parts: tf.Tensor2D[]): FrozenStack | undefined {
  const ids = parts.map((p) => p.dataId), rounding = matmulPrecision();
  const same = (s: FrozenStack | undefined) => s !== undefined && !s.dropped && s.rounding === rounding && s.ids.length === ids.length && s.ids.every((id, i) => id === ids[i]);
  const known = byData.get(ids[0]!);
  if (same(known)) return known;
  // only the frozen variables themselves start a stack: their data changes only by assignment
  if (!parts.every(isFrozenVariable)) return undefined;
  const made: FrozenStack = { ids, rounding, layouts: new Map(), dropped: false };
  byData.set(ids[0]!, made);
  // the words go with the weights: when any part's data is released (a disposed model, or new data
  // assigned and the old data's last copy freed), which also retires the stack a change replaced
  const be = tf.backend() as unknown as Parameters<typeof onRelease>[0];
  for (const id of ids) onRelease(be, id, () => drop(made));
  frozenStackCounts.stacks++;
  return made;
}

/**
 * x times the frozen parts stacked along their first axis (each part [out_j, in]): x W^T
 * (`transposed`, x [N, in]) or x W (x [N, sum out_j]), W the stack, on the tensor cores from the
 * stack's kept packed copy. Undefined where that does not apply (float32 products, another backend,
 * parts that are not frozen variables or copies of them): the caller takes the ordinary product.
 * No gradient is recorded: callers use it inside their own custom gradients.
 */
export function frozenStackProduct(x: tf.Tensor2D, parts: tf.Tensor2D[], transposed: boolean): tf.Tensor2D | undefined {
  if (!packsFrozenStacks()) return undefined;
  const s = stackFor(parts);
  if (!s) return undefined;
  let m = s.layouts.get(transposed) ?? s.layouts.get(!transposed)?.otherLayout();
  if (!m) {
    const rounding = s.rounding === "bf16" ? "bf16" : "f16";
    const stack = parts.length === 1 ? parts[0]! : (tf.concat(parts, 0) as tf.Tensor2D);
    try {
      m = PackedMatrix.pack(stack, transposed, rounding);
    } finally {
      if (stack !== parts[0]) stack.dispose();
    }
    tf.keep(m.words); // past the caller's tidy: kept until the weights change
    frozenStackCounts.packs++;
  }
  s.layouts.set(transposed, m);
  return m.matMul(x, undefined, { trainer: true });
}
