// Tensor helpers shared by the losses: stop-gradient, masked statistics (verl's
// conventions: +1e-8 in denominators, unbiased variance, NaN outside the mask
// ignored) and the EOS response mask. (Entropy from logits is the rollout layer's.)
import * as tf from "@tensorflow/tfjs";
import { constScalar } from "../../../engine/constants.js";
import { fusedMaskedFor, fusedMaskedReduce } from "../../../engine/webgpu_fused_masked.js";

const stopGradientOp = tf.customGrad((x) => {
  const input = x as tf.Tensor;
  return { value: tf.clone(input), gradFunc: (dy: tf.Tensor) => tf.zerosLike(dy) };
});

/** Identity in the forward pass, zero gradient (torch's `.detach()`). */
export function stopGradient<T extends tf.Tensor>(x: T): T {
  return stopGradientOp(x) as T;
}

/**
 * Run `f` off the gradient tape: its result is a constant for backprop (zero gradient
 * to every input). For index/selection logic (topk, gather) that has no gradient.
 */
export function detached(f: (...xs: tf.Tensor[]) => tf.Tensor, ...inputs: tf.Tensor[]): tf.Tensor {
  const op = tf.customGrad((...args) => {
    const xs = args.slice(0, inputs.length) as tf.Tensor[];
    return { value: f(...xs), gradFunc: () => xs.map((x) => tf.zerosLike(x)) };
  });
  return op(...inputs);
}

/**
 * `f()` computed off the gradient tape: the result is a constant with no path back to any
 * variable, so ops without a gradient (comparisons, where) may follow it in a loss. (A
 * customGrad's forward runs as one kernel, whose inner ops the tape does not record.)
 * The result is kept: the caller disposes it.
 */
export function offTape<T extends tf.Tensor>(f: () => T): T {
  let out: T | undefined;
  const op = tf.customGrad((x) => {
    out = tf.keep(f());
    return { value: tf.clone(x as tf.Tensor), gradFunc: (dy: tf.Tensor) => tf.zerosLike(dy) };
  });
  const anchor = tf.scalar(0);
  tf.dispose([op(anchor), anchor]);
  return out!;
}

/** A float32 view of a 0/1 mask of any dtype. */
export function toFloatMask(mask: tf.Tensor): tf.Tensor {
  return mask.dtype === "float32" ? mask : tf.cast(mask, "float32");
}

/** Σ values·mask; values outside the mask (even NaN) do not contribute. On WebGPU a full sum is one fused dispatch. */
export function maskedSum(values: tf.Tensor, mask: tf.Tensor, axis?: number | number[]): tf.Tensor {
  return tf.tidy(() => {
    const m = toFloatMask(mask);
    if (axis === undefined && fusedMaskedFor(values, m)) return fusedMaskedReduce(values, m, false);
    const kept = tf.where(tf.cast(m, "bool"), values, tf.zerosLike(values));
    return tf.sum(tf.mul(kept, m), axis);
  });
}

/** Σ values·mask / (Σ mask + 1e-8). On WebGPU a full mean is one fused dispatch. */
export function maskedMean(values: tf.Tensor, mask: tf.Tensor, axis?: number | number[]): tf.Tensor {
  return tf.tidy(() => {
    const m = toFloatMask(mask);
    if (axis === undefined && fusedMaskedFor(values, m)) return fusedMaskedReduce(values, m, true);
    return tf.div(maskedSum(values, m, axis), tf.add(tf.sum(m, axis), constScalar(1e-8)));
  });
}

/**
 * Variance over the masked elements, unbiased by default (×N/(N−1)). Like verl it
 * refuses N = 0 and N = 1; the check reads Σmask synchronously.
 */
export function maskedVar(values: tf.Tensor, mask: tf.Tensor, unbiased = true): tf.Scalar {
  return tf.tidy(() => {
    const mean = maskedMean(values, mask);
    const variance = maskedMean(tf.square(tf.sub(values, mean)), mask) as tf.Scalar;
    if (!unbiased) return variance;
    const n = tf.sum(toFloatMask(mask)).dataSync()[0]!;
    if (n === 0) throw new Error("maskedVar: the mask selects no element; at least one must be 1");
    if (n === 1) throw new Error("maskedVar: the mask selects one element; the unbiased variance divides by zero (use a larger batch)");
    return tf.mul(variance, n / (n - 1)) as tf.Scalar;
  });
}

/** (values − μ)·rsqrt(var + 1e-8), stats over the mask, applied to every position. */
export function maskedWhiten(values: tf.Tensor, mask: tf.Tensor, shiftMean = true): tf.Tensor {
  return tf.tidy(() => {
    const mean = maskedMean(values, mask);
    const whitened = tf.mul(tf.sub(values, mean), tf.rsqrt(tf.add(maskedVar(values, mask), 1e-8)));
    return shiftMean ? whitened : tf.add(whitened, mean);
  });
}

/**
 * 1 up to and including the first EOS of each row, 0 after it. `eosToken` may be one
 * id or a list of ids.
 */
export function getResponseMask(
  responseIds: tf.Tensor,
  eosToken: number | readonly number[] = 2,
  dtype: "int32" | "float32" = "int32",
): tf.Tensor {
  const ids = typeof eosToken === "number" ? [eosToken] : [...eosToken];
  if (ids.length === 0) throw new Error("getResponseMask: eosToken is an empty list");
  if (responseIds.rank !== 2) throw new Error(`getResponseMask: responseIds must be [B,T], got shape [${responseIds.shape.join(", ")}]`);
  return tf.tidy(() => {
    let isEos: tf.Tensor = tf.zeros(responseIds.shape, "bool");
    for (const id of ids) isEos = tf.logicalOr(isEos, tf.equal(responseIds, id));
    const eos = tf.cast(isEos, "float32");
    const before = tf.sub(tf.cumsum(eos, 1), eos);
    return tf.cast(tf.equal(before, 0), dtype);
  });
}
