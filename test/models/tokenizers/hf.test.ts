import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HfTokenizer } from "../../../src/models/tokenizers/hf.js";
import { loadTokenizer } from "../../../src/models/tokenizers/index.js";

/** GPT-2's byte-to-unicode table (what ByteLevel BPE vocabularies such as Qwen's are written in). */
function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const table: string[] = new Array(256);
  bs.forEach((b, i) => { table[b] = String.fromCodePoint(cs[i]!); });
  return table;
}

/** A tiny Qwen-like tokenizer: byte-level BPE with a few merges and the ChatML added tokens. */
function tinyQwenJson() {
  const vocab: Record<string, number> = {};
  bytesToUnicode().forEach((c, i) => { vocab[c] = i; });
  const merges = [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["Ġ", "w"], ["o", "r"], ["Ġw", "or"], ["Ġwor", "l"], ["Ġworl", "d"]];
  let next = 256;
  for (const [a, b] of merges) vocab[a! + b!] = next++;
  const added = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map((content, k) => ({
    id: next + k, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  return {
    version: "1.0",
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
  };
}

// Qwen2.5's template, shortened but keeping its structure: default system prompt, tools block, tool calls, tool responses.
const QWEN_TEMPLATE = `{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- for tool_call in message.tool_calls %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' + (tool_call.function.arguments | tojson) + '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}`;

const CONFIG = { bos_token: null, eos_token: "<|im_end|>", pad_token: "<|endoftext|>", chat_template: QWEN_TEMPLATE, clean_up_tokenization_spaces: false };

test("hf: byte-level BPE encodes with merges, splits added tokens, decodes back", () => {
  const tok = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: CONFIG });
  assert.equal(tok.vocabSize, 256 + 9 + 3);
  assert.deepEqual(tok.encode("hello world"), [259, 264]); // "hello", "Ġworld"
  assert.deepEqual(tok.encode("hello world", { addSpecialTokens: false }), [259, 264]);
  const chat = "<|im_start|>user\nhello<|im_end|>";
  const ids = tok.encode(chat);
  assert.equal(ids[0], 266);
  assert.equal(ids.at(-1), 267);
  assert.equal(tok.decode(ids), chat);
  assert.equal(tok.decode(ids, { skipSpecialTokens: true }), "user\nhello");
  for (const text of ["héllo wörld 東京 🙂", "  two  spaces ", "x\ty\r\nz", ""]) {
    assert.equal(tok.decode(tok.encode(text)), text, JSON.stringify(text));
  }
  assert.equal(tok.decode([]), "");
  assert.throws(() => tok.decode([5000]), /token id 5000 at position 0 is outside the vocabulary/);
});

test("hf: special tokens and generation stops come from the config files", () => {
  const tok = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: CONFIG, generationConfig: { eos_token_id: [267, 265] } });
  assert.equal(tok.bosTokenId, null);
  assert.equal(tok.eosTokenId, 267);
  assert.equal(tok.padTokenId, 265);
  assert.deepEqual([...tok.eosTokenIds].sort(), [265, 267]);
  const noPad = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: { eos_token: "<|endoftext|>" } });
  assert.equal(noPad.padTokenId, 265); // pad falls back to eos, as verl does
  assert.deepEqual([...noPad.eosTokenIds], [265], "no generation_config: the tokenizer's eos alone stops");
  assert.equal(noPad.hasChatTemplate, false);
  assert.throws(() => noPad.applyChatTemplate([{ role: "user", content: "x" }]), /no chat_template/);
  assert.throws(() => new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: { eos_token: "<eos>" } }), /eos_token "<eos>" is not in the vocabulary/);
});

test("hf: a chat model stops on its eos (<|im_end|>), not on every special token such as <|endoftext|>", () => {
  const chat = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: CONFIG });
  assert.equal(chat.eosTokenId, 267);
  assert.deepEqual([...chat.eosTokenIds], [267], "<|endoftext|> (265) is the pad token here, not a stop");
  const listed = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: CONFIG, generationConfig: { eos_token_id: [267, 265, 267] } });
  assert.deepEqual([...listed.eosTokenIds], [267, 265], "generation_config.json's list, once each");
});

