// Drives the tool agent's state machine with a scripted server through every
// transition and termination rule, checking ids, masks and tool effects exactly.
import { test, beforeEach } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { AgentState, ToolAgentLoop } from "../../src/agent_loop/tool_agent.js";
import { AgentLoopResources } from "../../src/agent_loop/resources.js";
import { resolveAgentLoopSettings } from "../../src/agent_loop/settings.js";
import type { GenerationParams } from "../../src/agent_loop/server.js";
import type { AgentLoopRow } from "../../src/agent_loop/types.js";
import { EOS, ScriptedServer, testConfig, testTokenizer, text } from "./helpers.js";
import { BarrierTool, toolEvents } from "./fixtures/tools.js";

const tok = testTokenizer();
const toolsModule = fileURLToPath(new URL("./fixtures/tools.js", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "agent-loop-test-"));

function toolConfig(name: string, tools: { cls: string; name: string; config?: Record<string, unknown> }[]): string {
  const path = join(dir, `${name}.yaml`);
  const body = tools.map((t) => [
    `  - class_name: "${toolsModule}#${t.cls}"`,
    `    config: ${JSON.stringify({ type: "native", ...t.config })}`,
    "    tool_schema:",
    "      type: function",
    "      function:",
    `        name: ${t.name}`,
    `        description: the ${t.name} tool`,
    "        parameters: {type: object, properties: {text: {type: string}}, required: []}",
  ].join("\n"));
  writeFileSync(path, `tools:\n${body.join("\n")}\n`);
  return path;
}

const echoConfig = toolConfig("echo", [{ cls: "EchoTool", name: "echo" }, { cls: "FailingTool", name: "fail" }, { cls: "LongTool", name: "long" }]);

const params: GenerationParams = { temperature: 1, topP: 1, topK: -1, logprobs: false };

function makeLoop(server: ScriptedServer, over: Parameters<typeof testConfig>[0] = {}): ToolAgentLoop {
  const config = testConfig({ responseLength: 1024, ...over, multiTurn: { tool_config_path: echoConfig, ...over.multiTurn } });
  return new ToolAgentLoop({ config, settings: resolveAgentLoopSettings(config), server, tokenizer: tok, resources: new AgentLoopResources(), kwargs: {} });
}

function row(fields: Record<string, unknown> = {}): AgentLoopRow {
  return { index: 0, fields: { raw_prompt: [{ role: "user", content: "Q?" }], ...fields } };
}

const call = (name: string, args: Record<string, unknown>) => `<tool_call>${JSON.stringify({ name, arguments: args })}</tool_call>`;
const ids = (s: string) => tok.encode(s, { addSpecialTokens: false });
/** A tool turn as the template renders it alone, default system prompt removed. */
const toolTurn = (...contents: string[]) =>
  contents.map((c) => `<|im_start|>user\n<tool_response>\n${c}\n</tool_response><|im_end|>\n`).join("") + "<|im_start|>assistant\n";

beforeEach(() => {
  toolEvents.length = 0;
});

test("tool call round trip: PENDING -> GENERATING -> PROCESSING_TOOLS -> GENERATING -> TERMINATED, masks exact", async () => {
  const first = `I will call. ${call("echo", { text: "hi" })}`;
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? first : "#### 42"));
  const loop = makeLoop(server);
  const out = await loop.run({ ...params, logprobs: true }, row());
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.PROCESSING_TOOLS, AgentState.GENERATING, AgentState.TERMINATED]);

  const promptText = tok.applyChatTemplate([{ role: "user", content: "Q?" }], { addGenerationPrompt: true, tools: [{ function: { name: "echo", description: "the echo tool" } }, { function: { name: "fail", description: "the fail tool" } }, { function: { name: "long", description: "the long tool" } }] });
  assert.ok(promptText.includes("# Tools\necho: the echo tool\nfail: the fail tool\n"), "tool schemas are rendered into the prompt");
  assert.deepEqual(out.promptIds, ids(promptText));

  const expected = [...ids(first), EOS, ...ids(toolTurn("echo:hi")), ...ids("#### 42"), EOS];
  assert.deepEqual(out.responseIds, expected);
  const m1 = ids(first).length + 1, m0 = ids(toolTurn("echo:hi")).length, m2 = ids("#### 42").length + 1;
  assert.deepEqual(out.responseMask, [...Array(m1).fill(1), ...Array(m0).fill(0), ...Array(m2).fill(1)]);
  // Log-probs: the server's for model tokens, 0 for tool tokens.
  assert.equal(out.responseLogprobs!.length, expected.length);
  assert.deepEqual(out.responseLogprobs!.slice(m1, m1 + m0), Array(m0).fill(0));
  assert.equal(out.responseLogprobs![0], -0.5);
  assert.equal(out.numTurns, 4); // 2 assistant + 1 tool (user) turn + 1
  assert.deepEqual(out.extraFields.tool_rewards, [0.5]);
  assert.deepEqual(out.extraFields.turn_scores, []);
  assert.equal(out.metrics.num_tool_calls, 1);
  // The second request continues the conversation: prompt + turn 1 + tool turn.
  assert.deepEqual(server.calls[1]!.promptIds, [...out.promptIds, ...expected.slice(0, m1 + m0)]);
  // Budget passed to the server shrinks with the conversation.
  assert.equal(server.calls[0]!.params.maxTokens, 1024);
  assert.equal(server.calls[1]!.params.maxTokens, 1024 - m1 - m0);
  assert.deepEqual(toolEvents.map((e) => e.event), ["create", "execute", "release"]);
});

