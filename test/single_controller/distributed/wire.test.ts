// Frames between hosts: typed arrays travel as raw bytes (each decoded into its own
// buffer, movable to a thread), everything else as the v8 format; DataProto payloads survive.
import { test } from "node:test";
import assert from "node:assert/strict";
import { DataProto, tensor } from "../../../src/protocol/index.js";
import { encodeFrame, decodeFrame } from "../../../src/single_controller/distributed/wire.js";

test("a DataProto payload crosses as bytes and comes back equal", () => {
  const x = Float32Array.from({ length: 1000 }, (_, i) => i / 7);
  const ids = Int32Array.from({ length: 1000 }, (_, i) => i * 3 - 500);
  const dp = DataProto.fromDict({ x: tensor(x, [100, 10]), ids: tensor(ids, [100, 10]) }, { tag: Array.from({ length: 100 }, (_, i) => `row${i}`) }, { step: 3 });
  const { payload } = dp.clone().toTransfer();
  const frame = encodeFrame({ t: "task", id: 7 }, { args: [payload, new Float64Array([1.5, 2.5]), new Map([["k", 1]])] });
  // Raw bytes, not JSON: the frame is barely bigger than the tensors themselves.
  assert.ok(frame.length < 4000 + 4000 + 3000, `frame of ${frame.length} bytes`);
  const back = decodeFrame<{ t: string; id: number }>(frame);
  assert.deepEqual(back.head, { t: "task", id: 7 });
  const v = back.value as { args: [typeof payload, Float64Array, Map<string, number>] };
  const got = DataProto.fromTransfer(v.args[0]);
  assert.deepEqual([...got.tensor("x").data], [...x]);
  assert.deepEqual([...got.tensor("ids").data], [...ids]);
  assert.equal(got.nonTensorBatch.tag![42], "row42");
  assert.deepEqual(got.metaInfo, { step: 3 });
  assert.deepEqual([...v.args[1]], [1.5, 2.5]);
  assert.equal(v.args[2].get("k"), 1);
  assert.equal(back.buffers.length, 2, "the two tensors arrive in buffers of their own");
  for (const b of back.buffers) assert.ok(b.byteLength === 4000);
});

test("a truncated frame is an error, not garbage", () => {
  const frame = encodeFrame({ t: "x" }, new Float32Array(1000));
  assert.throws(() => decodeFrame(frame.subarray(0, frame.length - 100)), /truncated/);
  assert.throws(() => decodeFrame(Buffer.alloc(2)), /too short/);
});
