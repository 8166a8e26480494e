// The committed model-family fixtures (test/models/fixtures/families/<family>/, made with
// transformers 5.17 by scripts/make_family_fixtures.py): a random-weight folder per family
// and transformers' reference greedy tokens, logits and log-probs.
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { readSafetensors, type NamedArray } from "../../src/models/safetensors.js";

export const FAMILIES_DIR = fileURLToPath(new URL("../../../test/models/fixtures/families/", import.meta.url));

export const FAMILY_FIXTURES = ["qwen3", "qwen3_untied", "qwen3_moe", "gemma2", "gemma3_text", "mistral", "qwen2_sliding", "llama_bias"] as const;

export interface Reference {
  prompts: number[][];
  greedy: number[][];
  loss_with_aux?: number;
  aux_loss?: number;
  router_aux_loss_coef?: number;
  moe_sequence?: number;
  tensors: Map<string, NamedArray>;
}

export function fixtureDir(name: string): string {
  const d = join(FAMILIES_DIR, name);
  if (!existsSync(join(d, "config.json"))) throw new Error(`fixture ${d} is missing (committed under test/models/fixtures/families)`);
  return d;
}

export function reference(name: string): Reference {
  const d = fixtureDir(name);
  const j = JSON.parse(readFileSync(join(d, "reference.json"), "utf8")) as Omit<Reference, "tensors">;
  return { ...j, tensors: readSafetensors(join(d, "reference.safetensors")).tensors };
}

/** The largest |a - b| over two arrays of the same length. */
export function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} != ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}
