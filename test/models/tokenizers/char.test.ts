import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CharTokenizer } from "../../../src/models/tokenizers/char.js";
import { loadTokenizer } from "../../../src/models/tokenizers/index.js";

test("char: ids are <pad>,<bos>,<eos> then the alphabet; round trip", () => {
  const tok = new CharTokenizer("0123456789+=");
  assert.equal(tok.vocabSize, 15);
  assert.deepEqual(tok.encode("12+3="), [1, 4, 5, 13, 6, 14]);
  assert.deepEqual(tok.encode("12", { addSpecialTokens: false }), [4, 5]);
  assert.equal(tok.decode([1, 4, 5, 2, 0]), "<bos>12<eos><pad>");
  assert.equal(tok.decode([1, 4, 5, 2, 0], { skipSpecialTokens: true }), "12");
  assert.throws(() => tok.encode("1*2"), /character "\*" \(U\+002A\) at position 1 is not in the alphabet "0123456789\+="/);
  assert.throws(() => tok.decode([15]), /token id 15/);
  assert.throws(() => new CharTokenizer("aba"), /"a" appears twice/);
});

test("char: the built-in chat template joins contents; a custom one works", () => {
  const tok = new CharTokenizer("0123456789+=\n");
  assert.equal(tok.applyChatTemplate([{ role: "user", content: "1+2=" }], { addGenerationPrompt: true }), "1+2=");
  // transformers renders with trim_blocks: a bare newline right after a block tag is dropped, so emit it as an expression.
  const custom = new CharTokenizer("0123456789+=\n", "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}{{ '\\n' }}{% endif %}");
  const trimmed = new CharTokenizer("0123456789+=\n", "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}\n{% endif %}");
  assert.equal(trimmed.applyChatTemplate([{ role: "user", content: "1+2=" }], { addGenerationPrompt: true }), "1+2=");
  assert.equal(custom.applyChatTemplate([{ role: "user", content: "1+2=" }], { addGenerationPrompt: true }), "1+2=\n");
});

test("char: spec with escapes, saveTo + loadTokenizer round trip", async () => {
  const tok = (await loadTokenizer("char:ab\\n\\\\")) as CharTokenizer;
  assert.deepEqual(tok.alphabet, ["a", "b", "\n", "\\"]);
  const dir = mkdtempSync(join(tmpdir(), "verl-char-"));
  try {
    tok.saveTo(dir);
    const json = JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8"));
    assert.equal(json.verl_ts_tokenizer, "char");
    const back = await loadTokenizer(dir);
    assert.ok(back instanceof CharTokenizer);
    assert.deepEqual(back.encode("ab\n\\"), tok.encode("ab\n\\"));
    assert.equal(back.decode(back.encode("ba")), "<bos>ba");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
