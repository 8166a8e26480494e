// The weights a LoRA model decodes and exports with: W + (alpha / r) B A for every
// adapted module, the base weight elsewhere. Rollout engines and the Hugging Face
// export read this view, so they never need to know about adapters.
import * as tf from "@tensorflow/tfjs";
import type { LlamaModel } from "./llama.js";

/** Identities of everything the merged view depends on (changes when the optimizer updates a weight or an adapter). */
export function weightIdentity(model: LlamaModel): object[] {
  const ids = [...model.params.values()].map((v) => v.dataId);
  if (model.lora) ids.push(...model.lora.trainableVariables().map((v) => v.dataId));
  return ids;
}

/**
 * Each parameter by HF name, merged. `fn` gets the tensor (the variable itself when
 * unadapted, a temporary merged tensor otherwise, disposed after `fn` returns).
 */
export async function forEachMergedWeight(model: LlamaModel, fn: (name: string, t: tf.Tensor) => Promise<void> | void): Promise<void> {
  for (const [name, v] of model.params) {
    const mod = name.endsWith(".weight") ? name.slice(0, -".weight".length) : "";
    if (!model.lora?.has(mod)) { await fn(name, v); continue; }
    const merged = tf.tidy(() => tf.add(v, model.lora!.mergedDelta(mod)));
    try {
      await fn(name, merged);
    } finally {
      merged.dispose();
    }
  }
}

/** One merged parameter, read synchronously (backends that allow it). */
export function mergedWeightSync(model: LlamaModel, name: string): Float32Array {
  const v = model.p(name), mod = name.slice(0, -".weight".length);
  if (!model.lora?.has(mod)) return v.dataSync() as Float32Array;
  return tf.tidy(() => tf.add(v, model.lora!.mergedDelta(mod)).dataSync() as Float32Array);
}

/** One merged parameter read back asynchronously (WebGPU has no synchronous read). */
export async function mergedWeight(model: LlamaModel, name: string): Promise<Float32Array> {
  const v = model.p(name), mod = name.endsWith(".weight") ? name.slice(0, -".weight".length) : "";
  if (!model.lora?.has(mod)) return (await v.data()) as Float32Array;
  const m = tf.tidy(() => tf.add(v, model.lora!.mergedDelta(mod)));
  try {
    return (await m.data()) as Float32Array;
  } finally {
    m.dispose();
  }
}

/** Every merged parameter read back asynchronously (float32 copies). */
export async function mergedHostWeights(model: LlamaModel): Promise<Map<string, { data: Float32Array; shape: number[] }>> {
  const out = new Map<string, { data: Float32Array; shape: number[] }>();
  await forEachMergedWeight(model, async (name, t) => { out.set(name, { data: Float32Array.from((await t.data()) as Float32Array), shape: [...t.shape] }); });
  return out;
}
