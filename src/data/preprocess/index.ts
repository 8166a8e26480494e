// Preprocessor registry: `verl preprocess <name>` looks the name up here. Users add
// their own data sets with registerPreprocessor.
import { preprocessArithmetic } from "./arithmetic.js";
import { preprocessGsm8k } from "./gsm8k.js";
import type { Preprocessor } from "./types.js";

export type { Preprocessor, PreprocessOptions, PreprocessResult } from "./types.js";
export { ARITHMETIC_ALPHABET, arithmeticRow, arithmeticPairs, arithmeticQuestion, arithmeticAnswer } from "./arithmetic.js";
export { gsm8kRow, extractGsm8kGroundTruth, GSM8K_DATA_SOURCE, GSM8K_INSTRUCTION, GSM8K_AGENT_INSTRUCTION, GSM8K_AGENT_SYSTEM_PROMPT } from "./gsm8k.js";

const registry = new Map<string, Preprocessor>();

/** Register `fn` under `name`; registering a different function under a taken name is an error. */
export function registerPreprocessor(name: string, fn: Preprocessor): void {
  const existing = registry.get(name);
  if (existing && existing !== fn) throw new Error(`a different preprocessor is already registered as '${name}'`);
  registry.set(name, fn);
}

export function getPreprocessor(name: string): Preprocessor {
  const fn = registry.get(name);
  if (!fn) throw new Error(`unknown dataset '${name}' for preprocess (known: ${[...registry.keys()].sort().join(", ")})`);
  return fn;
}

export function listPreprocessors(): string[] {
  return [...registry.keys()].sort();
}

registerPreprocessor("gsm8k", preprocessGsm8k);
registerPreprocessor("arithmetic", preprocessArithmetic);
