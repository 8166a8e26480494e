// The direct bucketed read-back and upload (src/engine/webgpu_transfer.ts) and the read-back's use by
// the optimizer's gradient reduce (FlatGradAccumulator.takeBucketsInto, dp_optimizer's bucket walk):
// the values tfjs gives, written in place, with no dispatch and no staging buffer made for an
// upload; runs where a WebGPU adapter exists
// (llvmpipe on this CPU machine), skips with the reason elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, webgpuOrReason } from "./webgpu_adapter.js";
import { canReadInto, canWriteDirect, readIntoBuckets, uploadStagingStats, uploadTensor } from "../../src/engine/webgpu_transfer.js";
import { FlatGradAccumulator } from "../../src/engine/optim/grad_utils.js";
import { Collective } from "../../src/single_controller/collective.js";
import { allReduceBuckets } from "../../src/workers/dp_optimizer.js";

const skip = await webgpuOrReason();
const gpu = { skip: skip || false };

test("readIntoBuckets: the tensor's values at their place in dst, every bucket size, no dispatch; the tensor may go at once", gpu, async () => {
  const n = 10_007, t = tf.tidy(() => tf.add(tf.range(0, n, 1, "float32"), 0.25));
  const want = await t.data() as Float32Array;
  for (const bucket of [1_000, 4_096, n, 50_000]) {
    const dst = new Float32Array(new SharedArrayBuffer((n + 13) * 4)).fill(-1);
    const copy = tf.tidy(() => tf.mul(t, 1));
    const counted = dispatches(() => readIntoBuckets(copy, dst, 5, bucket));
    copy.dispose();
    assert.equal(counted.n, 0, "buffer copies, no dispatch");
    assert.equal(counted.out.length, Math.ceil(n / bucket));
    await Promise.all(counted.out);
    assert.deepEqual(dst.subarray(5, 5 + n), want, `bucket ${bucket}: the values`);
    assert.ok(dst.subarray(0, 5).every((v) => v === -1) && dst.subarray(5 + n).every((v) => v === -1), `bucket ${bucket}: nothing written outside`);
  }
  const dst = new Float32Array(n);
  assert.throws(() => readIntoBuckets(t, dst, 1, 100), /10007 values do not fit at 1 of 10007/);
  assert.throws(() => readIntoBuckets(t, dst, 0, 0), /bucket must be a positive integer/);
  const ints = tf.tensor1d([1, 2], "int32");
  assert.equal(canReadInto(ints), false);
  process.env.VERL_WEBGPU_DIRECT_READ = "0";
  try { assert.equal(canReadInto(t), false, "VERL_WEBGPU_DIRECT_READ=0 turns it off"); } finally { delete process.env.VERL_WEBGPU_DIRECT_READ; }
  tf.dispose([t, ints]);
});

test("the gradient reduce with buckets read in place: the same values as through tfjs's reads, the accumulator reset, no tensor left", gpu, async () => {
  const vars = [tf.variable(tf.zeros([3, 1_000]), true, "rb_a"), tf.variable(tf.zeros([2_345]), true, "rb_b")];
  const fill = (acc: FlatGradAccumulator, seed: number) => {
    for (const k of [0, 1]) {
      const g = { rb_a: tf.randomNormal([3, 1_000], 0, 1, "float32", seed + k), rb_b: tf.randomNormal([2_345], 0, 1, "float32", seed + 10 + k) };
      acc.add(g);
      tf.dispose(Object.values(g));
    }
  };
  const one = Collective.single(), B = 1_024;
  const before = tf.memory().numTensors;
  const acc = new FlatGradAccumulator(vars), n = acc.numel;
  fill(acc, 1);
  const viaTfjs = new Float32Array(n + 2).fill(7);
  await allReduceBuckets(one, viaTfjs, acc.takeBuckets(B), B);
  fill(acc, 1);
  const inPlace = new Float32Array(n + 2).fill(7);
  const parts = acc.takeBucketsInto(inPlace, B);
  assert.ok(parts, "on WebGPU the buckets are read in place");
  assert.equal(acc.takeBucketsInto(inPlace, B), undefined, "nothing accumulated since: the caller takes the other path (zeros)");
  await allReduceBuckets(one, inPlace, parts!, B);
  assert.deepEqual(inPlace, viaTfjs, "the same values, the scalars past the gradient untouched");
  assert.equal(tf.memory().numTensors, before, "the accumulator's sum was freed");
  tf.dispose(vars);
});

