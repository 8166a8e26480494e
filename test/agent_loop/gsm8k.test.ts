// The GSM8K tool and simulated user behave as verl's, alone and inside the tool agent loop.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Gsm8kTool, GSM8K_TOOL_SCHEMA, loadToolsFromConfig } from "../../src/tools/index.js";
import { Gsm8kInteraction, GSM8K_CORRECT, GSM8K_INCORRECT, loadInteractionsFromConfig } from "../../src/interactions/index.js";
import { AgentState, ToolAgentLoop } from "../../src/agent_loop/tool_agent.js";
import { AgentLoopResources } from "../../src/agent_loop/resources.js";
import { resolveAgentLoopSettings } from "../../src/agent_loop/settings.js";
import { ScriptedServer, testConfig, testTokenizer, text } from "./helpers.js";

const tok = testTokenizer();
const dir = mkdtempSync(join(tmpdir(), "gsm8k-agent-test-"));
const params = { temperature: 1, topP: 1, topK: -1 };

// verl's own example file, unchanged.
const verlToolYaml = join(dir, "gsm8k_tool_config.yaml");
writeFileSync(verlToolYaml, `tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
`);
const verlInteractionYaml = join(dir, "gsm8k_interaction_config.yaml");
writeFileSync(verlInteractionYaml, `interaction:
  - name: "gsm8k"
    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
    config: {}
`);

test("calc_gsm8k_reward: flexible scoring, verl's response text and step rewards", async () => {
  const tool = new Gsm8kTool({ type: "native" }, null);
  assert.equal(tool.name, "calc_gsm8k_reward");
  assert.deepEqual(tool.toolSchema, GSM8K_TOOL_SCHEMA);
  const { instanceId } = await tool.create({ createKwargs: { ground_truth: "72" } });
  let r = await tool.execute(instanceId, { answer: "70" });
  assert.equal(r.response.text, "Current parsed answer='70' reward=0.0");
  assert.equal(r.reward, -0.05, "no improvement over the initial 0");
  r = await tool.execute(instanceId, { answer: "The total is 72" });
  assert.equal(r.response.text, "Current parsed answer='The total is 72' reward=1.0");
  assert.equal(r.reward, 0.0, "improved");
  r = await tool.execute(instanceId, { answer: "#### 72" });
  assert.equal(r.response.text, "Current parsed answer='#### 72' reward=1.0");
  assert.equal(r.reward, -0.05, "same score again is penalised");
  r = await tool.execute(instanceId, { answer: 72 });
  assert.equal(r.response.text, "Current parsed answer='72' reward=1.0");
  r = await tool.execute(instanceId, { answer: "it's 1,000" });
  assert.equal(r.response.text, `Current parsed answer="it's 1,000" reward=0.0`);
  assert.equal(await tool.calcReward(instanceId), 0);
  await tool.release(instanceId);
  assert.equal(tool.liveInstances, 0);
  await assert.rejects(tool.execute(instanceId, { answer: "1" }), /no instance/);
});

test("verl's tool and interaction YAML files load unchanged", async () => {
  const [tool] = await loadToolsFromConfig(verlToolYaml);
  assert.ok(tool instanceof Gsm8kTool);
  assert.equal(tool.name, "calc_gsm8k_reward");
  const map = await loadInteractionsFromConfig(verlInteractionYaml);
  assert.deepEqual([...map.keys()], ["gsm8k"]);
  assert.ok(map.get("gsm8k") instanceof Gsm8kInteraction);
  assert.equal(map.get("gsm8k")!.name, "gsm8k");
});

test("gsm8k interaction: strict scoring of the last assistant message", async () => {
  const it = new Gsm8kInteraction({ name: "gsm8k" });
  const id = await it.startInteraction("conv", { ground_truth: "42" });
  assert.equal(id, "conv");
  let turn = await it.generateResponse(id, [{ role: "user", content: "What is 40+2?" }, { role: "assistant", content: "### 4" }, { role: "assistant", content: "#### 42" }]);
  assert.deepEqual(turn, { shouldTerminate: true, response: GSM8K_CORRECT, reward: 1.0, metrics: {} });
  turn = await it.generateResponse(id, [{ role: "assistant", content: "42" }]);
  assert.deepEqual(turn, { shouldTerminate: false, response: GSM8K_INCORRECT, reward: 0.0, metrics: {} }, "strict needs '#### '");
  turn = await it.generateResponse(id, [{ role: "user", content: "Hello!" }]);
  assert.equal(turn.shouldTerminate, false);
  const auto = await it.startInteraction(undefined, { ground_truth: "1" });
  assert.equal(auto.length, 36);
  await it.finalizeInteraction(id);
  await it.finalizeInteraction(auto);
  assert.equal(it.openConversations, 0);
});

