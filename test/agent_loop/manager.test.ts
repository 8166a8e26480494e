// AgentLoopManager: verl's output layout, per-row loop choice, YAML-registered
// loops, validation sampling and the concurrency bound.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { AgentLoopManager } from "../../src/agent_loop/manager.js";
import { DataProto } from "../../src/protocol/data_proto.js";
import { tensor } from "../../src/protocol/tensor.js";
import { EOS, ScriptedServer, testConfig, testTokenizer } from "./helpers.js";

const tok = testTokenizer();
const dir = mkdtempSync(join(tmpdir(), "agent-manager-test-"));
const toolsModule = fileURLToPath(new URL("./fixtures/tools.js", import.meta.url));
const loopsModule = fileURLToPath(new URL("./fixtures/loops.js", import.meta.url));
const toolYaml = join(dir, "tools.yaml");
writeFileSync(toolYaml, `tools:
  - class_name: "${toolsModule}#EchoTool"
    config: {type: native, reward: 0.25}
    tool_schema: {type: function, function: {name: echo, description: echoes, parameters: {type: object, properties: {text: {type: string}}, required: [text]}}}
`);
const enc = (s: string) => tok.encode(s, { addSpecialTokens: false });
const msgs = (q: string) => [{ role: "user", content: q }];

function batch(rows: Record<string, unknown>[]): DataProto {
  const keys = new Set(rows.flatMap((r) => Object.keys(r)));
  const nt: Record<string, unknown[]> = {};
  for (const k of keys) nt[k] = rows.map((r) => r[k]);
  return DataProto.fromDict({}, nt);
}

test("mixed single-turn and tool rows: verl's padded layout, masks, positions, extra fields, timing", async () => {
  const P = 128, R = 200;
  const config = testConfig({ promptLength: P, responseLength: R, rollout: { calculate_log_probs: true }, multiTurn: { tool_config_path: toolYaml } });
  const server = new ScriptedServer(tok, (c, turn) => {
    const prompt = tok.decode(c.promptIds);
    if (prompt.includes("use echo") && turn === 0) return `<tool_call>{"name": "echo", "arguments": {"text": "yo"}}</tool_call>`;
    return prompt.includes("Q1") ? "A1" : "fin";
  });
  const manager = new AgentLoopManager({ config, tokenizer: tok, server });
  const input = batch([
    { raw_prompt: msgs("Q1"), uid: "a" },
    { raw_prompt: msgs("use echo"), agent_name: "tool_agent", uid: "b" },
  ]);
  const out = await manager.generateSequences(input);
  assert.equal(out.length, 2);
  assert.deepEqual(out.batch.prompts!.shape, [2, P]);
  assert.deepEqual(out.batch.responses!.shape, [2, R]);
  assert.deepEqual(out.batch.input_ids!.shape, [2, P + R]);
  assert.deepEqual(out.batch.rollout_log_probs!.shape, [2, R]);

  // Row 0: single turn. Prompt left-padded, response right-padded with the pad id (0).
  const p0 = enc(tok.applyChatTemplate(msgs("Q1"), { addGenerationPrompt: true }));
  const r0 = [...enc("A1"), EOS];
  const row = (key: string, b: number) => Array.from(out.batch[key]!.data.subarray(b * out.batch[key]!.shape[1]!, (b + 1) * out.batch[key]!.shape[1]!));
  assert.deepEqual(row("prompts", 0), [...Array(P - p0.length).fill(tok.padTokenId), ...p0]);
  assert.deepEqual(row("responses", 0), [...r0, ...Array(R - r0.length).fill(tok.padTokenId)]);
  assert.deepEqual(row("response_mask", 0), [...Array(r0.length).fill(1), ...Array(R - r0.length).fill(0)]);
  assert.deepEqual(row("attention_mask", 0), [...Array(P - p0.length).fill(0), ...Array(p0.length + r0.length).fill(1), ...Array(R - r0.length).fill(0)]);
  const pos0 = row("position_ids", 0);
  assert.deepEqual(pos0.slice(0, P - p0.length), Array(P - p0.length).fill(0));
  assert.deepEqual(pos0.slice(P - p0.length, P + r0.length), Array.from({ length: p0.length + r0.length }, (_, i) => i));
  assert.deepEqual(pos0.slice(P + r0.length), Array(R - r0.length).fill(p0.length + r0.length - 1));
  assert.deepEqual(row("input_ids", 0), [...row("prompts", 0), ...row("responses", 0)]);
  assert.deepEqual(row("rollout_log_probs", 0).slice(0, 3).map((x) => Math.fround(x)), [-0.5, -0.51, -0.52].map(Math.fround));

  // Row 1: tool agent; the tool turn is masked 0 inside the response.
  const mask1 = row("response_mask", 1);
  const call = enc(`<tool_call>{"name": "echo", "arguments": {"text": "yo"}}</tool_call>`).length + 1;
  const toolTurn = enc("<|im_start|>user\n<tool_response>\necho:yo\n</tool_response><|im_end|>\n<|im_start|>assistant\n").length;
  const fin = enc("fin").length + 1;
  assert.deepEqual(mask1, [...Array(call).fill(1), ...Array(toolTurn).fill(0), ...Array(fin).fill(1), ...Array(R - call - toolTurn - fin).fill(0)]);
  assert.deepEqual(row("rollout_log_probs", 1).slice(call, call + toolTurn), Array(toolTurn).fill(0));

  assert.deepEqual(out.nonTensorBatch.__num_turns__, [2, 4]);
  assert.deepEqual(out.nonTensorBatch.tool_rewards, [[], [0.25]]);
  assert.deepEqual(out.nonTensorBatch.turn_scores, [[], []]);
  assert.equal(out.nonTensorBatch.raw_prompt![1], input.nonTensorBatch.raw_prompt![1]);
  const timing = out.metaInfo.timing as Record<string, number>;
  for (const k of ["generate_sequences", "tool_calls", "num_preempted"]) for (const s of ["min", "max", "mean"]) assert.equal(typeof timing[`agent_loop/${k}/${s}`], "number", k);
  assert.equal(timing["agent_loop/slowest/prompt_length"]! > 0, true);
  const metrics = out.metaInfo.metrics as Record<string, number>;
  assert.equal(metrics["agent_loop/num_tool_calls"], 1);
  assert.equal(metrics["agent_loop/tool_parse_errors"], 0);
  // The batch unions back onto the input, as the trainer does.
  input.union(out);
});

