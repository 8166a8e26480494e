// SFT examples as verl's SFTDataset builds them: prompt through the chat template,
// response + EOS, right padding, verl's loss_mask, and the exact tokens that carry loss.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { writeParquet } from "../../../src/data/parquet.js";
import { RLHFDataset } from "../../../src/data/rl_dataset.js";
import { ARITHMETIC_ALPHABET, arithmeticRow } from "../../../src/data/preprocess/index.js";
import { CharTokenizer } from "../../../src/models/tokenizers/index.js";
import { SFTDataset, buildSftExample } from "../../../src/trainer/sft/index.js";

let dir = "";
let file = "";
const tok = new CharTokenizer(ARITHMETIC_ALPHABET);
const rows = [[3, 4], [12, 30], [99, 99], [7, 58]].map(([a, b], i) => arithmeticRow(a!, b!, "train", i));
const dictKeys = { prompt_key: "extra_info", response_key: "extra_info", prompt_dict_keys: ["question"], response_dict_keys: ["answer"] };

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "verl-sftds-"));
  file = join(dir, "train.parquet");
  await writeParquet(file, rows);
});
after(() => rmSync(dir, { recursive: true, force: true }));

test("loss_mask is verl's, and the tokens it weighs (position t predicts t+1) are exactly the response and EOS", () => {
  const ds = new SFTDataset([file], tok, { ...dictKeys, max_length: 40 });
  for (let i = 0; i < rows.length; i++) {
    const ex = ds.get(i);
    const info = rows[i]!.extra_info as { question: string; answer: string };
    const prompt = tok.encode(info.question, { addSpecialTokens: false });
    const response = [...tok.encode(info.answer, { addSpecialTokens: false }), tok.eosTokenId];
    const P = prompt.length, R = response.length;
    assert.deepEqual([...ex.inputIds.slice(0, P + R)], [...prompt, ...response]);
    assert.ok(ex.inputIds.slice(P + R).every((t) => t === tok.padTokenId), "right padding with pad ids");
    assert.deepEqual([...ex.attentionMask], Array.from({ length: 40 }, (_, t) => (t < P + R ? 1 : 0)));
    assert.deepEqual([...ex.positionIds], Array.from({ length: 40 }, (_, t) => Math.min(t, P + R - 1)));
    // verl: attention mask, positions [0, P-1) zeroed, position P+R-1 zeroed
    assert.deepEqual([...ex.lossMask], Array.from({ length: 40 }, (_, t) => (t >= P - 1 && t < P + R - 1 ? 1 : 0)));
    const predicted: number[] = [];
    for (let t = 0; t < 39; t++) if (ex.lossMask[t]) predicted.push(ex.inputIds[t + 1]!);
    assert.deepEqual(predicted, response, "only response tokens (EOS included) carry loss");
    assert.equal(tok.decode(predicted, { skipSpecialTokens: true }), info.answer);
  }
});

test("SFT prompt ids equal the RL dataset's for the same question (an SFT'd model starts RL on what it saw)", () => {
  const sft = new SFTDataset([file], tok, dictKeys);
  const rl = new RLHFDataset([file], tok, { max_prompt_length: 64, filter_overlong_prompts: false, shuffle: false });
  for (let i = 0; i < rows.length; i++) assert.deepEqual(sft.tokens(i).prompt, rl.get(i).input_ids);
});

test("truncation: error names the row and max_length; left keeps the tail, right keeps the head", () => {
  const long = { maxLength: 6, padTokenId: 0, where: "f.parquet row 3" };
  assert.throws(() => buildSftExample([5, 6, 7], [8, 9, 2], { ...long, maxLength: 5, truncation: "error" }), /f\.parquet row 3: prompt \+ response is 6 tokens, longer than data\.max_length=5/);
  const right = buildSftExample([5, 6, 7], [8, 9, 10, 2], { ...long, truncation: "right" });
  assert.deepEqual([...right.inputIds], [5, 6, 7, 8, 9, 10]);
  assert.deepEqual([...right.lossMask], [0, 0, 1, 1, 1, 0]);
  const left = buildSftExample([5, 6, 7], [8, 9, 10, 2], { ...long, truncation: "left" });
  assert.deepEqual([...left.inputIds], [6, 7, 8, 9, 10, 2]);
  const ds = new SFTDataset([file], tok, { ...dictKeys, max_length: 10 });
  assert.throws(() => ds.get(0), /train\.parquet row 0: prompt \+ response is \d+ tokens, longer than data\.max_length=10/);
});

test("plain columns, chat-message prompts, and errors that name the row and key", () => {
  const jsonl = join(dir, "pairs.jsonl");
  writeFileSync(jsonl, [
    JSON.stringify({ q: "What is 1+2?", a: "3" }),
    JSON.stringify({ q: [{ role: "user", content: "What is 2+2?" }], a: "4" }),
  ].join("\n"));
  const ds = new SFTDataset([jsonl], tok, { prompt_key: "q", response_key: "a", max_length: 20 });
  assert.equal(ds.length, 2);
  assert.equal(tok.decode(ds.get(1).inputIds.slice(0, 13), { skipSpecialTokens: true }), "What is 2+2?4");
  assert.throws(() => new SFTDataset([file], tok, { ...dictKeys, response_dict_keys: ["nope"] }), /train\.parquet row 0: 'extra_info' has no key 'nope'/);
  assert.throws(() => new SFTDataset([file], tok, { prompt_key: "missing", response_key: "extra_info" }), /row 0: no column 'missing' \(data\.prompt_key\)/);
  assert.throws(() => new SFTDataset([file], tok, { ...dictKeys, response_dict_keys: [] }), /row 0: the response must be a string/);
  assert.throws(() => new SFTDataset([jsonl], tok, { prompt_key: "q", response_key: "a", truncation: "middle" }), /data\.truncation must be one of error, left, right/);
});
