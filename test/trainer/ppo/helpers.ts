// Shared test helpers for the algorithm tests: backend set-up, comparisons, matrices.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.js";
import { sharedPath } from "../../../src/utils/paths.js";

export type Mat = number[][];

export async function cpu(): Promise<void> {
  await initBackend("cpu");
}

export function close(actual: number, expected: number, tol = 1e-5, what = ""): void {
  const ok = Number.isNaN(expected) ? Number.isNaN(actual) : Math.abs(actual - expected) <= tol * Math.max(1, Math.abs(expected));
  assert.ok(ok, `${what} expected ${expected}, got ${actual} (tol ${tol})`);
}

export function closeAll(actual: ArrayLike<number>, expected: ArrayLike<number>, tol = 1e-5, what = ""): void {
  assert.equal(actual.length, expected.length, `${what} length`);
  for (let i = 0; i < expected.length; i++) close(actual[i]!, expected[i]!, tol, `${what}[${i}]`);
}

export function t2(m: Mat): tf.Tensor2D {
  return tf.tensor2d(m, [m.length, m[0]?.length ?? 0], "float32");
}

export function flat(m: Mat): number[] {
  return m.flat();
}

export function read(t: tf.Tensor): number[] {
  return Array.from(t.dataSync());
}

export function scalar(t: tf.Tensor | number): number {
  return typeof t === "number" ? t : t.dataSync()[0]!;
}

/** test-vectors.json from ../shared, or undefined (the test skips). */
export function testVectors(): Record<string, unknown> | undefined {
  const p = sharedPath("reference", "test-vectors.json");
  return p ? (JSON.parse(readFileSync(p, "utf8")) as Record<string, unknown>) : undefined;
}

/** A deterministic pseudo-random matrix (LCG), values in [lo, hi). */
export function randMat(rows: number, cols: number, seed: number, lo = -1, hi = 1): Mat {
  let s = seed >>> 0;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
  return Array.from({ length: rows }, () => Array.from({ length: cols }, () => lo + (hi - lo) * next()));
}

/** Central finite difference of f at x (float64), element by element. */
export function finiteDiff(f: (x: Mat) => number, x: Mat, h = 1e-5): Mat {
  return x.map((row, i) => row.map((_, j) => {
    const plus = x.map((r) => [...r]), minus = x.map((r) => [...r]);
    plus[i]![j]! += h;
    minus[i]![j]! -= h;
    return (f(plus) - f(minus)) / (2 * h);
  }));
}