test("validation uses val_kwargs; training uses rollout sampling", async () => {
  const config = testConfig({ rollout: { temperature: 0.7, top_p: 0.9, top_k: 5 } });
  const server = new ScriptedServer(tok, () => "x");
  const manager = new AgentLoopManager({ config, tokenizer: tok, server });
  await manager.generateSequences(batch([{ raw_prompt: msgs("q") }]));
  assert.deepEqual(server.calls[0]!.params, { temperature: 0.7, topP: 0.9, topK: 5, doSample: true, logprobs: false, maxTokens: 256 });
  const v = batch([{ raw_prompt: msgs("q") }]);
  v.metaInfo.validate = true;
  await manager.generateSequences(v);
  assert.deepEqual(server.calls[1]!.params, { temperature: 0, topP: 1, topK: -1, doSample: false, logprobs: false, maxTokens: 256 });
});

test("rollout.agent.max_concurrent_loops bounds the loops in flight", async () => {
  const rows = Array.from({ length: 6 }, (_, i) => ({ raw_prompt: msgs(`q${i}`) }));
  for (const [limit, expected] of [[2, 2], [64, 6]] as const) {
    const server = new ScriptedServer(tok, () => "x", 20);
    const manager = new AgentLoopManager({ config: testConfig({ agent: { max_concurrent_loops: limit } }), tokenizer: tok, server });
    await manager.generateSequences(batch(rows));
    assert.equal(server.maxInFlight, expected);
    assert.equal(server.calls.length, 6);
  }
});

test("agent_loop_config_path registers user loops from 'path.js#Export' with kwargs; rm_scores from loop rewards", async () => {
  const yaml = join(dir, "loops.yaml");
  writeFileSync(yaml, `- name: repeat_agent\n  _target_: "${loopsModule}#RepeatLoop"\n  turns: 2\n  score: 0.75\n`);
  const server = new ScriptedServer(tok, () => "ab");
  const R = 32;
  const manager = new AgentLoopManager({ config: testConfig({ responseLength: R, agent: { agent_loop_config_path: yaml } }), tokenizer: tok, server });
  const out = await manager.generateSequences(batch([{ raw_prompt: msgs("q"), agent_name: "repeat_agent" }]));
  assert.equal(server.calls.length, 2);
  assert.deepEqual(out.nonTensorBatch.__num_turns__, [3]);
  assert.deepEqual(out.nonTensorBatch.repeat_turns, [2]);
  const scores = Array.from(out.batch.rm_scores!.data);
  assert.equal(scores[5], 0.75, "score on the last response token (2 x 'ab'+EOS = 6 tokens)");
  assert.equal(scores.reduce((a, b) => a + b, 0), 0.75);

  const bad = join(dir, "bad.yaml");
  writeFileSync(bad, `- name: tool_agent\n  _target_: "${loopsModule}#RepeatLoop"\n`);
  const m2 = new AgentLoopManager({ config: testConfig({ agent: { agent_loop_config_path: bad } }), tokenizer: tok, server });
  await assert.rejects(m2.generateSequences(batch([{ raw_prompt: msgs("q") }])), /agent loop 'tool_agent' is already registered with a different class/);
  const missing = join(dir, "missing.yaml");
  writeFileSync(missing, `- name: x\n  _target_: "${loopsModule}#Nope"\n`);
  const m3 = new AgentLoopManager({ config: testConfig({ agent: { agent_loop_config_path: missing } }), tokenizer: tok, server });
  await assert.rejects(m3.generateSequences(batch([{ raw_prompt: msgs("q") }])), /has no export 'Nope' \(exports: RepeatLoop\)/);
});