test("hf: the Qwen chat template renders like transformers (generation prompt, tools, kwargs)", () => {
  const tok = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: CONFIG });
  assert.ok(tok.hasChatTemplate);
  const msgs = [{ role: "user", content: "What is 2+2?" }];
  assert.equal(
    tok.applyChatTemplate(msgs, { addGenerationPrompt: true }),
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
  );
  assert.equal(
    tok.applyChatTemplate([{ role: "system", content: "Be terse." }, ...msgs]),
    "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
  );
  const tool = { type: "function", function: { name: "calc", description: "add", parameters: { type: "object" } } };
  const withTools = tok.applyChatTemplate(
    [...msgs, { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "calc", arguments: { a: 2 } } }] }, { role: "tool", content: "4" }],
    { tools: [tool], addGenerationPrompt: true },
  );
  assert.match(withTools, /^<\|im_start\|>system\nYou are Qwen\.\n\n# Tools\n<tools>\n\{"type": "function", "function": \{"name": "calc"/);
  assert.match(withTools, /<tool_call>\n\{"name": "calc", "arguments": \{"a": 2\}\}\n<\/tool_call><\|im_end\|>\n<\|im_start\|>user\n<tool_response>\n4\n<\/tool_response>/);
  assert.ok(tok.applyChatTemplate(msgs, { addGenerationPrompt: true, kwargs: { enable_thinking: false } }).endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  // A rendered prompt tokenizes with the added tokens intact.
  const ids = tok.encode(tok.applyChatTemplate(msgs, { addGenerationPrompt: true }), { addSpecialTokens: false });
  assert.equal(ids.filter((i) => i === 266).length, 3);
});

test("hf: loadTokenizer reads a folder (tokenizer.json, tokenizer_config.json, generation_config.json) and saveTo writes it back", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-hf-"));
  try {
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tinyQwenJson()));
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(CONFIG));
    writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: 265 }));
    const tok = await loadTokenizer(dir);
    assert.ok(tok instanceof HfTokenizer);
    assert.deepEqual([...tok.eosTokenIds], [265], "generation_config.json's eos_token_id (an int) wins over the tokenizer's eos, as in transformers");
    const out = join(dir, "copy");
    tok.saveTo!(out);
    const back = await loadTokenizer(out);
    assert.deepEqual(back.encode("hello world"), tok.encode("hello world"));
    assert.equal(back.applyChatTemplate([{ role: "user", content: "hi" }]), tok.applyChatTemplate([{ role: "user", content: "hi" }]));
    writeFileSync(join(dir, "bad", "..", "broken.json"), "{");
    await assert.rejects(loadTokenizer(join(dir, "broken.json")), /broken\.json is not valid JSON/);
    await assert.rejects(loadTokenizer(join(dir, "nope")), /tokenizer path .*nope does not exist/);
    const empty = mkdtempSync(join(tmpdir(), "verl-empty-"));
    await assert.rejects(loadTokenizer(empty), new RegExp(`no tokenizer in ${empty}`));
    rmSync(empty, { recursive: true });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("hf: withChatTemplate replaces the config's template, for tool prompts too; saveTo keeps it", () => {
  const tok = new HfTokenizer({ tokenizerJson: tinyQwenJson(), tokenizerConfig: CONFIG }).withChatTemplate("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}");
  const msgs = [{ role: "user", content: "hello" }];
  assert.equal(tok.applyChatTemplate(msgs, { addGenerationPrompt: true }), "[user:hello]");
  assert.equal(tok.applyChatTemplate(msgs, { tools: [{ type: "function" }] }), "[user:hello]");
  const dir = mkdtempSync(join(tmpdir(), "verl-hf-cct-"));
  try {
    tok.saveTo(dir);
    assert.equal(HfTokenizer.fromDir(dir).applyChatTemplate(msgs), "[user:hello]");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
