// actor_rollout_ref.model.custom_chat_template (and SFT's data.chat_template): the Jinja string replaces the tokenizer's
// chat template for every prompt rendered (the RL dataset's ids, the agent loop, the workers), and a
// template that does not parse fails when the run starts, naming the key. override_config: both of
// verl's layouts shape a scratch model, and a loaded checkpoint refuses overrides instead of dropping them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { writeParquet } from "../../src/data/parquet.js";
import { RLHFDataset } from "../../src/data/rl_dataset.js";
import { loadSftTokenizer } from "../../src/trainer/sft/sft_model.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { hfOverrides, loadModelTokenizer, loadPolicy } from "../../src/workers/model_source.js";

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

test("override_config: verl's Megatron layout (model_config, moe_config) reads like the flat one", () => {
  const megatron = loadConfig({
    configName: "ppo_megatron_trainer",
    overrides: ["+actor_rollout_ref.model.override_config.model_config.max_position_embeddings=64", "+actor_rollout_ref.model.override_config.hidden_size=16"],
  });
  assert.deepEqual(hfOverrides(new ConfigView(megatron, "actor_rollout_ref.model")), { hidden_size: 16, max_position_embeddings: 64 });
  assert.deepEqual(hfOverrides(new ConfigView(ppo(), "actor_rollout_ref.model")), {});
});

test("override_config on a loaded checkpoint is refused, naming the keys; verl's empty defaults pass", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-ovr-"));
  try {
    const bin = join(dir, "empty.bin");
    writeFileSync(bin, "");
    const cfg = ppo(`actor_rollout_ref.model.path=${bin}`, "+actor_rollout_ref.model.override_config.hidden_size=16");
    await assert.rejects(loadPolicy(new ConfigView(cfg, "actor_rollout_ref.model"), null!, 1), /actor_rollout_ref\.model\.override_config sets hidden_size: .*not built/);
    const megatron = loadConfig({ configName: "ppo_megatron_trainer", overrides: [`actor_rollout_ref.model.path=${bin}`] });
    // past the override check, the empty file fails to load
    await assert.rejects(loadPolicy(new ConfigView(megatron, "actor_rollout_ref.model"), null!, 1), (e: Error) => !/override_config/.test(e.message));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
