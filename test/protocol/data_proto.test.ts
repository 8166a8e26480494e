import { test } from "node:test";
import assert from "node:assert/strict";
import {
  DataProto, dataProtoConfig, padDataProtoToDivisor, unpadDataProto, tensor, type TensorData,
} from "../../src/protocol/index.js";

// 4 rows: ids row i = [10i, 10i+1], score row i = i + 0.5, uid row i = "u{i}".
function sample(n = 4, meta: Record<string, unknown> = { temperature: 1 }): DataProto {
  const ids = Int32Array.from({ length: n * 2 }, (_, k) => 10 * Math.floor(k / 2) + (k % 2));
  const score = Float32Array.from({ length: n }, (_, i) => i + 0.5);
  return DataProto.fromDict(
    { ids: tensor(ids, [n, 2]), score: tensor(score, [n]) },
    { uid: Array.from({ length: n }, (_, i) => `u${i}`) },
    meta,
  );
}
const ids = (d: DataProto) => Array.from(d.tensor("ids").data);
const uids = (d: DataProto) => d.nonTensorBatch.uid;

test("construction checks consistent first dimensions and names the key", () => {
  assert.throws(() => new DataProto({ a: tensor([1, 2], [2]), b: tensor([1, 2, 3], [3]) }), /batch key 'b' has 3 rows but 'a' has 2/);
  assert.throws(() => new DataProto({ a: tensor([1, 2], [2]) }, { s: ["x"] }), /non-tensor key 's' has length 1 but 'a' has 2/);
  assert.throws(() => new DataProto({}, { s: ["x"], t: ["a", "b"] }), /non-tensor key 't'/);
  assert.throws(() => new DataProto({ a: { data: new Float32Array(3), shape: [2], dtype: "float32" } }), /'a': data has 3 elements/);
  assert.throws(() => new DataProto({ a: { data: new Float32Array(2), shape: [2], dtype: "int32" } }), /'a': dtype int32 needs a Int32Array/);
  assert.throws(() => new DataProto({ a: { data: new Float32Array(1), shape: [], dtype: "float32" } }), /'a': a batch tensor needs a batch dimension/);
  assert.throws(() => new DataProto({}, { s: "abc" as unknown as unknown[] }), /non-tensor key 's' must be an array/);
});

test("fromSingleDict splits tensors from arrays and rejects other values", () => {
  const d = DataProto.fromSingleDict({ x: tensor([1, 2, 3], [3]), tag: ["a", "b", "c"] }, { k: 1 });
  assert.deepEqual(Object.keys(d.batch), ["x"]);
  assert.deepEqual(d.nonTensorBatch.tag, ["a", "b", "c"]);
  assert.equal(d.metaInfo.k, 1);
  assert.throws(() => DataProto.fromSingleDict({ x: 3 as unknown as unknown[] }), /key 'x' is neither a TensorData nor an array/);
});

test("length: batch dim, else first non-tensor, else 0", () => {
  assert.equal(sample(5).length, 5);
  assert.equal(new DataProto({}, { s: ["a", "b"] }).length, 2);
  assert.equal(new DataProto().length, 0);
});

test("at(i) gives one row; negative counts from the end; out of range is an error", () => {
  const d = sample();
  const r = d.at(2);
  assert.deepEqual(Array.from(r.batch.ids!.data), [20, 21]);
  assert.deepEqual(r.batch.ids!.shape, [2]);
  assert.equal(r.batch.score!.data[0], 2.5);
  assert.equal(r.nonTensorBatch.uid, "u2");
  assert.equal(d.at(-1).nonTensorBatch.uid, "u3");
  assert.throws(() => d.at(4), /index 4 out of range for 4 rows/);
  assert.throws(() => d.at(-5), /out of range/);
});

