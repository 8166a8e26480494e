import { test } from "node:test";
import assert from "node:assert/strict";
import { Rng } from "../../src/utils/rng.js";

test("same seed gives the same stream; state round-trips", () => {
  const a = new Rng(42), b = new Rng(42);
  const xs = Array.from({ length: 5 }, () => a.nextU32());
  assert.deepEqual(xs, Array.from({ length: 5 }, () => b.nextU32()));
  const st = a.getState();
  const next = a.random();
  const c = new Rng(st);
  assert.equal(c.random(), next);
  assert.notDeepEqual(new Rng(1).permutation(10), new Rng(2).permutation(10));
});

test("uniform floats lie in [0,1) with a mean near 0.5", () => {
  const r = new Rng(7);
  let s = 0;
  for (let i = 0; i < 10000; i++) { const x = r.random(); assert.ok(x >= 0 && x < 1); s += x; }
  assert.ok(Math.abs(s / 10000 - 0.5) < 0.02);
});