test("no tool call and no interaction terminates after one turn", async () => {
  const loop = makeLoop(new ScriptedServer(tok, () => "plain answer"));
  const out = await loop.run(params, row());
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.TERMINATED]);
  assert.equal(out.numTurns, 2);
  assert.deepEqual(out.responseMask, Array(ids("plain answer").length + 1).fill(1));
});

test("response_length: a turn that fills the budget terminates even with a tool call in it", async () => {
  const first = call("echo", { text: "x" });
  const R = ids(first).length + 1; // exactly the first turn
  const loop = makeLoop(new ScriptedServer(tok, () => first), { responseLength: R });
  const out = await loop.run(params, row());
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.TERMINATED]);
  assert.equal(out.responseIds.length, R);
  assert.equal(toolEvents.length, 0, "no tool ran");
});

test("max_assistant_turns stops after that many model turns", async () => {
  const loop = makeLoop(new ScriptedServer(tok, () => call("echo", { text: "again" })), { multiTurn: { max_assistant_turns: 2 } });
  const out = await loop.run(params, row());
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.PROCESSING_TOOLS, AgentState.GENERATING, AgentState.TERMINATED]);
  assert.equal(out.numTurns, 4);
  assert.equal(toolEvents.filter((e) => e.event === "execute").length, 1);
});

test("max_user_turns stops once that many tool/user turns happened", async () => {
  const loop = makeLoop(new ScriptedServer(tok, () => call("echo", { text: "again" })), { multiTurn: { max_user_turns: 1 } });
  const out = await loop.run(params, row());
  // generate, tools (user turn 1), generate -> user_turns >= 1 -> stop
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.PROCESSING_TOOLS, AgentState.GENERATING, AgentState.TERMINATED]);
  assert.equal(out.numTurns, 4);
});

test("overflow: a tool turn that would exceed response_length ends the trajectory unappended", async () => {
  const first = call("echo", { text: "hi" });
  const m1 = ids(first).length + 1;
  const R = m1 + ids(toolTurn("echo:hi")).length; // the tool turn would reach R exactly (>= R terminates)
  const loop = makeLoop(new ScriptedServer(tok, () => first), { responseLength: R });
  const out = await loop.run(params, row());
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.PROCESSING_TOOLS, AgentState.TERMINATED]);
  assert.equal(out.responseIds.length, m1);
  assert.deepEqual(out.responseMask, Array(m1).fill(1));
  assert.deepEqual(out.extraFields.tool_rewards, [0.5], "the tool still ran and its reward counts");
  assert.equal(out.numTurns, 2);
});

test("a failing tool answers 'Error when executing tool: ...', reward 0, and is still released", async () => {
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? call("fail", {}) : "done"));
  const out = await makeLoop(server).run(params, row());
  const turn = ids(toolTurn("Error when executing tool: boom"));
  const m1 = ids(call("fail", {})).length + 1;
  assert.deepEqual(out.responseIds.slice(m1, m1 + turn.length), turn);
  assert.deepEqual(out.extraFields.tool_rewards, [0]);
  assert.equal(out.metrics.tool_call_errors, 1);
  assert.deepEqual(toolEvents.map((e) => `${e.tool}:${e.event}`), ["fail:create", "fail:execute", "fail:release"]);
});

