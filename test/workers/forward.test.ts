import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { column } from "../../src/workers/batching.js";
import { inferInMicroBatches } from "../../src/workers/forward.js";
import { syntheticBatch } from "./helpers.js";

// The read of micro-batch k is awaited only after micro-batch k+1 is recorded, so a GPU computes k
// while the host records k+1; the rows still land in their places and nothing is left alive.
test("inferInMicroBatches records the next micro-batch before it waits for the last one's read", async () => {
  await initBackend("cpu");
  const data = syntheticBatch(7, 3, 4, 32, 5);
  const events: string[] = [];
  const proto = Object.getPrototypeOf(tf.scalar(0)) as { data(): Promise<unknown> };
  const data0 = proto.data;
  let k = 0;
  proto.data = function (this: tf.Tensor) {
    const at = (this as unknown as { micro?: number }).micro;
    // resolved on a timer, as a device's read is: the host goes on recording meanwhile
    return data0.call(this).then((v) => new Promise((res) => setTimeout(() => { events.push(`read ${at}`); res(v); }, 5)));
  };
  const before = tf.memory().numTensors;
  try {
    const [out] = await inferInMicroBatches(data, { microBatchSize: 3, maxTokenLen: null }, (micro) => {
      events.push(`record ${k}`);
      // each row's first response token id, as a float, tagged with its micro-batch
      const t = tf.tensor2d(Float32Array.from(column(micro, "responses").data as Int32Array), [micro.length, 4]);
      (t as unknown as { micro: number }).micro = k++;
      return [t];
    });
    assert.deepEqual(Array.from(out!.data as Float32Array), Array.from(column(data, "responses").data as Int32Array), "rows in their places");
  } finally {
    proto.data = data0;
  }
  assert.equal(tf.memory().numTensors, before, "no micro-batch output left alive");
  // three micro-batches (3 + 3 + 1 rows): the second and third are recorded before the first and second reads are taken
  assert.deepEqual(events, ["record 0", "record 1", "read 0", "record 2", "read 1", "read 2"]);
});

test("inferInMicroBatches frees a recorded micro-batch when a later one throws", async () => {
  await initBackend("cpu");
  const data = syntheticBatch(6, 3, 4, 32, 6);
  const before = tf.memory().numTensors;
  let k = 0;
  await assert.rejects(inferInMicroBatches(data, { microBatchSize: 2, maxTokenLen: null }, () => {
    if (k++ === 1) throw new Error("micro-batch 1 failed");
    return [tf.zeros([2, 4])];
  }), /micro-batch 1 failed/);
  assert.equal(tf.memory().numTensors, before);
});
