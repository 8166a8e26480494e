// A recorded step replayed (src/engine/webgpu_replay.ts): the uniform layout is tfjs's own, a replay
// runs the recorded dispatches with the marked uniforms advanced, the intermediates it reads stay
// its own while other work allocates between replays, and a step that is not a pure sequence of
// dispatches is refused (and still computed). Runs where a WebGPU adapter exists (llvmpipe here).
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { webgpuOrReason } from "./webgpu_adapter.js";
import { advancing, isRefusal, packUniforms, ReadBackRing, RecordedStep, bufferOf, submitRecorded, type ReplayBackend, type SteppedUniform } from "../../src/engine/webgpu_replay.js";

interface Program { variableNames: string[]; outputShape: number[]; shaderKey: string; dispatchLayout: { x: number[] }; dispatch: [number, number, number]; workgroupSize: [number, number, number]; size: boolean; uniforms: string; getUserCode(): string }

/** acc[i] = acc[i] + x[i] * 2 + uniforms.v (in place: acc is the output and is read through `result`). */
function accumulate(n: number): Program {
  return {
    variableNames: ["x"], outputShape: [n], shaderKey: "verlTestAccumulate", dispatchLayout: { x: [0] },
    dispatch: [Math.ceil(n / 64), 1, 1], workgroupSize: [64, 1, 1], size: true, uniforms: "v : i32,",
    getUserCode: () => `
      fn main(index : i32) {
        if (index < uniforms.size) { result[index] = result[index] + x[index] * 2.0 + f32(uniforms.v); }
      }`,
  };
}

type Run = (p: Program, inputs: tf.TensorInfo[], dtype: string, uniforms?: SteppedUniform[], output?: tf.TensorInfo) => tf.TensorInfo;

test("tfjs's uniform layout: packUniforms writes the bytes tfjs's makeUniforms writes", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const be = tf.backend() as unknown as ReplayBackend & { queue: { writeBuffer(...a: unknown[]): void } };
  const cases: SteppedUniform[][] = [
    [{ type: "int32", data: [7] }],
    [{ type: "float32", data: [NaN] }, { type: "float32", data: [Infinity] }, { type: "int32", data: [3, 4] }, { type: "int32", data: [4, 1] }, { type: "int32", data: [12] }],
    [{ type: "int32", data: [1, 2, 3] }, { type: "uint32", data: [9] }, { type: "float32", data: [0.5, 1.5, 2.5, 3.5] }, { type: "int32", data: [5] }],
    [{ type: "int32", data: [1, 2, 3, 4, 5] }, { type: "int32", data: [6] }, { type: "int32", data: [1, 2, 3, 4, 5, 6] }, { type: "float32", data: [2] }, { type: "int32", data: [1, 2] }],
    [{ type: "int32", data: [] }, { type: "uint32", data: [4294967295] }, { type: "float32", data: [-1e-7] }],
  ];
  const write = be.queue.writeBuffer;
  try {
    for (const values of cases) {
      let tfjs: Uint8Array | undefined;
      be.queue.writeBuffer = (...a: unknown[]) => {
        const [data, dOff = 0, size] = a.slice(2) as [ArrayBuffer, number?, number?];         tfjs = new Uint8Array(data.slice(dOff, dOff + (size ?? data.byteLength)));
      };
      const r = be.makeUniforms(values.map((v) => ({ ...v, data: [...v.data] })));
      be.queue.writeBuffer = write;
      const ours = new Uint8Array(packUniforms(values).bytes);
      assert.deepEqual(ours, tfjs, JSON.stringify(values));
      assert.equal(r.size, ours.byteLength);
    }
  } finally {
    be.queue.writeBuffer = write;
    submitRecorded(be); // the uniform buffers tfjs took go back to its pool
  }
});

