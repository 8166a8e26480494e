import { test } from "node:test";
import assert from "node:assert/strict";
import { Worker } from "node:worker_threads";
import { once } from "node:events";
import { DataProto, tensor, type DataProtoPayload } from "../../src/protocol/index.js";

const moduleUrl = new URL("../../src/protocol/index.js", import.meta.url).href;

// A worker that rebuilds the DataProto, doubles `score`, adds a row tag and sends it back by transfer.
const workerSource = `
const { parentPort, workerData } = require("node:worker_threads");
import(workerData.moduleUrl).then(({ DataProto }) => {
  parentPort.on("message", (payload) => {
    const d = DataProto.fromTransfer(payload);
    const s = d.tensor("score").data;
    for (let i = 0; i < s.length; i++) s[i] *= 2;
    d.nonTensorBatch.seen = d.nonTensorBatch.uid.map((u) => u + "!");
    const shared = d.batch.shared;
    if (shared) shared.data[0] = 7;
    const { payload: out, transfer } = d.toTransfer();
    parentPort.postMessage(out, transfer);
  });
});
`;

async function roundTrip(d: DataProto): Promise<DataProto> {
  const w = new Worker(workerSource, { eval: true, workerData: { moduleUrl } });
  try {
    const { payload, transfer } = d.toTransfer();
    w.postMessage(payload, transfer);
    const [reply] = (await once(w, "message")) as [DataProtoPayload];
    return DataProto.fromTransfer(reply);
  } finally {
    await w.terminate();
  }
}

test("toTransfer moves buffers to a worker and back; values and meta survive", async () => {
  const d = DataProto.fromDict(
    { ids: tensor(Int32Array.from([1, 2, 3, 4]), [2, 2]), score: tensor(Float32Array.from([0.5, 1.5]), [2]) },
    { uid: ["a", "b"], reward_model: [{ style: "rule", ground_truth: "1" }, { style: "rule", ground_truth: "2" }] },
    { temperature: 0.7 },
  );
  const idsBefore = d.tensor("ids").data;
  const back = await roundTrip(d);
  assert.equal(idsBefore.length, 0, "the sender's buffer was moved (detached), not copied");
  assert.throws(() => d.checkConsistency(), /moved to another thread/);
  assert.deepEqual(Array.from(back.tensor("ids").data), [1, 2, 3, 4]);
  assert.ok(back.tensor("ids").data instanceof Int32Array);
  assert.deepEqual(Array.from(back.tensor("score").data), [1, 3]);
  assert.deepEqual(back.nonTensorBatch.seen, ["a!", "b!"]);
  assert.deepEqual(back.nonTensorBatch.reward_model, [{ style: "rule", ground_truth: "1" }, { style: "rule", ground_truth: "2" }]);
  assert.deepEqual(back.metaInfo, { temperature: 0.7 });
});

test("a view into a larger buffer is copied once so the parent stays intact", async () => {
  const big = new Float32Array([9, 9, 0.25, 0.75, 9]);
  const d = new DataProto({ score: { data: big.subarray(2, 4), shape: [2], dtype: "float32" } }, { uid: ["x", "y"] });
  const back = await roundTrip(d);
  assert.equal(big.length, 5, "parent buffer not detached");
  assert.deepEqual(Array.from(back.tensor("score").data), [0.5, 1.5]);
});

test("SharedArrayBuffer tensors are shared, not moved", async () => {
  const sab = new Int32Array(new SharedArrayBuffer(8));
  const d = new DataProto({ shared: { data: sab, shape: [2], dtype: "int32" }, score: tensor([1, 2], [2]) }, { uid: ["x", "y"] });
  const { transfer } = d.toTransfer();
  assert.equal(transfer.length, 1, "only the ordinary buffer is in the transfer list");
  const back = await roundTrip(new DataProto({ shared: { data: sab, shape: [2], dtype: "int32" }, score: tensor([1, 2], [2]) }, { uid: ["x", "y"] }));
  assert.equal(sab[0], 7, "the worker's write is visible here");
  assert.equal(back.tensor("shared").data[0], 7);
});

test("a tensor listed twice travels once", () => {
  const t = tensor([1, 2], [2]);
  const { transfer, payload } = new DataProto({ a: t, b: t }).toTransfer();
  assert.equal(transfer.length, 1);
  assert.equal(payload.batch.a!.data, payload.batch.b!.data);
});

test("fromTransfer rejects objects that are not payloads", () => {
  assert.throws(() => DataProto.fromTransfer({ batch: {} } as unknown as DataProtoPayload), /not a DataProto payload/);
});
