// The agent loops with the real neighbours: GSM8K tool-agent rows from the
// preprocessor, RLHFDataset + collate, the tok512 tokenizer with the recipe's
// ChatML-with-tools template, the recipe's tool config, a real model on the
// batching server; the output unions back onto the batch as the trainer does.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initBackend } from "../../src/engine/backend.js";
import { gsm8kRow, RLHFDataset } from "../../src/data/index.js";
import { initModel, makeConfig } from "../../src/models/index.js";
import { Llama2cTokenizer } from "../../src/models/tokenizers/index.js";
import { AgentLoopManager } from "../../src/agent_loop/index.js";
import { loadToolsFromConfig } from "../../src/tools/index.js";
import { packageRoot, sharedPath } from "../../src/utils/paths.js";
import { Rng } from "../../src/utils/rng.js";
import { testConfig } from "./helpers.js";

const recipe = join(packageRoot, "recipes", "gsm8k_multiturn", "config");

test("GSM8K tool-agent rows through RLHFDataset, the recipe's template and tools, and the batching server", async (t) => {
  const tokPath = sharedPath("models", "stories260K", "tok512.bin");
  const gsm = sharedPath("data", "gsm8k", "train.jsonl");
  if (!tokPath || !gsm) return t.skip("../shared/models/stories260K or ../shared/data/gsm8k absent");
  await initBackend("wasm");
  const tok = Llama2cTokenizer.fromFile(tokPath, readFileSync(join(recipe, "chatml_tools.jinja"), "utf8"));
  const toolYaml = join(recipe, "gsm8k_tool_config.yaml");
  const schemas = (await loadToolsFromConfig(toolYaml)).map((x) => x.toolSchema);
  const raw = readFileSync(gsm, "utf8").split("\n").filter(Boolean).slice(0, 3).map((l) => JSON.parse(l) as { question: string; answer: string });
  const file = join(mkdtempSync(join(tmpdir(), "agent-int-")), "train.jsonl");
  writeFileSync(file, raw.map((r, i) => JSON.stringify(gsm8kRow(r.question, r.answer, "train", i, true))).join("\n"));
  const P = 1280, R = 24;
  const ds = new RLHFDataset(file, tok, { max_prompt_length: P, shuffle: false }, { tools: schemas });
  const prompts = ds.collate([0, 1, 2].map((i) => ds.get(i)));
  const n = 2;
  // As the trainer does: the prompt tensors go to the rollout, the other columns stay.
  const gen = prompts.repeat(n, true);
  prompts.pop(["input_ids", "attention_mask", "position_ids"]);

  const model = initModel(makeConfig({ vocabSize: tok.vocabSize, dim: 32, hiddenDim: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: P + R }), new Rng(0));
  try {
    const config = testConfig({ promptLength: P, responseLength: R, multiTurn: { tool_config_path: toolYaml }, rollout: { calculate_log_probs: true } });
    const manager = AgentLoopManager.fromModel({ config, model, tokenizer: tok, rng: new Rng(1) });
    const out = await manager.generateSequences(gen);
    assert.equal(out.length, 6);
    // The loop's templated prompt (tools included) is the dataset's prompt, id for id.
    assert.deepEqual(gen.batch.input_ids!.shape, [6, P]);
    assert.deepEqual(Array.from(out.batch.prompts!.data), Array.from(gen.batch.input_ids!.data));
    assert.ok(tok.decode(Array.from(out.batch.prompts!.data.subarray(0, P))).includes('"name": "calc_gsm8k_reward"'));
    assert.deepEqual(out.batch.rollout_log_probs!.shape, [6, R]);
    assert.deepEqual(out.nonTensorBatch.__num_turns__!.length, 6);
    // The trainer's union: repeated prompts batch + rollout output.
    const merged = prompts.repeat(n, true).union(out);
    assert.ok(merged.batch.responses && merged.nonTensorBatch.tools_kwargs);
  } finally {
    model.dispose();
  }
});