test("advancing marks int32/uint32 scalars only", () => {
  assert.deepEqual(advancing({ type: "int32", data: [3] }), { type: "int32", data: [3], perStep: 1 });
  assert.throws(() => advancing({ type: "float32", data: [1] }), /only int32\/uint32 scalars/);
  assert.throws(() => advancing({ type: "int32", data: [1, 2] }), /only int32\/uint32 scalars/);
});

test("a recorded step replays with its uniforms advanced, on intermediates kept its own while other work allocates", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const be = tf.backend() as unknown as ReplayBackend & { runWebGPUProgram: Run };
  const n = 1000, live = tf.memory().numTensors;
  const x = tf.range(0, n, 1, "float32"), acc = tf.zeros([n]);
  for (const v of [x, acc]) bufferOf(be, v.dataId); // on the device before the step (tfjs makes small tensors on the host)
  const step = () => tf.tidy(() => {
    // an intermediate freed inside the step: the replays read the buffer it had
    const y = tf.add(x, x);
    be.runWebGPUProgram(accumulate(n), [y], "float32", [advancing({ type: "int32", data: [10] })], acc);
  });
  const rec = RecordedStep.capture(be, step);
  assert.ok(!isRefusal(rec), isRefusal(rec) ? rec.reason : "");
  assert.equal(rec.dispatches, 2);
  assert.ok(rec.heldBytes >= n * 4, `kept ${rec.heldBytes} bytes`);
  const reader = new ReadBackRing(be.device, bufferOf(be, acc.dataId), n * 4);
  try {
    let last: Promise<ArrayBuffer> | undefined;
    for (let k = 1; k <= 4; k++) {
      last = rec.replay(k, reader);
      // other work between replays: tensors of y's size, which tfjs's pool would hand y's buffer to
      const others = Array.from({ length: 4 }, () => tf.fill([n], -1e6));
      await Promise.all(others.map((o) => o.data()));
      tf.dispose(others);
    }
    const got = new Float32Array(await last!);
    // five steps (the captured one and four replays) of 4x + (10 + k), k = 0..4
    for (const i of [0, 1, 499, 999]) assert.equal(got[i], 20 * i + (10 + 11 + 12 + 13 + 14), `element ${i}`);
  } finally {
    rec.dispose();
    reader.dispose();
  }
  assert.throws(() => rec.replay(5), /replayed after dispose/);
  tf.dispose([x, acc]);
  assert.equal(tf.memory().numTensors, live);
});

test("a step that uploads host values or keeps too much is refused, and still computed", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const be = tf.backend() as unknown as ReplayBackend & { runWebGPUProgram: Run };
  const n = 256, live = tf.memory().numTensors, acc = tf.zeros([n]);
  bufferOf(be, acc.dataId);
  const upload = RecordedStep.capture(be, () => tf.tidy(() => {
    be.runWebGPUProgram(accumulate(n), [tf.tensor1d(new Float32Array(n).fill(1))], "float32", [{ type: "int32", data: [1] }], acc);
  }));
  assert.ok(isRefusal(upload) && /uploads host values \(a float32 \[256\] tensor\)/.test(upload.reason), JSON.stringify(upload));
  // read through a staging copy: tfjs's data() would answer from what it cached on the host
  const read = async () => { const r = new ReadBackRing(be.device, bufferOf(be, acc.dataId), 12); try { return Array.from(new Float32Array(await r.readNow(be))); } finally { r.dispose(); } };
  assert.deepEqual(await read(), [3, 3, 3]);
  const big = RecordedStep.capture(be, () => tf.tidy(() => {
    be.runWebGPUProgram(accumulate(n), [tf.add(acc, acc)], "float32", [{ type: "int32", data: [1] }], acc);
  }), { maxHeldBytes: 16 });
  assert.ok(isRefusal(big) && /over the 0 MiB allowed/.test(big.reason), JSON.stringify(big));
  assert.deepEqual(await read(), [16, 16, 16]);
  acc.dispose();
  assert.equal(tf.memory().numTensors, live);
});
