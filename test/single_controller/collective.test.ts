import { test } from "node:test";
import assert from "node:assert/strict";
import { ClassWithInitArgs, Collective, WorkerError, WorkerGroup, type ReduceOp } from "../../src/single_controller/index.js";
import { createCollectiveBuffers, reduceSegment } from "../../src/single_controller/collective.js";
import { rankValues, type EchoWorker } from "./fixtures/workers.js";
import { fixture, withPool } from "./helpers.js";

const echo = () => new ClassWithInitArgs(fixture("workers"), "EchoWorker");

/** The reduction in rank order, in float64, rounded once: what every rank must get bit for bit. */
function reference(world: number, n: number, op: ReduceOp): Float32Array {
  const inputs = Array.from({ length: world }, (_, r) => rankValues(r, n));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let acc = inputs[0]![i]!;
    for (let r = 1; r < world; r++) {
      const v = inputs[r]![i]!;
      acc = op === "max" ? Math.max(acc, v) : op === "min" ? Math.min(acc, v) : acc + v;
    }
    out[i] = op === "mean" ? acc / world : acc;
  }
  return out;
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

for (const world of [1, 2, 4]) {
  test(`allReduce on ${world} rank(s): every rank gets the rank-order reduction bit for bit, through a small scratch buffer`, async () => {
    await withPool({ worldSize: world, chunkElems: 1000 }, async (pool) => {
      const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
      for (const n of [0, 1, 7, 2503]) {
        for (const op of ["sum", "mean", "max", "min"] as ReduceOp[]) {
          const results = (await wg.reduceValues(n, op)) as Float32Array[];
          const want = reference(world, n, op);
          results.forEach((got, r) => assert.ok(bits(got).equals(bits(want)), `world ${world}, n ${n}, ${op}, rank ${r}`));
        }
      }
      if (world === 1) {
        const [own] = (await wg.reduceValues(2503, "mean")) as Float32Array[];
        assert.ok(bits(own!).equals(bits(rankValues(0, 2503))), "one rank's mean is its own buffer");
      }
      const f64 = (await wg.reduceF64([1e-17, 1, 3], "sum")) as Float64Array[];
      const want64 = [1e-17, 1, 3].map((v) => {
        let acc = v;
        for (let r = 1; r < world; r++) acc += v * (r + 1);
        return acc;
      });
      for (const got of f64) assert.deepEqual([...got], want64);
    }, 20_000);
  });
}

test("the reduction kernel matches the rank-order reference for every world size (unrolled and generic paths)", () => {
  const n = 37;
  for (const world of [2, 3, 4, 5, 7]) {
    for (const op of ["sum", "mean", "max", "min"] as ReduceOp[]) {
      const view = new Float32Array((world + 1) * n);
      for (let r = 0; r < world; r++) view.set(rankValues(r, n), r * n);
      // Two segments, as two ranks would reduce them.
      reduceSegment(view, n, world, world * n, 0, 20, op);
      reduceSegment(view, n, world, world * n, 20, n, op);
      assert.ok(bits(view.subarray(world * n)).equals(bits(reference(world, n, op))), `world ${world} ${op}`);
    }
  }
});

test("broadcast (any typed array, through chunks), barriers, and a driver-side single-rank collective", async () => {
  await withPool({ worldSize: 2, chunkElems: 1000 }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const got = (await wg.broadcastFrom(1, 5000)) as Int32Array[];
    const want = Int32Array.from({ length: 5000 }, (_, i) => i * 7 + 100000);
    for (const g of got) assert.deepEqual(g, want);
    assert.deepEqual(await wg.barriers(300), [300, 300]);
  });
  const solo = Collective.single();
  const buf = Float32Array.of(1, 2);
  solo.allReduce(buf, "mean");
  solo.barrier();
  assert.deepEqual([...buf], [1, 2]);
  assert.throws(() => solo.allReduce(new Int32Array(2) as unknown as Float32Array), /Float32Array or a Float64Array/);
  assert.throws(() => solo.allReduce(buf, "prod" as ReduceOp), /op must be one of sum, mean, max, min/);
  assert.throws(() => createCollectiveBuffers(2, { chunkElems: 3 }), /chunkElems must be an even integer/);
});

test("a rank that never arrives: the collective times out naming it, and the group recovers", async () => {
  await withPool({ worldSize: 2, timeoutMs: 1000 }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const t0 = Date.now();
    await assert.rejects(wg.barrierExcept(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerError);
      assert.equal(e.rank, 0);
      assert.match(e.message, /collective barrier timed out after 1 s on rank 0 in 'barrierExcept': ranks \[1\] did not arrive/);
      return true;
    });
    assert.ok(Date.now() - t0 < 5000);
    assert.deepEqual(await wg.barriers(3), [3, 3]);
    assert.deepEqual((await wg.reduceF64([1], "sum")) as Float64Array[], [Float64Array.of(3), Float64Array.of(3)]);
  });
});

test("mismatched collectives and collectives in a rank-zero-only call fail clearly", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    await assert.rejects(wg.mismatched().get(), /ranks disagree on the operation or its length \(rank 0: allReduce sum float32 of 4; rank 1: allReduce sum float32 of 5\)/);
    await assert.rejects(wg.barrierOnRankZero().get(), /runs on 1 of 2 ranks \(execute mode RANK_ZERO\); collectives need every rank/);
    assert.deepEqual(await wg.barriers(2), [2, 2]);
  });
});

test("a rank that throws before a collective releases its peers at once (no timeout wait)", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const t0 = Date.now();
    await assert.rejects(wg.failBeforeAllReduce(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerError);
      assert.equal(e.rank, 1);
      assert.match(e.message, /failBeforeAllReduce failed on rank 1: Error: rank 1 gave up before allReduce/);
      assert.match(e.message, /also rank 0: .*collective allReduce aborted on rank 0 in 'failBeforeAllReduce': rank 1 failed/);
      return true;
    });
    assert.ok(Date.now() - t0 < 5000, "released well before the 120 s default timeout");
    assert.deepEqual(await wg.barriers(1), [1, 1]);
  }, 15_000);
});
