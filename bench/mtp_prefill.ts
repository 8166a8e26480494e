// Single-turn speculative decoding's prefill on stories260K with a seeded MTP layer (the test
// helper's): 32 prompts of 8 to 64 tokens, sampled at temperature 1, 3 drafts a step; median wall ms
// of 5 runs (after one warm-up) with one response token (the prefill, nearly all of it) and with 32,
// the prompts prefilled together (batched) and one at a time (rows), and whether both give the same output.
// `--wide` uses a random MiMo of hidden size 512 (4 layers, vocabulary 8192) instead, whose products
// gain more from the larger batch than stories260K's (64 wide, bound by per-token work).
// `--dump FILE` writes the tokens and log-probs of each setting (to compare two builds bit for bit).
// Run: node dist/bench/mtp_prefill.js [--cpu] [--wide] [--dump FILE]
import { writeFileSync } from "node:fs";
import { initBackend } from "../src/engine/backend.js";
import { defaultSamplingParams, leftPadPrompts } from "../src/rollout/index.js";
import { generateSpeculative } from "../src/rollout/speculative.js";
import { Rng } from "../src/utils/rng.js";
import { storiesPrompts, storiesWithMtp, tinyMimo } from "../test/rollout/speculative_helpers.js";
import { storiesPath, STORIES_ABSENT } from "./common.js";

const wide = process.argv.includes("--wide"), bin = storiesPath();
if (!bin && !wide) {
  console.log(JSON.stringify({ name: "mtp_prefill", skipped: STORIES_ABSENT }));
  process.exit(0);
}
const backend = process.argv.includes("--cpu") ? "cpu" : "wasm";
const dumpAt = process.argv.indexOf("--dump"), dump = dumpAt > 0 ? process.argv[dumpAt + 1] : undefined;
await initBackend(backend);
const m = wide
  ? tinyMimo(8192, 11, { hidden_size: 512, intermediate_size: 1408, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4 })
  : storiesWithMtp(bin!, 3);
const prompts = leftPadPrompts(storiesPrompts(5).map((p) => (wide ? p.map((t) => t * 16 + 3) : p)), 0);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const out: Record<string, unknown> = {};
for (const responseLength of [1, 32]) {
  const params = defaultSamplingParams({ temperature: 1, responseLength, eosTokenIds: wide ? [] : [2], padTokenId: 0, calculateLogProbs: true });
  const figures: Record<string, number> = {}, outputs: Record<string, number[][]> = {};
  for (const prefill of ["rows", "batched"] as const) {
    const run = () => generateSpeculative(m, prompts, params, new Rng(1), { draftTokens: 3, prefill });
    const first = run(), ms: number[] = [];
    for (let i = 0; i < 5; i++) { const t0 = performance.now(); run(); ms.push(performance.now() - t0); }
    figures[`${prefill}Ms`] = Math.round(median(ms));
    outputs[prefill] = [Array.from(first.batch["responses"]!.data), Array.from(first.batch["rollout_log_probs"]!.data)];
  }
  out[`r${responseLength}`] = { responses: outputs["batched"]![0], logProbs: outputs["batched"]![1] };
  const identical = JSON.stringify(outputs["rows"]) === JSON.stringify(outputs["batched"]);
  console.log(JSON.stringify({ name: "mtp_prefill", model: wide ? "mimo-512" : "stories260K+mtp", backend, prompts: 32, responseLength, draftTokens: 3, ...figures, identical }));
}
if (dump) writeFileSync(dump, JSON.stringify(out));
m.dispose();
