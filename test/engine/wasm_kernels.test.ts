import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { linear, matmul } from "../../src/engine/matmul.js";
import { Rng } from "../../src/utils/rng.js";

function randn(rng: Rng, n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.normal();
  return a;
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  assert.equal(a.length, b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** Run `f` on a backend and return the plain arrays of its outputs. */
async function on(backend: string, f: () => tf.Tensor[]): Promise<Float32Array[]> {
  await initBackend(backend);
  const outs = tf.tidy(f);
  const arrays = outs.map((t) => t.dataSync() as Float32Array);
  tf.dispose(outs);
  return arrays;
}

test("UnsortedSegmentSum on wasm matches cpu, including repeated and out-of-range ids", async () => {
  const rng = new Rng(1);
  const x = randn(rng, 7 * 5);
  const ids = new Int32Array([3, 0, 3, 9, 1, -1, 3]);
  const run = () => [tf.unsortedSegmentSum(tf.tensor2d(x, [7, 5]), tf.tensor1d(ids, "int32"), 6)];
  const [cpu] = await on("cpu", run);
  const [wasm] = await on("wasm", run);
  assert.deepEqual(tf.tidy(() => tf.unsortedSegmentSum(tf.tensor2d(x, [7, 5]), tf.tensor1d(ids, "int32"), 6).shape), [6, 5]);
  assert.ok(maxAbsDiff(cpu!, wasm!) < 1e-6);
  // Row 3 collects three rows; rows 2, 4 and 5 get nothing.
  for (let j = 0; j < 5; j++) {
    assert.ok(Math.abs(wasm![3 * 5 + j]! - (x[j]! + x[2 * 5 + j]! + x[6 * 5 + j]!)) < 1e-6);
    assert.equal(wasm![2 * 5 + j], 0);
  }
});

test("the gradient of an embedding lookup works on wasm and matches cpu", async () => {
  const rng = new Rng(2);
  const table = randn(rng, 11 * 4);
  const idx = new Int32Array([1, 5, 5, 10, 0, 1]);
  const up = randn(rng, 6 * 4);
  const run = () => {
    const t = tf.tensor2d(table, [11, 4]);
    const g = tf.grad((tab: tf.Tensor) => tf.sum(tf.mul(tf.gather(tab, tf.tensor1d(idx, "int32")), tf.tensor2d(up, [6, 4]))))(t);
    return [g];
  };
  const [cpu] = await on("cpu", run);
  const [wasm] = await on("wasm", run);
  assert.ok(maxAbsDiff(cpu!, wasm!) < 1e-6);
});

test("linear and matmul give tfjs's values and gradients on wasm", async () => {
  const rng = new Rng(3);
  const x = randn(rng, 2 * 3 * 8), w = randn(rng, 5 * 8), b = randn(rng, 8 * 6), up = randn(rng, 2 * 3 * 5);
  const ours = () => {
    const f = (xs: tf.Tensor, ws: tf.Tensor) => tf.sum(tf.mul(linear(xs, ws as tf.Tensor2D), tf.tensor3d(up, [2, 3, 5])));
    const { value, grads } = tf.valueAndGrads(f)([tf.tensor3d(x, [2, 3, 8]), tf.tensor2d(w, [5, 8])]);
    const m = (a: tf.Tensor, bb: tf.Tensor) => tf.sum(tf.square(matmul(a as tf.Tensor2D, bb as tf.Tensor2D)));
    const mg = tf.grads(m)([tf.tensor2d(x, [6, 8]), tf.tensor2d(b, [8, 6])]);
    return [value, ...grads, ...mg];
  };
  const reference = () => {
    const f = (xs: tf.Tensor, ws: tf.Tensor) =>
      tf.sum(tf.mul(tf.matMul(xs.reshape([6, 8]) as tf.Tensor2D, ws as tf.Tensor2D, false, true).reshape([2, 3, 5]), tf.tensor3d(up, [2, 3, 5])));
    const { value, grads } = tf.valueAndGrads(f)([tf.tensor3d(x, [2, 3, 8]), tf.tensor2d(w, [5, 8])]);
    const m = (a: tf.Tensor, bb: tf.Tensor) => tf.sum(tf.square(tf.matMul(a as tf.Tensor2D, bb as tf.Tensor2D)));
    const mg = tf.grads(m)([tf.tensor2d(x, [6, 8]), tf.tensor2d(b, [8, 6])]);
    return [value, ...grads, ...mg];
  };
  const got = await on("wasm", ours);
  const want = await on("cpu", reference);
  for (let i = 0; i < got.length; i++) assert.ok(maxAbsDiff(got[i]!, want[i]!) < 1e-4, `output ${i}`);
});

test("BatchMatMul on wasm (sliced XNNPACK) matches cpu for transposes, batches, broadcasting and rank 4", async () => {
  const rng = new Rng(4);
  const cases: [number[], number[], boolean, boolean][] = [
    [[3, 5, 4], [3, 4, 6], false, false],
    [[3, 4, 5], [3, 4, 6], true, false],
    [[3, 5, 4], [3, 6, 4], false, true],
    [[3, 4, 5], [3, 6, 4], true, true],
    [[5, 4], [3, 4, 6], false, false],
    [[2, 3, 5, 4], [2, 3, 4, 6], false, false],
    [[1, 5, 4], [3, 4, 6], false, false],
    [[2, 1, 5, 4], [1, 3, 4, 6], false, false], // general broadcasting: the stock kernel
    [[7, 4], [6, 4], false, true],
  ];
  for (const [sa, sb, ta, tb] of cases) {
    const a = randn(rng, sa.reduce((x, y) => x * y, 1)), b = randn(rng, sb.reduce((x, y) => x * y, 1));
    const run = () => [tf.matMul(tf.tensor(a, sa), tf.tensor(b, sb), ta, tb)];
    const [cpu] = await on("cpu", run);
    const [wasm] = await on("wasm", run);
    assert.ok(maxAbsDiff(cpu!, wasm!) < 1e-4, `${sa} x ${sb} ${ta} ${tb}`);
  }
  await initBackend("wasm");
  assert.throws(() => tf.matMul(tf.ones([2, 3, 4]), tf.ones([2, 5, 6])), /inner shapes \(4\) and \(5\)/);
});

test("Slice on wasm (in-place heap reads) matches cpu for contiguous, strided and rank-5 slices", async () => {
  const rng = new Rng(5);
  const cases: [number[], number[], number[]][] = [
    [[7, 5], [2, 1], [3, 3]],
    [[7, 5], [2, 0], [3, -1]],
    [[4, 6, 8], [1, 2, 0], [2, 3, 8]],
    [[4, 6, 8], [0, 0, 3], [-1, -1, 2]],
    [[3, 4, 5, 6], [1, 0, 2, 1], [2, 4, 2, 4]],
    [[2, 3, 4, 5, 6], [1, 1, 0, 2, 0], [1, 2, 4, 3, 6]],
    [[10], [3], [4]],
  ];
  for (const [shape, begin, size] of cases) {
    const x = randn(rng, shape.reduce((a, b) => a * b, 1));
    const run = () => [tf.slice(tf.tensor(x, shape), begin, size), tf.split(tf.tensor(x, shape), [1, shape[shape.length - 1]! - 1], -1)[1]!];
    const cpu = await on("cpu", run);
    const wasm = await on("wasm", run);
    cpu.forEach((c, i) => assert.deepEqual(Array.from(wasm[i]!), Array.from(c), `${shape} ${begin} ${size} #${i}`));
  }
  const ints = () => [tf.slice(tf.tensor2d([[1, 2, 3], [4, 5, 6]], [2, 3], "int32"), [0, 1], [2, 2])];
  assert.deepEqual(Array.from((await on("wasm", ints))[0]!), [2, 3, 5, 6]);
});

test("Concat on wasm matches cpu on every axis, with narrow and wide pieces", async () => {
  const rng = new Rng(6);
  const cases: [number[][], number][] = [
    [[[5, 3], [5, 4]], 1],
    [[[2, 3, 4], [2, 5, 4], [2, 1, 4]], 1],
    [[[3, 70], [3, 2]], 1],
    [[[3, 4], [2, 4]], 0],
    [[[2, 3, 4], [2, 3, 0], [2, 3, 1]], -1],
  ];
  for (const [shapes, axis] of cases) {
    const xs = shapes.map((s) => randn(rng, s.reduce((a, b) => a * b, 1)));
    const run = () => [tf.concat(xs.map((x, i) => tf.tensor(x, shapes[i]!)), axis)];
    const [cpu] = await on("cpu", run);
    const [wasm] = await on("wasm", run);
    assert.deepEqual(Array.from(wasm!), Array.from(cpu!), `${JSON.stringify(shapes)} axis ${axis}`);
  }
});
