// allReduceBuckets' alignment rule (src/workers/dp_optimizer.ts): buckets smaller than the buffer
// must sit on the collective's alignment (that keeps one call's bits), but a single bucket over the
// whole buffer is one call of any size. A host collective (alignment 16M elements) reducing a small
// model's gradients in one bucket was refused by mistake, which stopped every multi-host run.
import { test } from "node:test";
import assert from "node:assert/strict";
import { allReduceBuckets, reduceGradient } from "../../../src/workers/dp_optimizer.js";

/** Records the spans it is asked to reduce; one rank, so the sum is the values themselves. */
function recordingCollective(align: number) {
  const calls: number[] = [];
  return { calls, collective: { bucketAlignElems: align, worldSize: 1, allReduce: (a: Float32Array) => { calls.push(a.length); } } };
}

test("one bucket over the whole buffer is accepted at any size", async () => {
  const { calls, collective } = recordingCollective(16);
  const buf = new Float32Array(10);
  await allReduceBuckets(collective, buf, [Promise.resolve(Float32Array.from({ length: 10 }, (_, i) => i))], buf.length);
  assert.deepEqual(calls, [10]);
  assert.deepEqual(Array.from(buf), Array.from({ length: 10 }, (_, i) => i));
});

test("several buckets must be aligned; aligned ones are reduced in order", async () => {
  const { collective } = recordingCollective(16);
  await assert.rejects(allReduceBuckets(collective, new Float32Array(40), [], 20), /bucket of 20 elements is not a multiple of the collective's 16/);
  const ok = recordingCollective(16);
  await allReduceBuckets(ok.collective, new Float32Array(40), [], 16);
  assert.deepEqual(ok.calls, [16, 16, 8]);
});

test("reduceGradient on a collective without reduceScaled: the reduce, then the scale and the squares as passes, same rule", async () => {
  const { calls, collective } = recordingCollective(16);
  const buf = Float32Array.from({ length: 40 }, (_, i) => i + 1);
  await assert.rejects(reduceGradient(collective, buf, [], 20, { bounds: [0, 38], scatter: false, scale: 0.5 }), /bucket of 20 elements is not a multiple of the collective's 16/);
  await assert.rejects(reduceGradient(collective, buf, [], 40, { bounds: [0, 38], scatter: true, scale: 1 }), /the collective has no reduceScatter/);
  // one rank's slice is [0, 38); the two values past it ride along unscaled
  const squares = await reduceGradient(collective, buf, [], 16, { bounds: [0, 38], scatter: false, scale: 0.5 });
  assert.deepEqual(calls, [16, 16, 8]);
  assert.deepEqual(Array.from(buf), Array.from({ length: 40 }, (_, i) => (i < 38 ? (i + 1) / 2 : i + 1)));
  let want = 0;
  for (let i = 0; i < 38; i++) want += ((i + 1) / 2) ** 2;
  assert.equal(squares, want, "the slice's squares in order, continued across buckets");
});
