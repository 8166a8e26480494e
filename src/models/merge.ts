// The weights a LoRA model decodes and exports with: W + (alpha / r) B A for every
// adapted module (DoRA: that, rescaled to its magnitude per row), the base weight elsewhere. Rollout engines and the Hugging Face
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
 * One parameter as the rollout and the export see it: the variable itself when unadapted, else a new
 * tensor (LoraAdapter.mergedWeight) that the caller disposes (or makes inside a tidy).
 */
export function mergedTensor(model: LlamaModel, name: string): tf.Tensor {
  const v = model.p(name), mod = name.endsWith(".weight") ? name.slice(0, -".weight".length) : "";
  return model.lora?.has(mod) ? model.lora.mergedWeight(mod, v as tf.Tensor2D) : v;
}

/** Runs `fn` on the merged tensor of `name`, disposing a temporary one afterwards. */
async function withMerged<T>(model: LlamaModel, name: string, fn: (t: tf.Tensor) => T | Promise<T>): Promise<T> {
  const t = mergedTensor(model, name);
  try {
    return await fn(t);
  } finally {
    if (t !== model.p(name)) t.dispose();
  }
}

/** Each parameter by HF name, merged; `fn` gets the tensor (a temporary one is disposed after `fn` returns). */
export async function forEachMergedWeight(model: LlamaModel, fn: (name: string, t: tf.Tensor) => Promise<void> | void): Promise<void> {
  for (const name of model.params.keys()) await withMerged(model, name, (t) => fn(name, t));
}

/** One merged parameter, read synchronously (backends that allow it). */
export function mergedWeightSync(model: LlamaModel, name: string): Float32Array {
  const t = mergedTensor(model, name);
  try {
    return t.dataSync() as Float32Array;
  } finally {
    if (t !== model.p(name)) t.dispose();
  }
}

/** One merged parameter read back asynchronously (WebGPU has no synchronous read). */
export function mergedWeight(model: LlamaModel, name: string): Promise<Float32Array> {
  return withMerged(model, name, async (t) => (await t.data()) as Float32Array);
}

/** Every merged parameter read back asynchronously (float32 copies). */
export async function mergedHostWeights(model: LlamaModel): Promise<Map<string, { data: Float32Array; shape: number[] }>> {
  const out = new Map<string, { data: Float32Array; shape: number[] }>();
  await forEachMergedWeight(model, async (name, t) => { out.set(name, { data: Float32Array.from((await t.data()) as Float32Array), shape: [...t.shape] }); });
  return out;
}
