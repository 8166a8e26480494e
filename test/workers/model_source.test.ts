// actor_rollout_ref.model.custom_chat_template (and SFT's data.chat_template): the Jinja string replaces the tokenizer's
// chat template for every prompt rendered (the RL dataset's ids, the agent loop, the workers), and a
// template that does not parse fails when the run starts, naming the key.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { writeParquet } from "../../src/data/parquet.js";
import { RLHFDataset } from "../../src/data/rl_dataset.js";
import { loadSftTokenizer } from "../../src/trainer/sft/sft_model.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { loadModelTokenizer } from "../../src/workers/model_source.js";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz<>|";
const TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}|{% endif %}";
const MESSAGES = [{ role: "user", content: "hi" }];

const ppo = (...overrides: string[]) =>
  loadConfig({ configName: "ppo_trainer", overrides: [`actor_rollout_ref.model.tokenizer_path=char:${ALPHABET}`, ...overrides] });

test("custom_chat_template replaces the tokenizer's template; unset keeps the tokenizer's own", async () => {
  const own = await loadModelTokenizer(new ConfigView(ppo(), "actor_rollout_ref.model"));
  assert.equal(own.applyChatTemplate(MESSAGES, { addGenerationPrompt: true }), "hi");
  const custom = await loadModelTokenizer(new ConfigView(ppo(`actor_rollout_ref.model.custom_chat_template='${TEMPLATE}'`), "actor_rollout_ref.model"));
  assert.equal(custom.applyChatTemplate(MESSAGES, { addGenerationPrompt: true }), "<user>hi|");
  assert.equal(custom.applyChatTemplate(MESSAGES), "<user>hi");
  assert.deepEqual(custom.encode("ab"), own.encode("ab"));
});

test("the RL dataset's prompt ids are rendered with the custom template", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-cct-"));
  try {
    const file = join(dir, "train.parquet");
    await writeParquet(file, [{ data_source: "t", prompt: MESSAGES, reward_model: { ground_truth: "x" }, extra_info: { index: 0 } }]);
    const tok = await loadModelTokenizer(new ConfigView(ppo(`actor_rollout_ref.model.custom_chat_template='${TEMPLATE}'`), "actor_rollout_ref.model"));
    const row = new RLHFDataset(file, tok, { max_prompt_length: 64, filter_overlong_prompts: false, truncation: "error", shuffle: false }).get(0);
    assert.deepEqual(row.input_ids, tok.encode("<user>hi|", { addSpecialTokens: false }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a template that does not parse fails at load, naming the key", async () => {
  await assert.rejects(
    loadModelTokenizer(new ConfigView(ppo("actor_rollout_ref.model.custom_chat_template='{% for m in messages %}'"), "actor_rollout_ref.model")),
    /actor_rollout_ref\.model\.custom_chat_template: chat template does not parse/,
  );
});

test("SFT: data.chat_template replaces the tokenizer's template (verl's legacy SFT trainer refuses the key)", async () => {
  const sft = loadConfig({ configName: "sft_trainer", overrides: ["model.partial_pretrain=scratch", `model.tokenizer_path=char:${ALPHABET}`, `data.chat_template='${TEMPLATE}'`] });
  assert.equal((await loadSftTokenizer(sft)).applyChatTemplate(MESSAGES, { addGenerationPrompt: true }), "<user>hi|");
});
