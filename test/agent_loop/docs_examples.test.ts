// The tool, interaction and loop written in docs/agent-loop.md work as the docs say, loaded from YAML.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { AgentLoopManager } from "../../src/agent_loop/index.js";
import { DataProto } from "../../src/protocol/data_proto.js";
import { EOS, ScriptedServer, testConfig, testTokenizer, text } from "./helpers.js";

const tok = testTokenizer();
const mod = fileURLToPath(new URL("./fixtures/docs_examples.js", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "agent-docs-"));
const write = (name: string, body: string) => { const p = join(dir, name); writeFileSync(p, body); return p; };
const msgs = (q: string) => [[{ role: "user", content: q }]];

test("docs: LookupTool from tools.yaml answers lookups and turns a bad word into an error message", async () => {
  const tools = write("tools.yaml", `tools:
  - class_name: "${mod}#LookupTool"
    config: {type: native, entries: {dozen: "12", score: "20"}}
    tool_schema:
      type: function
      function:
        name: lookup
        description: Look up how many items a counting word means.
        parameters:
          type: object
          properties: {word: {type: string, description: "e.g. dozen"}}
          required: [word]
`);
  const server = new ScriptedServer(tok, (_c, turn) =>
    turn === 0 ? `<tool_call>{"name": "lookup", "arguments": {"word": "dozen"}}</tool_call><tool_call>{"name": "lookup", "arguments": {"word": "gross"}}</tool_call>` : "#### 12");
  const manager = new AgentLoopManager({ config: testConfig({ promptLength: 512, responseLength: 512, multiTurn: { tool_config_path: tools, max_parallel_calls: 2 } }), tokenizer: tok, server });
  const out = await manager.generateSequences(DataProto.fromDict({}, { raw_prompt: msgs("How many eggs in a dozen?"), agent_name: ["tool_agent"] }));
  const t = text(tok, Array.from(out.batch.responses!.data));
  assert.ok(t.includes("<tool_response>\n12\n</tool_response>"), t);
  assert.ok(t.includes("<tool_response>\nError when executing tool: no entry for 'gross'\n</tool_response>"), t);
  assert.ok(text(tok, Array.from(out.batch.prompts!.data)).includes("lookup: Look up how many items a counting word means."));
});

test("docs: PoliteCritic from interactions.yaml and SecondThoughtLoop from loops.yaml", async () => {
  const interactions = write("interactions.yaml", `interaction:\n  - name: critic\n    class_name: "${mod}#PoliteCritic"\n    config: {}\n`);
  const loops = write("loops.yaml", `- name: second_thought\n  _target_: "${mod}#SecondThoughtLoop"\n  question: "Are you sure? Show the check."\n`);
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? "11" : "12"));
  const config = testConfig({ responseLength: 200, agent: { agent_loop_config_path: loops }, multiTurn: { interaction_config_path: interactions } });
  const manager = new AgentLoopManager({ config, tokenizer: tok, server });
  const batch = DataProto.fromDict({}, {
    raw_prompt: [...msgs("eggs in a dozen?"), ...msgs("eggs in a dozen?")],
    agent_name: ["second_thought", "tool_agent"],
    extra_info: [{}, { interaction_kwargs: { name: "critic", ground_truth: "12" } }],
  });
  const out = await manager.generateSequences(batch);
  const row = (b: number) => Array.from(out.batch.responses!.data.subarray(b * 200, (b + 1) * 200));
  const mask = (b: number) => Array.from(out.batch.response_mask!.data.subarray(b * 200, (b + 1) * 200));
  const ask = tok.encode("<|im_start|>user\nAre you sure? Show the check.<|im_end|>\n<|im_start|>assistant\n", { addSpecialTokens: false });
  const enc = (s: string) => tok.encode(s, { addSpecialTokens: false });
  assert.deepEqual(row(0).slice(0, 3 + ask.length + 3), [...enc("11"), EOS, ...ask, ...enc("12"), EOS]);
  assert.deepEqual(mask(0).slice(0, 3 + ask.length + 3), [1, 1, 1, ...ask.map(() => 0), 1, 1, 1]);
  // the critic: "11" is wrong -> asks again; "12" is right -> ends
  assert.deepEqual(out.nonTensorBatch.turn_scores![1], [0, 1]);
  assert.ok(text(tok, row(1)).includes("Are you sure? Check again.") && text(tok, row(1)).includes("Thanks!"));
  assert.deepEqual(out.nonTensorBatch.__num_turns__, [4, 5]);
});