test("slice follows Python semantics and copies", () => {
  const d = sample(6);
  assert.deepEqual(uids(d.slice(1, 3)), ["u1", "u2"]);
  assert.deepEqual(uids(d.slice(0, -2)), ["u0", "u1", "u2", "u3"]);
  assert.deepEqual(uids(d.slice(4)), ["u4", "u5"]);
  assert.deepEqual(uids(d.slice(0, 6, 2)), ["u0", "u2", "u4"]);
  assert.equal(d.slice(5, 2).length, 0);
  assert.deepEqual(d.slice(5, 2).tensor("ids").shape, [0, 2]);
  const s = d.slice(0, 2);
  s.tensor("ids").data[0] = 99;
  assert.equal(d.tensor("ids").data[0], 0, "slice owns its buffer");
  assert.throws(() => d.slice(0, 2, 0), /step must be a positive integer/);
});

test("selectIdxs takes index lists (with negatives) and boolean masks", () => {
  const d = sample();
  const p = d.selectIdxs([3, 0, -1]);
  assert.deepEqual(uids(p), ["u3", "u0", "u3"]);
  assert.deepEqual(ids(p), [30, 31, 0, 1, 30, 31]);
  assert.deepEqual(uids(d.selectIdxs(Int32Array.from([1, 2]))), ["u1", "u2"]);
  assert.deepEqual(uids(d.selectIdxs(Uint8Array.from([1, 0, 0, 1]))), ["u0", "u3"]);
  assert.deepEqual(uids(d.selectIdxs([false, true, true, false])), ["u1", "u2"]);
  assert.deepEqual(uids(d.selectIdxs(tensor(Uint8Array.from([0, 0, 1, 0]), [4], "bool"))), ["u2"]);
  assert.deepEqual(d.selectIdxs(new Uint8Array(4)).tensor("score").shape, [0]);
  assert.throws(() => d.selectIdxs([4]), /index 4 out of range for 4 rows/);
  assert.throws(() => d.selectIdxs([1.5]), /index 1.5 out of range/);
  assert.throws(() => d.selectIdxs(Uint8Array.from([1, 0])), /boolean mask has length 2 but the batch has 4 rows/);
  assert.equal(p.metaInfo.temperature, 1);
});

test("select keeps named keys; a missing batch key is an error", () => {
  const d = sample(4, { a: 1, b: 2 });
  const s = d.select(["ids"], [], ["b"]);
  assert.deepEqual(Object.keys(s.batch), ["ids"]);
  assert.deepEqual(Object.keys(s.nonTensorBatch), []);
  assert.deepEqual(s.metaInfo, { b: 2 });
  assert.equal(s.tensor("ids"), d.tensor("ids"), "select shares tensors");
  const all = d.select();
  assert.deepEqual(Object.keys(all.batch).sort(), ["ids", "score"]);
  assert.deepEqual(Object.keys(all.nonTensorBatch), ["uid"]);
  assert.throws(() => d.select(["nope"]), /no batch key 'nope' \(has: ids, score\)/);
});

test("pop removes keys and returns them; a missing key is an error and changes nothing", () => {
  const d = sample(4, { a: 1, b: 2 });
  assert.throws(() => d.pop(["ids"], ["missing"]), /no non-tensor key 'missing'/);
  assert.ok("ids" in d.batch, "failed pop left the batch intact");
  const p = d.pop(["score"], ["uid"], ["a"]);
  assert.deepEqual(Object.keys(p.batch), ["score"]);
  assert.deepEqual(p.nonTensorBatch.uid, ["u0", "u1", "u2", "u3"]);
  assert.deepEqual(p.metaInfo, { a: 1 });
  assert.deepEqual(Object.keys(d.batch), ["ids"]);
  assert.deepEqual(Object.keys(d.nonTensorBatch), []);
  assert.deepEqual(d.metaInfo, { b: 2 });
  assert.throws(() => d.pop(["score"]), /no batch key 'score'/);
  assert.throws(() => d.pop([], [], ["zz"]), /no meta key 'zz'/);
});

test("rename moves batch keys in place", () => {
  const d = sample();
  const t = d.tensor("ids");
  assert.equal(d.rename("ids", "input_ids"), d);
  assert.equal(d.tensor("input_ids"), t);
  assert.ok(!("ids" in d.batch));
  d.rename(["input_ids", "score"], ["score", "input_ids"]);
  assert.equal(d.tensor("score"), t, "swap works");
  assert.throws(() => d.rename(["score"], ["a", "b"]), /1 old keys but 2 new keys/);
  assert.throws(() => d.rename("nope", "x"), /no batch key 'nope'/);
  assert.throws(() => d.rename("score", "input_ids"), /'input_ids' already exists/);
});

