// Writes the artifacts that scripts/python_compat.py checks with Python's own tools
// (transformers, tokenizers, pyarrow) on a machine that has them:
//   OUT/hf_stories/        stories260K saved as a Hugging Face folder by verl-ts
//   OUT/reference.json     verl-ts logits, greedy tokens and token ids for fixed inputs
//   OUT/gsm8k/*.parquet    `verl preprocess gsm8k` output
// Usage: node scripts/python-compat-export.mjs OUT   (after npm run build)
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend, loadLlama2c, saveHfModel, loadTokenizer, getPreprocessor, sharedPath, generate, DataProto, tensor, Rng } from "../dist/src/index.js";

const out = process.argv[2];
if (!out) { console.error("usage: node scripts/python-compat-export.mjs OUT"); process.exit(2); }
const modelPath = sharedPath("models", "stories260K", "stories260K.bin");
const tokPath = sharedPath("models", "stories260K", "tok512.bin");
if (!modelPath || !tokPath) { console.error("../shared/models/stories260K is absent"); process.exit(2); }
await initBackend("cpu");
mkdirSync(out, { recursive: true });
const model = loadLlama2c(modelPath);
const tok = await loadTokenizer(tokPath);
await saveHfModel(model, join(out, "hf_stories"), tok);

const texts = ["Once upon a time", "Tom and Lily went to the park. They saw a big dog"];
const cases = [];
for (const text of texts) {
  const ids = tok.encode(text);
  const logits = tf.tidy(() => model.forward(tf.tensor2d([ids], [1, ids.length], "int32")));
  const lastRow = Array.from((await logits.data()).slice((ids.length - 1) * model.config.vocabSize));
  logits.dispose();
  // greedy continuation of 48 tokens through the rollout engine
  const P = ids.length, batch = DataProto.fromDict({
    input_ids: tensor(Int32Array.from(ids), [1, P], "int32"),
    attention_mask: tensor(new Int32Array(P).fill(1), [1, P], "int32"),
    position_ids: tensor(Int32Array.from(ids.map((_, i) => i)), [1, P], "int32"),
  });
  const gen = generate(model, batch, { temperature: 0, topK: -1, topP: 1, doSample: false, responseLength: 48, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true, ignoreEos: true }, new Rng(0));
  cases.push({ text, ids, last_logits: lastRow, greedy: Array.from(gen.batch.responses.data), greedy_logprobs: Array.from(gen.batch.rollout_log_probs?.data ?? []) });
}
const tokCheck = ["Once upon a time, there was a little girl named Lily.", "héllo wörld 123", "  two  spaces", "emoji 🙂 and 中文"].map((s) => ({ text: s, ids: tok.encode(s) }));
writeFileSync(join(out, "reference.json"), JSON.stringify({ cases, tokenizer: tokCheck }));
const gsm = sharedPath("data", "gsm8k");
if (gsm) await getPreprocessor("gsm8k")({ localDatasetPath: gsm, localSaveDir: join(out, "gsm8k") });
console.log(`wrote ${out}`);
