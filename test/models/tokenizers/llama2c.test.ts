import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, existsSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Llama2cTokenizer, parseLlama2cTokenizer } from "../../../src/models/tokenizers/llama2c.js";
import { HfTokenizer } from "../../../src/models/tokenizers/hf.js";
import { loadTokenizer } from "../../../src/models/tokenizers/index.js";
import { sharedPath } from "../../../src/utils/paths.js";
import { Rng } from "../../../src/utils/rng.js";

const tokPath = sharedPath("models", "stories260K", "tok512.bin");
const skip = tokPath ? false : "../shared/models/stories260K absent";

// Ids from a line-by-line Python port of llama2.c run.c encode() (the O(n^2) scan), run on tok512.bin.
const RUNC_IDS: Record<string, number[]> = {
  "Once upon a time": [1, 403, 407, 261, 378],
  "": [1],
  " ": [1, 410, 410],
  "Hello world!": [1, 346, 306, 414, 263, 304, 341, 443],
  "trailing  ": [1, 259, 420, 412, 290, 299, 410, 410],
  "Lily and Ben went to the park.\nThey saw a dog.": [1, 317, 269, 368, 302, 263, 377, 267, 265, 282, 295, 433, 426, 13, 434, 260, 422, 394, 261, 400, 428, 426],
  "naïve café — 東京 🙂": [1, 297, 412, 198, 178, 360, 280, 412, 431, 485, 410, 481, 410, 233, 160, 180, 231, 189, 175, 410, 243, 162, 156, 133],
  "<s> not special </s>": [1, 410, 504, 419, 505, 297, 309, 262, 427, 411, 429, 417, 412, 421, 410, 504, 492, 419, 505],
  "tab\there": [1, 259, 412, 430, 12, 260, 276],
};

/** run.c's merge loop, verbatim in spirit: rescan all pairs, take the first strictly best. */
function naiveRunc(tok: Llama2cTokenizer, text: string): number[] {
  const key = (id: number) => Buffer.from(tok.pieces[id]!).toString("latin1");
  const byKey = new Map<string, number>();
  tok.pieces.forEach((_, id) => { if (!byKey.has(key(id))) byKey.set(key(id), id); });
  const ids = [1];
  if (text.length) ids.push(byKey.get(" ")!);
  for (const ch of text) {
    const b = Buffer.from(ch, "utf8");
    const id = byKey.get(b.toString("latin1"));
    if (id !== undefined) ids.push(id); else for (const x of b) ids.push(x + 3);
  }
  for (;;) {
    let best = -1e10, bestId = -1, bestIdx = -1;
    for (let i = 0; i + 1 < ids.length; i++) {
      const id = byKey.get(key(ids[i]!) + key(ids[i + 1]!));
      if (id !== undefined && tok.scores[id]! > best) { best = tok.scores[id]!; bestId = id; bestIdx = i; }
    }
    if (bestIdx < 0) break;
    ids.splice(bestIdx, 2, bestId);
  }
  return ids;
}

function randomText(rng: Rng, n: number): string {
  const alphabet = ["a", "e", "t", "h", " ", " ", "o", "n", "s", "L", "i", "l", "y", ".", ",", "\n", "é", "東", "🙂", "1", "7", "!", "'", "T"];
  let s = "";
  for (let i = 0; i < n; i++) s += alphabet[rng.int(alphabet.length)];
  return s;
}

test("llama2c: encodes like run.c on fixed strings", { skip }, () => {
  const tok = Llama2cTokenizer.fromFile(tokPath!);
  assert.equal(tok.vocabSize, 512);
  for (const [text, ids] of Object.entries(RUNC_IDS)) assert.deepEqual(tok.encode(text), ids, JSON.stringify(text));
  assert.deepEqual(tok.encode("Once upon a time", { addSpecialTokens: false }), [403, 407, 261, 378]);
});

test("llama2c: heap merge equals run.c's rescanning merge on random text", { skip }, () => {
  const tok = Llama2cTokenizer.fromFile(tokPath!);
  const rng = new Rng(3);
  for (let k = 0; k < 200; k++) {
    const text = randomText(rng, 1 + rng.int(60));
    assert.deepEqual(tok.encode(text), naiveRunc(tok, text), JSON.stringify(text));
  }
});