test("uploadTensor: the values (from shared memory too), copied at the call, no staging buffer; VERL_WEBGPU_DIRECT_WRITE=0 goes through tfjs", gpu, async () => {
  const device = (tf.backend() as unknown as { device: { createBuffer(d: { size: number; usage: number }): unknown } }).device;
  const create = device.createBuffer.bind(device);
  let mapWrite = 0;
  device.createBuffer = (d) => { if (d.usage & 0x2) mapWrite++; return create(d); };
  try {
    const values = new Float32Array(new SharedArrayBuffer(4 * 3 * 777)).map((_, i) => i * 0.5 - 100);
    const want = values.slice();
    const t = uploadTensor(values.subarray(0, 3 * 777), [3, 777]);
    values.fill(0);
    assert.deepEqual(t.shape, [3, 777]);
    assert.deepEqual(await t.data(), want, "the values as they were at the call");
    assert.equal(mapWrite, 0, "no MAP_WRITE staging buffer");
    const sum = tf.sum(t);
    assert.equal((await sum.data())[0], want.reduce((a, b) => a + b, 0), "usable by kernels");
    assert.throws(() => uploadTensor(want, [3, 776]), /2331 values for shape \[3,776\]/);
    process.env.VERL_WEBGPU_DIRECT_WRITE = "0";
    try {
      assert.equal(canWriteDirect(), false);
      const viaTfjs = uploadTensor(want, [3, 777]);
      assert.deepEqual(await viaTfjs.data(), want);
      viaTfjs.dispose();
    } finally { delete process.env.VERL_WEBGPU_DIRECT_WRITE; }
    tf.dispose([t, sum]);
  } finally {
    device.createBuffer = create;
  }
});

test("uploadTensor through kept staging (VERL_WEBGPU_UPLOAD_STAGING_MB): the values, size classes, past the cap by writeBuffer, the buffers mapped again and reused", gpu, async () => {
  process.env.VERL_WEBGPU_UPLOAD_STAGING_MB = "40";
  const settle = async (want: number) => {
    for (let k = 0; k < 200 && uploadStagingStats().readyBuffers < want; k++) await new Promise((r) => setTimeout(r, 10));
  };
  const roundTrip = async (n: number, shared: boolean, what: string) => {
    const values = new Float32Array(shared ? new SharedArrayBuffer(4 * n) : new ArrayBuffer(4 * n)).map((_, i) => (i % 4099) - 2000.5);
    const want = values.slice();
    const t = uploadTensor(values, [n]);
    values.fill(0);
    assert.deepEqual(await t.data(), want, `${what}: the values as they were at the call`);
    t.dispose();
  };
  try {
    const base = uploadStagingStats().madeBytes;
    assert.equal(base, 0, "nothing made before");
    for (const [round, shared] of [[0, false], [1, true], [2, false]] as const) {
      // 36 MiB: chunks of 16, 16 and 4 MiB, all staged under the 40 MiB cap; made once, then reused
      await roundTrip(9 << 20, shared, `36 MiB, round ${round}`);
      await settle(3);
      assert.deepEqual(uploadStagingStats(), { madeBytes: 36 << 20, readyBuffers: 3, readyBytes: 36 << 20 }, `round ${round}`);
    }
    // 3 MiB: the 4 MiB buffer again; 5 MiB would need an 8 MiB one past the cap: by writeBuffer
    await roundTrip(3 << 18, false, "3 MiB");
    await roundTrip(5 << 18, true, "5 MiB past the cap");
    await settle(3);
    assert.deepEqual(uploadStagingStats(), { madeBytes: 36 << 20, readyBuffers: 3, readyBytes: 36 << 20 });
    // under 256 KiB: writeBuffer, nothing taken
    await roundTrip(1000, false, "4 KB");
    assert.equal(uploadStagingStats().madeBytes, 36 << 20);
  } finally { delete process.env.VERL_WEBGPU_UPLOAD_STAGING_MB; }
});
