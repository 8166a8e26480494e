// Host-side column cuts that the forward passes use instead of device slices.
import { test } from "node:test";
import assert from "node:assert/strict";
import { int32Columns, int32Values, tensor } from "../../src/protocol/tensor.js";

test("int32Columns cuts [start, start + width) of every row, converting other dtypes", () => {
  const t = tensor(Float32Array.from({ length: 12 }, (_, i) => i), [3, 4]);
  assert.deepEqual([...int32Columns(t, 1, 2)], [1, 2, 5, 6, 9, 10]);
  assert.deepEqual([...int32Columns(t, 0, 4)], [...int32Values(t)]);
  assert.equal(int32Columns(t, 4, 0).length, 0);
});

test("int32Columns refuses a range outside the row", () => {
  const t = tensor(new Int32Array(6), [2, 3]);
  assert.throws(() => int32Columns(t, 2, 2), /columns \[2, 4\) outside \[0, 3\)/);
  assert.throws(() => int32Columns(t, -1, 1), /outside/);
});

test("int32Values hands back an Int32Array tensor's own array and copies others", () => {
  const own = new Int32Array([1, 2]);
  assert.equal(int32Values(tensor(own, [2])), own);
  assert.deepEqual([...int32Values(tensor(new Uint8Array([1, 0]), [2]))], [1, 0]);
});