test("union merges; equal overlaps are fine, conflicts name the key", () => {
  const a = sample(4, { m: 1 });
  const b = new DataProto({ ids: sample().tensor("ids"), extra: tensor(new Float32Array(4), [4]) }, { uid: ["u0", "u1", "u2", "u3"], nan: [NaN, 1, 2, 3] }, { m: 1, n: 2 });
  const u = a.union(b);
  assert.equal(u, a);
  assert.deepEqual(Object.keys(a.batch).sort(), ["extra", "ids", "score"]);
  assert.deepEqual(a.metaInfo, { m: 1, n: 2 });
  assert.doesNotThrow(() => a.union(new DataProto({}, { nan: [NaN, 1, 2, 3] })), "NaN equals NaN in non-tensor columns");
  assert.throws(() => sample().union(new DataProto({ score: tensor(new Float32Array(4), [4]) })), /batch key 'score' differs/);
  assert.throws(() => sample().union(new DataProto({}, { uid: ["x", "u1", "u2", "u3"] })), /non-tensor key 'uid' differs/);
  assert.throws(() => sample(4, { m: 1 }).union(new DataProto({}, {}, { m: 2 })), /meta key 'm' differs/);
  assert.throws(() => sample(4).union(sample(3)), /batch sizes differ \(4 vs 3\)/);
  assert.equal(new DataProto().union(sample(3)).length, 3, "an empty DataProto takes the other's rows");
});

test("chunk splits into equal parts; uneven is an error unless auto padding is on", () => {
  const d = sample(6);
  const parts = d.chunk(3);
  assert.deepEqual(parts.map(uids), [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]);
  assert.equal(parts[1]!.metaInfo.temperature, 1);
  assert.throws(() => d.chunk(4), /6 rows do not split into 4/);
  assert.throws(() => d.chunk(0), /positive integer/);
  const padded = sample(6, { _verl_auto_padding: true }).chunk(4);
  assert.deepEqual(padded.map((p) => p.length), [2, 2, 1, 1]);
  dataProtoConfig.autoPadding = true;
  try { assert.equal(sample(5).chunk(2).length, 2); } finally { dataProtoConfig.autoPadding = false; }
});

test("split gives parts of a size with a short tail", () => {
  assert.deepEqual(sample(5).split(2).map(uids), [["u0", "u1"], ["u2", "u3"], ["u4"]]);
  assert.throws(() => sample().split(0), /positive integer/);
});

test("concat joins rows, merges meta, and gathers metrics as verl does", () => {
  const a = sample(2, { t: 1, metrics: { loss: 1, acc: 0.5 } });
  const b = sample(3, { t: 1, metrics: [{ loss: 2, acc: 0.6 }, { loss: 3, acc: 0.7 }] });
  const c = sample(1, { t: 1, metrics: null });
  const d = DataProto.concat([a, b, c]);
  assert.equal(d.length, 6);
  assert.deepEqual(ids(d), [0, 1, 10, 11, 0, 1, 10, 11, 20, 21, 0, 1]);
  assert.deepEqual(uids(d), ["u0", "u1", "u0", "u1", "u2", "u0"]);
  assert.deepEqual(d.metaInfo, { t: 1, metrics: { loss: [1, 2, 3], acc: [0.5, 0.6, 0.7] } });
  assert.ok(!("metrics" in DataProto.concat([sample(1), sample(1)]).metaInfo), "no metrics in -> none out");
  assert.throws(() => DataProto.concat([sample(1, { t: 1 }), sample(1, { t: 2 })]), /conflicting values for meta key 't'/);
  assert.throws(() => DataProto.concat([]), /empty list/);
  assert.throws(() => DataProto.concat([sample(1), sample(1).select(["ids"])]), /item 1 has batch keys \[ids\] but item 0 has \[ids,score\]/);
  const wide = new DataProto({ ids: tensor(new Int32Array(3), [1, 3]), score: tensor([0], [1]) }, { uid: ["x"] });
  assert.throws(() => DataProto.concat([sample(1), wide]), /batch key 'ids' has shape \[1, 3\] in item 1/);
  assert.throws(
    () => DataProto.concat([sample(1, { metrics: { a: 1 } }), sample(1, { metrics: { b: 1 } })]),
    /metrics item 1 has key 'b' that item 0 lacks/,
  );
});