test("llama2c: decode round trips and follows run.c's spacing rules", { skip }, () => {
  const tok = Llama2cTokenizer.fromFile(tokPath!);
  for (const text of Object.keys(RUNC_IDS)) {
    assert.equal(tok.decode(tok.encode(text), { skipSpecialTokens: true }), text);
  }
  // Leading space dropped only right after BOS; a continuation keeps its space.
  assert.equal(tok.decode([403, 407]), " Once upon");
  assert.equal(tok.decode([1, 403, 407], { skipSpecialTokens: true }), "Once upon");
  assert.equal(tok.decode([1, 403, 2]), "<s>Once</s>");
  assert.equal(tok.decode([13]), "\n"); // byte token <0x0A>
  assert.throws(() => tok.decode([512]), /token id 512 at position 0 is outside the vocabulary/);
  assert.throws(() => tok.applyChatTemplate([{ role: "user", content: "hi" }]), /no chat template/);
});

test("llama2c: the HF export reproduces the same ids through HfTokenizer", { skip }, async () => {
  const tok = Llama2cTokenizer.fromFile(tokPath!);
  const dir = mkdtempSync(join(tmpdir(), "verl-tok-"));
  try {
    tok.saveTo(dir);
    for (const f of ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.bin"]) {
      assert.ok(existsSync(join(dir, f)), f);
    }
    assert.deepEqual(readFileSync(join(dir, "tokenizer.bin")), readFileSync(tokPath!));
    const hf = HfTokenizer.fromDir(dir);
    assert.equal(hf.bosTokenId, 1);
    assert.equal(hf.eosTokenId, 2);
    assert.equal(hf.vocabSize, 512);
    const rng = new Rng(11);
    // Literal "<s>" in text is an added token for HF but plain characters for run.c: left out on purpose.
    const texts = Object.keys(RUNC_IDS).filter((t) => !t.includes("<s>"));
    for (let k = 0; k < 300; k++) texts.push(randomText(rng, 1 + rng.int(80)));
    for (const text of texts) {
      assert.deepEqual(hf.encode(text), tok.encode(text), JSON.stringify(text));
      assert.deepEqual(hf.encode(text, { addSpecialTokens: false }), tok.encode(text, { addSpecialTokens: false }));
    }
    assert.equal(hf.decode(tok.encode("Once upon a time, Lily"), { skipSpecialTokens: true }), "Once upon a time, Lily");
    // The folder loads back as llama2.c (tokenizer.bin preferred) with identical behaviour.
    const again = await loadTokenizer(dir);
    assert.ok(again instanceof Llama2cTokenizer);
    assert.deepEqual(again.encode("Once upon a time"), RUNC_IDS["Once upon a time"]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("llama2c: corrupt files fail with the path in the message", () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-tok-"));
  try {
    assert.throws(() => Llama2cTokenizer.fromFile(join(dir, "missing.bin")), /cannot read llama2.c tokenizer .*missing\.bin/);
    if (tokPath) {
      const bytes = readFileSync(tokPath);
      assert.throws(() => parseLlama2cTokenizer(bytes.subarray(0, 3000), "cut.bin"), /cut\.bin: (truncated at token|token \d+ has byte length)/);
      assert.throws(() => parseLlama2cTokenizer(bytes, "tok.bin", 600), /tok\.bin: expected 600 tokens, found 512/);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("llama2c: withChatTemplate gives the template-less tokenizer a chat template, same vocabulary", { skip }, () => {
  const tok = Llama2cTokenizer.fromFile(tokPath!);
  assert.equal(tok.hasChatTemplate, false);
  const templated = tok.withChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}");
  assert.ok(templated.hasChatTemplate);
  assert.equal(templated.applyChatTemplate([{ role: "user", content: "Once upon a time" }]), "<s>user: Once upon a time");
  assert.deepEqual(templated.encode("Once upon a time"), tok.encode("Once upon a time"));
});
