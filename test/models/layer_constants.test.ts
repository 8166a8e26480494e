// The kept constants of engine/constants.ts in the Llama forward (rotary tables, attention biases,
// packing gathers cached per micro-batch; rotate_half and scalars kept per backend): forward/backward
// steps over changing masks, positions and packings, some repeating, give the same bits as tables made
// afresh, and the live tensor count stays flat once the cache is full. Runs on the cpu backend.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { CACHE_ENTRIES, cachedTensors, clearConstants, constantStats, constScalar } from "../../src/engine/constants.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { Rng } from "../../src/utils/rng.js";

await tf.setBackend("cpu");

const B = 2, T = 7;

/** Step k's inputs: a left/right-padded mask (k < 100; positions given from 40), or packed sequences with restarting positions (k >= 100). */
function inputsOf(k: number): { ids: tf.Tensor2D; opts: Parameters<LlamaModel["forward"]>[1] } {
  const rng = new Rng(k + 1);
  if (k >= 100) {
    const lengths = [1 + (k % 5), 2 + ((k >> 2) % 4), 3];
    const N = lengths.reduce((a, b) => a + b, 0);
    const positionIds = lengths.flatMap((n) => [...Array(n).keys()]);
    return { ids: tf.tensor2d([Array.from({ length: N }, () => 1 + rng.int(30))], [1, N], "int32"), opts: { segments: lengths, positionIds } };
  }
  // k in [40, 100): the mask of k - 40 with positions 0..T-1 given (the bias must follow the mask, not the positions)
  const given = k >= 40, mk = given ? k - 40 : k, mask: number[] = [];
  for (let b = 0; b < B; b++) {
    const left = (mk >> (2 * b)) % 4, right = (mk >> 4) % 2; // distinct for k < 32
    for (let t = 0; t < T; t++) mask.push(t >= left && t < T - right ? 1 : 0);
  }
  return { ids: tf.tensor2d(Array.from({ length: B * T }, () => 1 + rng.int(30)), [B, T], "int32"), opts: { attentionMask: mask, ...(given ? { positionIds: Array.from({ length: B * T }, (_, i) => i % T) } : {}) } };
}

/** Loss and every gradient of one forward/backward step, as host arrays. */
function step(m: LlamaModel, k: number): Float32Array[] {
  const { ids, opts } = inputsOf(k);
  const vars = m.trainableVariables();
  const out = tf.tidy(() => {
    const { value, grads } = tf.variableGrads(() => tf.mean(tf.mul(tf.logSoftmax(m.forward(ids, opts)), -0.5)) as tf.Scalar, vars);
    return [value, ...vars.map((v) => grads[v.name]!)];
  });
  const host = out.map((t) => t.dataSync() as Float32Array);
  tf.dispose([...out, ids]);
  return host;
}

test("cached rotary tables and biases: the same bits as fresh ones, a flat tensor count, over changing masks and packings", () => {
  // sliding layers with their own rope (Gemma 3's layout): every table kind is made
  const cfg = makeConfig({
    vocabSize: 32, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 2, nKvHeads: 1, maxSeqLen: 32, ropeTheta: 1e6,
    slidingLayers: [true, false], slidingWindow: 3, localRope: { theta: 1e4, scaling: null },
  });
  const m = initModel(cfg, new Rng(5));
  // bits: new masks, repeats and packings mixed, each against tables made afresh
  const seq = [0, 1, 100, 0, 41, 2, 105, 100, 42, 1, 41, 3];
  const fresh = seq.map((k, i) => {
    clearConstants(); // every table made anew
    m.gradientCheckpointing = i % 2 === 1;
    return step(m, k);
  });
  clearConstants();
  seq.forEach((k, i) => {
    m.gradientCheckpointing = i % 2 === 1;
    step(m, k).forEach((a, j) => assert.deepEqual(a, fresh[i]![j], `step ${i} (inputs ${k}), ${j ? `gradient ${j}` : "loss"}: cached tables changed the bits`));
  });
  // tensor count: once the cache is full (CACHE_ENTRIES + 1 distinct masks), new masks evict old ones
  clearConstants();
  const counts: number[] = [];
  for (const [i, k] of [...[...Array(CACHE_ENTRIES + 1).keys()].map((j) => j + 10), 30, 10, 31, 29, 30, 5, 6].entries()) {
    m.gradientCheckpointing = i % 2 === 1;
    step(m, k);
    counts.push(tf.memory().numTensors);
    assert.ok(constantStats().entries <= CACHE_ENTRIES);
  }
  const flat = counts.slice(CACHE_ENTRIES);
  assert.ok(flat.every((n) => n === flat[0]), `tensor count moved after the warm-up: ${counts.join(", ")}`);
  m.dispose();
});

test("cachedTensors hands out clones, keeps at most CACHE_ENTRIES, evicts the least recently used", () => {
  clearConstants();
  let made = 0;
  const get = (key: string) => cachedTensors(key, () => { made++; return [tf.tensor1d([made, key.length])]; });
  const first = get("a");
  tf.dispose(first); // the caller's clone: the cached copy lives on
  const again = get("a");
  assert.deepEqual(again.map((t) => Array.from(t.dataSync())), [[1, 1]]);
  tf.dispose(again);
  assert.equal(made, 1);
  for (let i = 0; i < CACHE_ENTRIES; i++) tf.dispose(get(`k${i}`));
  assert.equal(constantStats().entries, CACHE_ENTRIES);
  tf.dispose(get("a")); // evicted by the CACHE_ENTRIES newer keys: made again
  assert.equal(made, CACHE_ENTRIES + 2);
  const before = tf.memory().numTensors;
  tf.dispose(get("k" + (CACHE_ENTRIES - 1)));
  assert.equal(tf.memory().numTensors, before);
  assert.equal(constScalar(0.5), constScalar(0.5));
  assert.notEqual(constScalar(0), constScalar(-0));
  clearConstants();
  assert.equal(constantStats().entries, 0);
});
