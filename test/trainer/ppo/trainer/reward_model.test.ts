// A reward model with its own tokenizer and chat template (reward_model.model.input_tokenizer, verl's
// default) scores through the trainer: the rows' raw_prompt reaches the reward-model worker thread.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { initBackend } from "../../../../src/engine/backend.js";
import { makeConfig } from "../../../../src/models/config.js";
import { saveHfModel } from "../../../../src/models/hf.js";
import { initModel } from "../../../../src/models/init.js";
import { CharTokenizer } from "../../../../src/models/tokenizers/index.js";
import { Rng } from "../../../../src/utils/rng.js";
import { makeWorkspace, metricsByStep, runTrain, scratchModel } from "./fixtures.js";

const TEMPLATE = "{% for m in messages %}[{{ m.role }}]{{ m.content }}|{% endfor %}";

async function rewardModel(dir: string, template: string): Promise<void> {
  await initBackend("cpu");
  const tok = new CharTokenizer("|][:<> zyxwvutsrqponmlkjihgfedcbaABCDEFGHIJKLMNOPQRSTUVWXYZ,.", template);
  const model = initModel(makeConfig({ vocabSize: tok.vocabSize, dim: 16, hiddenDim: 32, nLayers: 1, nHeads: 2, nKvHeads: 2, maxSeqLen: 256 }), new Rng(3));
  try {
    await saveHfModel(model, dir, tok);
  } finally {
    model.dispose();
  }
}

test("a reward model with its own chat template scores a training step; a template its tokenizer cannot encode fails naming input_tokenizer", async () => {
  const ws = await makeWorkspace();
  try {
    await rewardModel(join(ws.dir, "rm"), TEMPLATE);
    // '#' is outside the reward model's alphabet: only a re-rendered conversation can contain it
    await rewardModel(join(ws.dir, "rm_bad"), `${TEMPLATE}#`);
    const base = [...ws.overrides, ...scratchModel(16, 1), "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
      "reward_model.enable=true", "reward_model.micro_batch_size_per_gpu=4", "reward_model.max_length=96"];
    const jsonl = join(ws.dir, "metrics.jsonl");
    const run = await runTrain([...base, `reward_model.model.path=${join(ws.dir, "rm")}`], { VERL_FILE_LOGGER_PATH: jsonl });
    assert.equal(run.code, 0, run.stderr.slice(-3000));
    const m = metricsByStep(readFileSync(jsonl, "utf8")).get(1)!;
    // the reward model's values, not the custom reward function's share of 'e' (which is >= 0)
    assert.ok(Number.isFinite(m["critic/score/mean"]) && m["critic/score/min"]! < 0, JSON.stringify(m["critic/score/min"]));
    const bad = await runTrain([...base, `reward_model.model.path=${join(ws.dir, "rm_bad")}`], { VERL_FILE_LOGGER_PATH: join(ws.dir, "bad.jsonl") });
    assert.notEqual(bad.code, 0);
    assert.match(bad.stderr + bad.stdout, /reward_model\.model\.input_tokenizer: row \d+: the reward model's tokenizer cannot render or encode the conversation: char tokenizer: character "#"/);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
