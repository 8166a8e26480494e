// A synthetic task small enough for a tiny character-level model trained from
// scratch on a CPU: addition of numbers with up to `digits` digits ("What is
// 23+58?"). Rows follow verl's GSM8K layout with data_source openai/gsm8k, so
// the GSM8K scorer grades answers written as "#### 81". Test questions are held
// out as unordered pairs (neither a+b nor b+a appears in train).
import { Rng } from "../../utils/rng.js";
import { GSM8K_DATA_SOURCE } from "./gsm8k.js";
import { intOption, writeSplits } from "./output.js";
import type { PreprocessOptions, PreprocessResult } from "./types.js";

export function arithmeticQuestion(a: number, b: number): string {
  return `What is ${a}+${b}?`;
}

/** The worked answer a model should learn to write: "23+58=81\n#### 81". */
export function arithmeticAnswer(a: number, b: number): string {
  return `${a}+${b}=${a + b}\n#### ${a + b}`;
}

/** Every character the prompts and answers use, sorted: build the char tokenizer from this. */
export const ARITHMETIC_ALPHABET: string = [...new Set(`${arithmeticQuestion(0, 0)}${arithmeticAnswer(0, 0)}0123456789`)].sort().join("");

export function arithmeticRow(a: number, b: number, split: string, index: number): Record<string, unknown> {
  const question = arithmeticQuestion(a, b);
  return {
    data_source: GSM8K_DATA_SOURCE,
    prompt: [{ role: "user", content: question }],
    ability: "math",
    reward_model: { style: "rule", ground_truth: String(a + b) },
    extra_info: { split, index, answer: arithmeticAnswer(a, b), question },
  };
}

export interface ArithmeticSplits { train: [number, number][]; test: [number, number][] }

/** The operand pairs of both splits, deterministic in (seed, digits, sizes). */
export function arithmeticPairs(numTrain: number, numTest: number, seed: number, digits: number): ArithmeticSplits {
  if (!Number.isInteger(digits) || digits < 1 || digits > 7) throw new Error(`--digits must be an integer in [1, 7], got ${digits}`);
  const range = 10 ** digits;
  const unordered = (range * (range + 1)) / 2;
  if (numTest > unordered / 2) throw new Error(`--num-test ${numTest} is too many for ${digits}-digit sums: at most ${Math.floor(unordered / 2)} (half of the distinct pairs)`);
  const rng = new Rng(seed);
  const draw = (): [number, number] => [rng.int(range), rng.int(range)];
  const key = (a: number, b: number) => (a <= b ? `${a},${b}` : `${b},${a}`);

  const held = new Set<string>();
  const test: [number, number][] = [];
  while (test.length < numTest) {
    const [a, b] = draw();
    const k = key(a, b);
    if (!held.has(k)) { held.add(k); test.push([a, b]); }
  }
  // Train draws from the pairs not held out: distinct while there are enough, else with replacement.
  const heldOrdered = [...held].reduce((n, k) => n + (k.split(",")[0] === k.split(",")[1] ? 1 : 2), 0);
  const distinct = numTrain <= range * range - heldOrdered;
  const used = new Set<string>();
  const train: [number, number][] = [];
  while (train.length < numTrain) {
    const [a, b] = draw();
    if (held.has(key(a, b))) continue;
    if (distinct) {
      const k = `${a},${b}`;
      if (used.has(k)) continue;
      used.add(k);
    }
    train.push([a, b]);
  }
  return { train, test };
}

export async function preprocessArithmetic(opts: PreprocessOptions): Promise<PreprocessResult> {
  const numTrain = intOption(opts.numTrain, "num-train", 20000);
  const numTest = intOption(opts.numTest, "num-test", 500);
  const seed = intOption(opts.seed, "seed", 0);
  const digits = intOption(opts.digits, "digits", 2, 1);
  const { train, test } = arithmeticPairs(numTrain, numTest, seed, digits);
  return writeSplits(opts.localSaveDir ?? "~/data/arithmetic", {
    train: train.map(([a, b], i) => arithmeticRow(a, b, "train", i)),
    test: test.map(([a, b], i) => arithmeticRow(a, b, "test", i)),
  });
}