function loop(server: ScriptedServer, multiTurn: Record<string, unknown>, resources = new AgentLoopResources()): ToolAgentLoop {
  const config = testConfig({ promptLength: 512, responseLength: 1024, multiTurn });
  return new ToolAgentLoop({ config, settings: resolveAgentLoopSettings(config), server, tokenizer: tok, resources, kwargs: {} });
}

test("INTERACTING: wrong answer -> user asks again -> right answer -> terminate; user tokens masked", async () => {
  const resources = new AgentLoopResources();
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? "#### 41" : "#### 42"));
  const l = loop(server, { interaction_config_path: verlInteractionYaml }, resources);
  const row = { index: 0, fields: { raw_prompt: [{ role: "user", content: "40+2?" }], extra_info: { interaction_kwargs: { name: "gsm8k", query: "40+2?", ground_truth: "42" } } } };
  const out = await l.run(params, row);
  assert.deepEqual(l.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.INTERACTING, AgentState.GENERATING, AgentState.INTERACTING, AgentState.TERMINATED]);
  assert.deepEqual(out.extraFields.turn_scores, [0, 1]);
  assert.equal(out.numTurns, 5);
  const enc = (s: string) => tok.encode(s, { addSpecialTokens: false });
  const user = (s: string) => enc(`<|im_start|>user\n${s}<|im_end|>\n<|im_start|>assistant\n`);
  const expected = [...enc("#### 41"), 2, ...user(GSM8K_INCORRECT), ...enc("#### 42"), 2, ...user(GSM8K_CORRECT)];
  assert.deepEqual(out.responseIds, expected);
  const mask = [...Array(8).fill(1), ...Array(user(GSM8K_INCORRECT).length).fill(0), ...Array(8).fill(1), ...Array(user(GSM8K_CORRECT).length).fill(0)];
  assert.deepEqual(out.responseMask, mask);
  const interaction = (await resources.interactions(verlInteractionYaml)).get("gsm8k") as Gsm8kInteraction;
  assert.equal(interaction.openConversations, 0, "finalized after the loop");
  // An unnamed interaction_kwargs picks the only configured interaction; a wrong name is an error.
  const unnamed = { index: 3, fields: { ...row.fields, extra_info: { interaction_kwargs: { ground_truth: "42" } } } };
  assert.equal((await loop(new ScriptedServer(tok, () => "#### 42"), { interaction_config_path: verlInteractionYaml }).run(params, unnamed)).numTurns, 3);
  const wrong = { index: 4, fields: { ...row.fields, extra_info: { interaction_kwargs: { name: "nope" } } } };
  await assert.rejects(loop(server, { interaction_config_path: verlInteractionYaml }).run(params, wrong), /row 4: interaction 'nope' is not configured \(configured: gsm8k\)/);
});

test("the GSM8K tool inside the tool agent loop, with verl's tool-agent row layout", async () => {
  const resources = new AgentLoopResources();
  const callText = `Let me check. <tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n</tool_call>`;
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? callText : "#### 72"));
  const row = {
    index: 0,
    fields: {
      agent_name: "tool_agent",
      raw_prompt: [{ role: "system", content: "Use `calc_gsm8k_reward`." }, { role: "user", content: "Natalia sold 48 clips..." }],
      extra_info: { need_tools_kwargs: true, tools_kwargs: { calc_gsm8k_reward: { create_kwargs: { ground_truth: "72" } } } },
    },
  };
  const out = await loop(server, { tool_config_path: verlToolYaml }, resources).run(params, row);
  const t = text(tok, out.responseIds);
  assert.ok(t.includes("<tool_response>\nCurrent parsed answer='72' reward=1.0\n</tool_response>"), t);
  assert.deepEqual(out.extraFields.tool_rewards, [0.0]);
  const [tool] = await resources.tools(verlToolYaml);
  assert.equal((tool as Gsm8kTool).liveInstances, 0, "released");
  assert.ok(text(tok, out.promptIds).includes("calc_gsm8k_reward: A tool for calculating the reward of gsm8k."));
});
