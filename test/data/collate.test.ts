import { test } from "node:test";
import assert from "node:assert/strict";
import { collateToDataProto, truncateIds } from "../../src/data/collate.js";

const rows = [
  { input_ids: [5, 6, 7], index: 0, data_source: "a", raw_prompt: [{ role: "user", content: "x" }] },
  { input_ids: [8], index: 1, data_source: "b", raw_prompt: [{ role: "user", content: "y" }], extra: 1 },
];

test("prompts are left-padded; mask and position ids follow verl", () => {
  const d = collateToDataProto(rows, { maxPromptLength: 4, padTokenId: 9 });
  assert.equal(d.length, 2);
  assert.deepEqual(d.tensor("input_ids").shape, [2, 4]);
  assert.deepEqual(Array.from(d.tensor("input_ids").data), [9, 5, 6, 7, 9, 9, 9, 8]);
  assert.deepEqual(Array.from(d.tensor("attention_mask").data), [0, 1, 1, 1, 0, 0, 0, 1]);
  assert.deepEqual(Array.from(d.tensor("position_ids").data), [0, 0, 1, 2, 0, 0, 0, 0]);
  assert.equal(d.tensor("input_ids").dtype, "int32");
  assert.deepEqual(d.nonTensorBatch.data_source, ["a", "b"]);
  assert.deepEqual(d.nonTensorBatch.extra, [null, 1], "a field missing from a row is null");
  assert.ok(!("input_ids" in d.nonTensorBatch));
  assert.deepEqual(d.nonTensorBatch.raw_prompt, [[{ role: "user", content: "x" }], [{ role: "user", content: "y" }]]);
});

test("truncation modes cut as verl does; error names the row", () => {
  const ids = [1, 2, 3, 4, 5, 6, 7];
  assert.deepEqual(truncateIds(ids, 4, "left", "r"), [4, 5, 6, 7]);
  assert.deepEqual(truncateIds(ids, 4, "right", "r"), [1, 2, 3, 4]);
  assert.deepEqual(truncateIds(ids, 5, "middle", "r"), [1, 2, 5, 6, 7]);
  assert.deepEqual(truncateIds(ids, 1, "middle", "r"), [7]);
  assert.equal(truncateIds(ids, 7, "error", "r"), ids);
  assert.throws(() => truncateIds(ids, 6, "error", "file.parquet row 3"), /file\.parquet row 3: prompt is 7 tokens, longer than data\.max_prompt_length=6/);
  assert.throws(() => collateToDataProto(rows, { maxPromptLength: 2, padTokenId: 0 }), /batch row 0 \(index 0\): prompt is 3 tokens/);
  const d = collateToDataProto(rows, { maxPromptLength: 2, padTokenId: 0, truncation: "left" });
  assert.deepEqual(Array.from(d.tensor("input_ids").data), [6, 7, 0, 8]);
});

test("rows without ids give only non-tensor columns; a mix is an error", () => {
  const d = collateToDataProto([{ a: 1 }, { a: 2 }], { maxPromptLength: 3, padTokenId: 0 });
  assert.deepEqual(Object.keys(d.batch), []);
  assert.deepEqual(d.nonTensorBatch.a, [1, 2]);
  assert.throws(() => collateToDataProto([{ input_ids: [1] }, { a: 2 }], { maxPromptLength: 3, padTokenId: 0 }), /some rows have input_ids and some do not/);
  assert.throws(() => collateToDataProto([{ input_ids: "abc" }], { maxPromptLength: 3, padTokenId: 0 }), /input_ids must be an array/);
});
