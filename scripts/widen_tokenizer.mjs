#!/usr/bin/env node
// A byte-level BPE tokenizer folder with a vocabulary of a given size, for running a policy of a
// real model's shape (e.g. Qwen3-0.6B's 151,936 rows) without that model's tokenizer: the
// fixture tokenizer's 320 tokens encode the prompts, and ids past them decode to " t<id>"
// (vocabulary entries no merge produces), so every id a random policy samples is text.
// Usage: node scripts/widen_tokenizer.mjs OUT_DIR [VOCAB=151936] [SOURCE_DIR=test/models/fixtures/families/qwen3]
import { mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [out, vocabArg, srcArg] = process.argv.slice(2);
if (!out) { console.error("usage: node scripts/widen_tokenizer.mjs OUT_DIR [VOCAB] [SOURCE_DIR]"); process.exit(2); }
const size = Number(vocabArg ?? 151936), src = srcArg ?? "test/models/fixtures/families/qwen3";
const tok = JSON.parse(readFileSync(join(src, "tokenizer.json"), "utf8"));
const vocab = tok.model.vocab, have = Object.keys(vocab).length;
if (!Number.isInteger(size) || size < have) { console.error(`VOCAB must be an integer >= ${have} (the source's), got ${vocabArg}`); process.exit(2); }
for (let id = have; id < size; id++) vocab[`Ġt${id}`] = id; // Ġ is the byte-level space
mkdirSync(out, { recursive: true });
const write = (name, obj) => { const p = join(out, name); writeFileSync(p + ".tmp", JSON.stringify(obj)); renameSync(p + ".tmp", p); };
write("tokenizer.json", tok);
write("tokenizer_config.json", {
  ...JSON.parse(readFileSync(join(src, "tokenizer_config.json"), "utf8")),
  model_max_length: 40960, chat_template: "{% for m in messages %}{{ m['content'] }}{% endfor %}",
});
console.log(`${out}: ${size} tokens (${have} from ${src})`);
