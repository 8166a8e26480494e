import { test } from "node:test";
import assert from "node:assert/strict";
import {
  balanceBatchOrder, calculateWorkload, getReverseIdx, getSeqlenBalancedPartitions, karmarkarKarp, rearrangeMicroBatches,
} from "../../../src/trainer/ppo/seqlen_balancing.js";
import { randMat } from "./helpers.js";

function assertPartition(parts: number[][], n: number): void {
  assert.deepEqual(parts.flat().sort((a, b) => a - b), Array.from({ length: n }, (_, i) => i));
}

const sums = (parts: number[][], w: number[]) => parts.map((p) => p.reduce((a, i) => a + w[i]!, 0));

test("Karmarkar-Karp reproduces verl's partitions (outputs of verl's karmarkar_karp on the same inputs), ties included", () => {
  const golden: [number[], number, boolean, number[][]][] = [
    [[32, 20, 20, 20, 20, 20], 3, false, [[0, 1], [5, 2], [4, 3]]],
    [[20, 20, 6, 10, 20, 22], 3, true, [[0, 1], [3, 4], [2, 5]]],
    [[10, 34, 20, 41, 35, 20, 10, 10, 10, 20, 41, 11], 2, true, [[2, 1, 3, 5, 7, 0], [11, 4, 10, 9, 8, 6]]],
    [[20, 20, 20, 10, 39, 20, 20, 20], 2, false, [[3, 4, 5, 1], [0, 7, 6, 2]]],
    [[10, 10, 19, 20, 10, 20, 10, 22, 10], 8, false, [[7], [1, 0], [5], [3], [2], [8], [6], [4]]],
  ];
  for (const [w, k, eq, parts] of golden) assert.deepEqual(karmarkarKarp(w, k, eq), parts, JSON.stringify(w));
});

test("balanced partitions cover every index once, equal-size when asked, and beat contiguous chunks", () => {
  const lens = randMat(1, 64, 5, 20, 800)[0]!.map(Math.round);
  const w = lens.map(calculateWorkload);
  const parts = getSeqlenBalancedPartitions(w, 4, true);
  assertPartition(parts, 64);
  assert.ok(parts.every((p) => p.length === 16 && p.every((x, i) => i === 0 || p[i - 1]! < x)));
  const s = sums(parts, w);
  const chunks = sums([0, 1, 2, 3].map((r) => Array.from({ length: 16 }, (_, i) => r * 16 + i)), w);
  assert.ok(Math.max(...s) - Math.min(...s) < (Math.max(...chunks) - Math.min(...chunks)) / 10);
  assert.throws(() => getSeqlenBalancedPartitions([1, 2], 3, false), /cannot split 2 items into 3/);
  assert.throws(() => getSeqlenBalancedPartitions([1, 2, 3], 2, true), /divisible by 2/);
});

test("balanceBatchOrder: a permutation whose dp chunks are balanced; global_seqlen metrics", () => {
  const lens = [900, 10, 880, 15, 870, 12, 860, 20];
  const { order, metrics } = balanceBatchOrder(lens, 2);
  assertPartition([order], 8);
  const halves = [order.slice(0, 4), order.slice(4)].map((p) => p.reduce((a, i) => a + lens[i]!, 0));
  assert.deepEqual([metrics["global_seqlen/balanced_min"], metrics["global_seqlen/balanced_max"]], [Math.min(...halves), Math.max(...halves)]);
  assert.deepEqual([metrics["global_seqlen/min"], metrics["global_seqlen/max"]], [1762, 1805]);
  assert.equal(metrics["global_seqlen/mean"], lens.reduce((a, b) => a + b) / 2);
  assert.ok(metrics["global_seqlen/balanced_max"]! - metrics["global_seqlen/balanced_min"]! < metrics["global_seqlen/minmax_diff"]!);
  // Per mini-batch balancing keeps each mini-batch's rows within it.
  const mb = balanceBatchOrder(lens, 2, { miniBatchSize: 4 });
  assertPartition([mb.order], 8);
  const rank0 = mb.order.slice(0, 4);
  assert.equal(rank0.filter((i) => i < 4).length, 2);
});

test("rearrangeMicroBatches: ⌈tokens/budget⌉ micro-batches (at least minNumMicroBatch), lightest at both ends", () => {
  const lens = [100, 300, 250, 50, 400, 120, 80, 310];
  const parts = rearrangeMicroBatches(lens, 512);
  assert.equal(parts.length, Math.ceil(1610 / 512));
  assertPartition(parts, 8);
  const w = sums(parts, lens.map(calculateWorkload));
  const heaviest = w.indexOf(Math.max(...w));
  assert.ok(heaviest > 0 && heaviest < w.length - 1, "heaviest micro-batch sits in the middle");
  assert.equal(rearrangeMicroBatches(lens, 512, { minNumMicroBatch: 6 }).length, 6);
  assert.equal(rearrangeMicroBatches(lens, 4096, { numBatchesDividedBy: 3 }).length, 3);
  assert.throws(() => rearrangeMicroBatches(lens, 300), /must be at least the sequence length \(400\)/);
  assert.throws(() => rearrangeMicroBatches(lens, 512, { maxSeqLen: 1024 }), /\(1024\)/);
  const order = parts.flat();
  const back = getReverseIdx(order);
  assert.deepEqual(back.map((pos) => order[pos]), [0, 1, 2, 3, 4, 5, 6, 7]);
});