test("reorder permutes in place", () => {
  const d = sample();
  d.reorder([2, 0, 3, 1]);
  assert.deepEqual(uids(d), ["u2", "u0", "u3", "u1"]);
  assert.deepEqual(Array.from(d.tensor("score").data), [2.5, 0.5, 3.5, 1.5]);
  assert.throws(() => d.reorder([7]), /reorder: index 7 out of range/);
});

test("repeat interleaves [a,a,b,b] or tiles [a,b,a,b]", () => {
  const d = sample(2);
  assert.deepEqual(uids(d.repeat(2)), ["u0", "u0", "u1", "u1"]);
  assert.deepEqual(ids(d.repeat(2)), [0, 1, 0, 1, 10, 11, 10, 11]);
  assert.deepEqual(uids(d.repeat(3, false)), ["u0", "u1", "u0", "u1", "u0", "u1"]);
  assert.deepEqual(ids(d.repeat(2, false)), [0, 1, 10, 11, 0, 1, 10, 11]);
  assert.equal(d.repeat(0).length, 0);
  assert.throws(() => d.repeat(-1), /non-negative integer/);
});

test("sampleLevelRepeat repeats each row its own number of times", () => {
  const d = sample(3);
  const r = d.sampleLevelRepeat([2, 0, 3]);
  assert.deepEqual(uids(r), ["u0", "u0", "u2", "u2", "u2"]);
  assert.deepEqual(Array.from(r.tensor("score").data), [0.5, 0.5, 2.5, 2.5, 2.5]);
  assert.throws(() => d.sampleLevelRepeat([1, 1]), /2 repeat counts for 3 rows/);
  assert.throws(() => d.sampleLevelRepeat([1, -1, 1]), /non-negative integers/);
});

test("padDataProtoToDivisor repeats rows from the start; unpad restores", () => {
  const d = sample(3);
  const { padded, padSize } = padDataProtoToDivisor(d, 4);
  assert.equal(padSize, 1);
  assert.deepEqual(uids(padded), ["u0", "u1", "u2", "u0"]);
  const big = padDataProtoToDivisor(sample(2), 7);
  assert.equal(big.padSize, 5);
  assert.deepEqual(uids(big.padded), ["u0", "u1", "u0", "u1", "u0", "u1", "u0"]);
  assert.deepEqual(uids(unpadDataProto(big.padded, big.padSize)), ["u0", "u1"]);
  const same = padDataProtoToDivisor(d, 3);
  assert.equal(same.padSize, 0);
  assert.equal(same.padded, d);
  assert.equal(unpadDataProto(d, 0), d);
  assert.throws(() => padDataProtoToDivisor(d, 0), /positive integer/);
  assert.throws(() => unpadDataProto(d, 4), /pad size 4 is not in \[0, 3\]/);
});

test("padding appends copies of the first or last row", () => {
  const d = sample(2);
  d.padding(2, "last");
  assert.deepEqual(uids(d), ["u0", "u1", "u1", "u1"]);
  const e = sample(2);
  e.padding(1);
  assert.deepEqual(uids(e), ["u0", "u1", "u0"]);
  assert.throws(() => new DataProto().padding(1), /empty/);
});

test("clone is deep", () => {
  const d = sample();
  const c = d.clone();
  c.tensor("ids").data[0] = 42;
  (c.nonTensorBatch.uid as string[])[0] = "z";
  assert.equal(d.tensor("ids").data[0], 0);
  assert.equal(uids(d)![0], "u0");
});

test("a bool tensor keeps its dtype through gather and concat", () => {
  const m: TensorData = tensor(Uint8Array.from([1, 0, 1]), [3], "bool");
  const d = new DataProto({ m });
  assert.equal(d.repeat(2).tensor("m").dtype, "bool");
  assert.ok(DataProto.concat([d, d]).tensor("m").data instanceof Uint8Array);
});
