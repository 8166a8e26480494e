// What verl's multi-turn SFT examples read, made small: a tiny Qwen2-shaped Hugging Face folder
// (random weights, attention biases, a character tokenizer with a ChatML template and a default
// system prompt, so every message renders on its own exactly as within the conversation) and
// parquet files with a `messages` column of two-turn arithmetic conversations.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { writeParquet } from "../../src/data/parquet.js";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { saveHfModel } from "../../src/models/hf.js";
import { initModel } from "../../src/models/init.js";
import { CharTokenizer } from "../../src/models/tokenizers/index.js";
import { Rng } from "../../src/utils/rng.js";

const CHATML =
  "{% for message in messages %}{% if loop.first and message.role != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}" +
  "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const ASCII = Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)).join("") + "\n";

/** `dir`/qwen2_tiny (the model folder) and `dir`/multiturn/{train,test}.parquet. */
export async function makeMultiTurnSftData(dir: string): Promise<{ model: string; train: string; test: string }> {
  await initBackend("cpu");
  const tok = new CharTokenizer(ASCII, CHATML);
  const config = makeConfig({ vocabSize: tok.vocabSize, dim: 32, hiddenDim: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 512, attentionBias: true });
  const model = join(dir, "qwen2_tiny");
  const m = initModel(config, new Rng(24));
  await saveHfModel(m, model, tok);
  m.dispose();
  const rows = Array.from({ length: 12 }, (_, i) => ({
    messages: [
      { role: "user", content: `What is ${i} + ${i + 3}?` }, { role: "assistant", content: `${2 * i + 3}` },
      { role: "user", content: "And twice that?" }, { role: "assistant", content: `${4 * i + 6}` },
    ],
  }));
  mkdirSync(join(dir, "multiturn"), { recursive: true });
  const train = join(dir, "multiturn", "train.parquet"), test = join(dir, "multiturn", "test.parquet");
  await writeParquet(train, rows);
  await writeParquet(test, rows.slice(0, 4));
  return { model, train, test };
}