test("unknown agent_name lists the known loops; a failing loop names its row", async () => {
  const server = new ScriptedServer(tok, () => "x");
  const manager = new AgentLoopManager({ config: testConfig(), tokenizer: tok, server });
  await assert.rejects(manager.generateSequences(batch([{ raw_prompt: msgs("q"), agent_name: "nope" }])), /row 0: agent_name 'nope': unknown agent loop 'nope' \(known: single_turn_agent, tool_agent/);
  await assert.rejects(manager.generateSequences(batch([{ raw_prompt: msgs("q") }, { raw_prompt: "not a list" }])), /agent loop for row 1 failed: row 1: raw_prompt must be a list/);
});

test("without raw_prompt the single-turn loop uses the batch's own prompt ids", async () => {
  const server = new ScriptedServer(tok, () => "x");
  const manager = new AgentLoopManager({ config: testConfig({ promptLength: 8, responseLength: 4 }), tokenizer: tok, server });
  const ids = tensor(new Int32Array([0, 0, 40, 41, 0, 50, 51, 52]), [2, 4]);
  const attn = tensor(new Int32Array([0, 0, 1, 1, 0, 1, 1, 1]), [2, 4]);
  const out = await manager.generateSequences(DataProto.fromDict({ input_ids: ids, attention_mask: attn }, { uid: ["a", "b"] }));
  assert.deepEqual(server.calls.map((c) => c.promptIds), [[40, 41], [50, 51, 52]]);
  assert.deepEqual(Array.from(out.batch.prompts!.data.subarray(0, 8)), [0, 0, 0, 0, 0, 0, 40, 41]);
});

test("needsAgentLoop: multi_turn.enable or an agent_name column", async () => {
  const { needsAgentLoop } = await import("../../src/agent_loop/manager.js");
  const off = testConfig({ multiTurn: { enable: false } });
  assert.equal(needsAgentLoop(off, batch([{ raw_prompt: msgs("q") }])), false);
  assert.equal(needsAgentLoop(off, batch([{ raw_prompt: msgs("q"), agent_name: "tool_agent" }])), true);
  assert.equal(needsAgentLoop(testConfig({ multiTurn: { enable: true } }), batch([{ raw_prompt: msgs("q") }])), true);
});

test("over_sample_rate: once int(n * (1 - rate)) rows finished the rest are aborted and padded; validation waits for all", async () => {
  const config = testConfig({ promptLength: 128, responseLength: 16, rollout: { over_sample_rate: 0.25, calculate_log_probs: true } });
  const scripted = new ScriptedServer(tok, () => "ok");
  let aborts = 0;
  const pending: (() => void)[] = [];
  // the row asking "slow" answers only when aborted (it would hold the step forever otherwise)
  const server = {
    generate: (id: string, prompt: readonly number[], p: Parameters<ScriptedServer["generate"]>[2]) =>
      tok.decode([...prompt]).includes("slow")
        ? new Promise<never>((_, reject) => pending.push(() => reject(new Error("aborted by the test server"))))
        : scripted.generate(id, prompt, p),
    abort: () => { aborts++; pending.splice(0).forEach((f) => f()); },
  };
  const manager = new AgentLoopManager({ config, tokenizer: tok, server });
  const rows = ["Q1", "Q2", "slow", "Q3"].map((q) => ({ raw_prompt: msgs(q) }));
  const out = await manager.generateSequences(batch(rows));
  assert.equal(aborts, 1);
  const R = 16, mask = out.batch.response_mask!.data, att = out.batch.attention_mask!.data;
  const sum = (a: ArrayLike<number>, b: number, w: number, from = 0) => Array.from(a).slice(b * w + from, (b + 1) * w).reduce((x, y) => x + y, 0);
  assert.deepEqual([0, 1, 2, 3].map((b) => sum(mask, b, R) > 0), [true, true, false, true], "the slow row is the aborted one");
  assert.equal(sum(att, 2, 128 + R, 128), 0, "the aborted row has an empty response");
  assert.ok(out.batch.rollout_log_probs, "log-probs kept for the batch");
  assert.deepEqual(out.nonTensorBatch.__num_turns__, [2, 2, 1, 2]);
  // validation: every row runs to the end (here the slow one answers after a moment)
  const slowLater = { ...server, generate: (id: string, prompt: readonly number[], p: Parameters<ScriptedServer["generate"]>[2]) => scripted.generate(id, prompt, p) };
  const val = await new AgentLoopManager({ config, tokenizer: tok, server: slowLater }).generateSequences(batch(rows), { validate: true });
  assert.ok(sum(val.batch.response_mask!.data, 2, R) > 0);
  assert.throws(() => new AgentLoopManager({ config: testConfig({ rollout: { over_sample_rate: 1 } }), tokenizer: tok, server }), /over_sample_rate must be in \[0, 1\), got 1/);
});