test("unknown tools, non-object arguments and bad JSON", async () => {
  const bad = `${call("nope", {})}<tool_call>{"name": "echo", "arguments": </tool_call><tool_call>{"name": "echo", "arguments": [1]}</tool_call>`;
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? bad : "done"));
  const out = await makeLoop(server, { multiTurn: { max_parallel_calls: 5 } }).run(params, row());
  assert.equal(out.metrics.tool_parse_errors, 1, "the truncated JSON is skipped and counted");
  assert.equal(out.metrics.num_tool_calls, 2);
  const t = text(tok, out.responseIds);
  assert.ok(t.includes("Error when executing tool: unknown tool 'nope' (available: echo, fail, long)"), t);
  assert.ok(t.includes(`Error when executing tool: arguments of 'echo' must be a JSON object, got [1]`), t);
  assert.equal(toolEvents.length, 0, "nothing was created for calls that failed before create");
});

test("only bad JSON: no calls parsed, so the loop terminates", async () => {
  const loop = makeLoop(new ScriptedServer(tok, () => "<tool_call>{not json}</tool_call>"));
  const out = await loop.run(params, row());
  assert.deepEqual(loop.trace, [AgentState.PENDING, AgentState.GENERATING, AgentState.TERMINATED]);
  assert.equal(out.metrics.tool_parse_errors, 1);
});

test("max_parallel_calls: the first N calls run concurrently, the rest are dropped", async () => {
  const cfg = toolConfig("barrier", [{ cls: "BarrierTool", name: "wait", config: { barrierSize: 2 } }]);
  BarrierTool.maxConcurrent = 0;
  const three = call("wait", {}).repeat(3);
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? three : "done"));
  const out = await makeLoop(server, { multiTurn: { max_parallel_calls: 2, tool_config_path: cfg } }).run(params, row());
  assert.equal(BarrierTool.maxConcurrent, 2, "both calls were executing at the same time");
  assert.equal(out.metrics.num_tool_calls, 2);
  assert.deepEqual(out.extraFields.tool_rewards, [1, 1]);
  const m1 = ids(three).length + 1;
  assert.deepEqual(out.responseIds.slice(m1, m1 + ids(toolTurn("ok", "ok")).length), ids(toolTurn("ok", "ok")));
});

test("tool output truncation: left, right and middle with verl's markers", async () => {
  const digits = Array.from({ length: 25 }, (_, i) => String(i % 10)).join("");
  const expected = {
    left: "0123456789...(truncated)",
    right: "(truncated)...5678901234",
    middle: "01234...(truncated)...01234",
  } as const;
  for (const side of ["left", "right", "middle"] as const) {
    toolEvents.length = 0;
    const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? call("long", { n: 25 }) : "done"));
    const out = await makeLoop(server, { multiTurn: { max_tool_response_length: 10, tool_response_truncate_side: side } }).run(params, row());
    assert.ok(text(tok, out.responseIds).includes(`<tool_response>\n${expected[side]}\n</tool_response>`), `${side}: ${text(tok, out.responseIds)}`);
    assert.ok(!text(tok, out.responseIds).includes(digits));
  }
});

test("tool_selection limits the schemas in the prompt and the callable tools; tools_kwargs reach create", async () => {
  const server = new ScriptedServer(tok, (_c, turn) => (turn === 0 ? call("echo", { text: "a" }) + call("fail", {}) : "done"));
  const r = row({
    extra_info: {
      tool_selection: ["echo"],
      tools_kwargs: { echo: { create_kwargs: { ground_truth: "7" } } },
    },
  });
  const out = await makeLoop(server, { multiTurn: { max_parallel_calls: 2 } }).run(params, r);
  const prompt = text(tok, out.promptIds);
  assert.ok(prompt.includes("echo: the echo tool") && !prompt.includes("fail: the fail tool"), prompt);
  assert.ok(text(tok, out.responseIds).includes("Error when executing tool: unknown tool 'fail' (available: echo)"));
  assert.deepEqual(toolEvents.find((e) => e.event === "create")!.detail, { ground_truth: "7" });
  await assert.rejects(makeLoop(server).run(params, row({ tool_selection: ["missing"] })), /row 0: tool_selection names 'missing'/);
});

test("a prompt longer than rollout.prompt_length is a clear error", async () => {
  const loop = makeLoop(new ScriptedServer(tok, () => "x"), { promptLength: 10 });
  await assert.rejects(loop.run(params, row()), /row 0: the templated prompt has \d+ tokens, more than rollout.prompt_length=10/);
});
