// Tool-call parsers, the parser registry, truncation, module specs and Python reprs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { getToolParser, registerToolParser, toolParserNames, ToolParser, HermesToolParser, type ToolParseResult } from "../../src/agent_loop/tool_parser.js";
import { truncateToolResponse } from "../../src/agent_loop/truncate.js";
import { loadExport } from "../../src/agent_loop/module_spec.js";
import { pyFloatRepr, pyStrRepr } from "../../src/tools/py_repr.js";
import { testTokenizer } from "./helpers.js";

const tok = testTokenizer();
const enc = (s: string) => tok.encode(s, { addSpecialTokens: false });

test("hermes: calls across lines, content without them, bad JSON skipped and counted", async () => {
  const parser = getToolParser("hermes", tok);
  const text = `think\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call> mid <tool_call>{"name": "b", "arguments": {}}</tool_call><tool_call>{"name": "c"}</tool_call><tool_call>{oops}</tool_call>`;
  const res = await parser.extractToolCalls(enc(text));
  assert.deepEqual(res.toolCalls, [{ name: "a", arguments: '{"x":1}' }, { name: "b", arguments: "{}" }]);
  assert.equal(res.errors, 2, "missing arguments and broken JSON");
  assert.equal(res.content, "think\n mid ");
  const none = await parser.extractToolCalls(enc(`<tool_call>{"name": "a", "arguments": {}}`));
  assert.deepEqual(none, { content: `<tool_call>{"name": "a", "arguments": {}}`, toolCalls: [], errors: 0 }, "no end tag, no call");
});

/** A made-up format: CALL name(json-args) on its own line. */
class LineParser extends ToolParser {
  async extractToolCalls(ids: readonly number[]): Promise<ToolParseResult> {
    const text = this.tokenizer.decode(ids);
    const calls = [...text.matchAll(/^CALL (\w+)\((.*)\)$/gm)].map((m) => ({ name: m[1]!, arguments: m[2]! }));
    return { content: text.replace(/^CALL .*$/gm, ""), toolCalls: calls, errors: 0 };
  }
}

test("parser registry: user formats register by name; clashes and unknown names are errors", async () => {
  registerToolParser("line_call", LineParser);
  registerToolParser("line_call", LineParser); // same class again is fine
  assert.ok(toolParserNames().includes("line_call"));
  const res = await getToolParser("line_call", tok).extractToolCalls(enc('ok\nCALL echo({"text": "hi"})\n'));
  assert.deepEqual(res.toolCalls, [{ name: "echo", arguments: '{"text": "hi"}' }]);
  assert.throws(() => registerToolParser("hermes", LineParser), /tool parser 'hermes' is already registered/);
  assert.throws(() => getToolParser("nope", tok), /unknown tool parser 'nope' \(known: hermes, .*line_call/);
  assert.ok(getToolParser("hermes", tok) instanceof HermesToolParser);
});

test("truncation matches verl's strings, counting code points", () => {
  assert.equal(truncateToolResponse("abcdef", 6, "left"), "abcdef");
  assert.equal(truncateToolResponse("abcdefgh", 4, "left"), "abcd...(truncated)");
  assert.equal(truncateToolResponse("abcdefgh", 4, "right"), "(truncated)...efgh");
  assert.equal(truncateToolResponse("abcdefgh", 5, "middle"), "ab...(truncated)...gh");
  assert.equal(truncateToolResponse("😀😀😀😀", 2, "left"), "😀😀...(truncated)");
  assert.equal(truncateToolResponse("abc", 1, "middle"), "...(truncated)...abc", "Python's text[-0:] keeps all");
});

test("module specs: built-ins, path#Export and clear errors", async () => {
  const builtins = new Map([["Thing", 1]]);
  assert.equal(await loadExport("Thing", { builtins, what: "x" }), 1);
  await assert.rejects(loadExport("Other", { builtins, what: "tool class_name" }), /tool class_name 'Other' is not a built-in \(known: Thing\) and not a 'path\/to\/module.js#ExportName' spec/);
  const self = new URL("./helpers.js", import.meta.url).pathname;
  assert.equal(typeof (await loadExport(`${self}#testTokenizer`, { what: "x" })), "function");
  await assert.rejects(loadExport("./does-not-exist.js#A", { what: "x", baseDir: "/tmp" }), /cannot import '.\/does-not-exist.js'/);
});

test("Python reprs used in tool texts", () => {
  assert.equal(pyStrRepr("72"), "'72'");
  assert.equal(pyStrRepr("it's"), `"it's"`);
  assert.equal(pyStrRepr(`a'b"c`), `'a\\'b"c'`);
  assert.equal(pyStrRepr("a\nb\\"), "'a\\nb\\\\'");
  assert.equal(pyFloatRepr(1), "1.0");
  assert.equal(pyFloatRepr(0), "0.0");
  assert.equal(pyFloatRepr(-0.05), "-0.05");
  assert.equal(pyFloatRepr(1e-5), "1e-05");
  assert.equal(pyFloatRepr(1.5e16), "1.5e+16");
});
