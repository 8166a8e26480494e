// Fresh weights for from-scratch work, initialised as Hugging Face does for
// Llama: every projection and the embedding ~ normal(0, 0.02), norms 1 (Gemma's (1 + w): 0), biases 0.
import * as tf from "@tensorflow/tfjs";
import type { Rng } from "../utils/rng.js";
import type { ModelConfig } from "./config.js";
import { validateConfig } from "./config.js";
import { LlamaModel, parameterShapes, toVariables } from "./llama.js";

export const INIT_STD = 0.02;

export function normalArray(rng: Rng, n: number, std: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.normal() * std;
  return a;
}

/** Initial values for a set of named shapes: `norm` (1; Gemma's (1 + w) norms start at 0) for norm weights, 0 for biases, normal(0, std) otherwise. */
export function initTensors(shapes: Map<string, number[]>, rng: Rng, std = INIT_STD, norm = 1): Map<string, tf.Tensor> {
  const out = new Map<string, tf.Tensor>();
  for (const [name, shape] of shapes) {
    const n = shape.reduce((a, b) => a * b, 1);
    if (name.endsWith("norm.weight")) out.set(name, tf.fill(shape, norm));
    else if (name.endsWith(".bias")) out.set(name, tf.zeros(shape));
    else out.set(name, tf.tensor(normalArray(rng, n, std), shape));
  }
  return out;
}

/** A freshly initialised model (seeded: the same config and seed give the same weights). */
export function initModel(config: ModelConfig, rng: Rng): LlamaModel {
  validateConfig(config);
  const t = initTensors(parameterShapes(config), rng, INIT_STD, config.gemma ? 0 : 1);
  try {
    return new LlamaModel(config, toVariables(t));
  } finally {
    tf.dispose([...t.values()]);
  }
}
