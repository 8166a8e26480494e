// The collectives' direct path (src/single_controller/collective.ts): a buffer in the rank's shared
// region is reduced where it lies (one barrier, each rank its own slice, reading every region in rank
// order), reduce-scattered, gathered from the owners' regions, and reduced with the optimizer's
// scale and squares folded in. Bit for bit what the chunked path gives (and the optimizer's old
// passes), over world sizes 2-4, odd lengths, offsets, sum/mean/max/min; ranks that disagree fall
// back together; a rank that fails or never comes releases the others; the region's limit.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClassWithInitArgs, Collective, WorkerError, WorkerGroup, type ReduceOp, type ResourcePool } from "../../src/single_controller/index.js";
import { createCollectiveBuffers, directMaxBytes, MAX_DIRECT_REGION_BYTES } from "../../src/single_controller/collective.js";
import { shardBounds } from "../../src/engine/optim/grad_utils.js";
import type { BothResult, ScaledResult } from "./fixtures/direct_worker.js";
import { rankValues } from "./fixtures/workers.js";
import { gatherValue } from "./fixtures/shard_worker.js";
import { fixture, withPool } from "./helpers.js";

type Wg = Record<string, (...a: unknown[]) => Promise<unknown>>;
const directWorker = (pool: ResourcePool) => WorkerGroup.create(pool, new ClassWithInitArgs(fixture("direct_worker"), "DirectWorker")) as unknown as Promise<Wg>;
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("hex");

/** The rank-order reduction in float64, rounded once (collective.test.ts's reference). */
function reference(world: number, n: number, op: ReduceOp, seed: number): Float32Array {
  const inputs = Array.from({ length: world }, (_, r) => rankValues(r, n, seed));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let acc = inputs[0]![i]!;
    for (let r = 1; r < world; r++) acc = op === "max" ? Math.max(acc, inputs[r]![i]!) : op === "min" ? Math.min(acc, inputs[r]![i]!) : acc + inputs[r]![i]!;
    out[i] = op === "mean" ? acc / world : acc;
  }
  return out;
}

for (const world of [2, 3, 4]) {
  test(`direct path on ${world} ranks: allReduce, reduceScatter, allGather and reduceScaled have the chunked path's bits`, async () => {
    // a small scratch (1000 elements a slot), so the chunked path takes several chunks
    await withPool({ worldSize: world, chunkElems: 1000 }, async (pool) => {
      const wg = await directWorker(pool);
      for (const n of [0, 1, 7, 2503, 10_007]) {
        for (const op of ["sum", "mean", "max", "min"] as ReduceOp[]) {
          const at = n % 2 === 0 ? 0 : 5;
          const res = (await wg.allReduceBoth!(n, op, at)) as BothResult[];
          const want = bits(reference(world, n, op, 2));
          for (const x of res) {
            assert.ok(x.regionShared, "the region is shared memory");
            assert.deepEqual(x.directCounts, { direct: 1, chunked: 0 }, `n ${n} ${op}: the region's op went direct`);
            assert.deepEqual(x.chunkedCounts, { direct: 0, chunked: 1 }, `n ${n} ${op}: the ordinary array's went through the scratch`);
            assert.equal(bits(x.direct), want, `world ${world}, n ${n}, ${op}, rank ${x.rank}: direct`);
            assert.equal(bits(x.chunked), want, `world ${world}, n ${n}, ${op}, rank ${x.rank}: chunked`);
          }
        }
      }
      const n = 10_007;
      const lumpy = Array.from({ length: world + 1 }, (_, r) => (r === world ? n - 4 : Math.min(n - 4, r * r * 1700)));
      for (const bounds of [shardBounds(n, world), lumpy, shardBounds(n - 3, world)]) {
        const res = (await wg.scatterBoth!(n, bounds, 3)) as BothResult[];
        for (const x of res) {
          assert.deepEqual(x.directCounts, { direct: 1, chunked: 0 });
          for (const [a, b] of [[bounds[x.rank]!, bounds[x.rank + 1]!], [bounds[world]!, n]] as const) {
            assert.equal(bits(x.direct.subarray(a, b)), bits(x.chunked.subarray(a, b)), `reduceScatter [${bounds}] rank ${x.rank} [${a}, ${b})`);
            assert.equal(bits(x.direct.subarray(a, b)), bits(reference(world, n, "sum", 4).subarray(a, b)));
          }
        }
        const gatherBounds = bounds.map((b, i) => (i === 0 ? 7 : Math.max(7, b)));
        for (const x of (await wg.gatherBoth!(n, gatherBounds, 1)) as BothResult[]) {
          assert.deepEqual(x.directCounts, { direct: 1, chunked: 0 });
          assert.equal(bits(x.direct), bits(x.chunked), `allGather [${gatherBounds}] rank ${x.rank}`);
          for (let r = 0; r < world; r++) {
            for (let i = gatherBounds[r]!; i < gatherBounds[r + 1]!; i++) if (x.direct[i] !== Math.fround(gatherValue(r, i))) assert.fail(`rank ${x.rank} gathered[${i}]`);
          }
          for (let i = 0; i < 7; i++) assert.equal(x.direct[i], -1, "what lies before bounds[0] is left");
        }
      }
      // the optimizer's reduce: sum, 1 / the loss scale, the squares of the rank's slice; whole and in pieces
      for (const scatter of [true, false]) {
        for (const scale of [1, 2 ** -16, 0.3]) {
          for (const pieces of [[0, n], [0, 4000, 8000, n]]) {
            const bounds = [...shardBounds(n - 2, world)];
            const res = (await wg.scaledBoth!(n, bounds, scatter, scale, pieces)) as ScaledResult[];
            for (const x of res) {
              const what = `reduceScaled scatter=${scatter} scale=${scale} pieces=${pieces.length - 1} rank ${x.rank}`;
              assert.deepEqual(x.counts, { direct: pieces.length - 1, chunked: 0 }, `${what}: direct`);
              const ranges = scatter ? [[bounds[x.rank]!, bounds[x.rank + 1]!], [bounds[world]!, n]] : [[0, n]];
              for (const [a, b] of ranges) {
                assert.equal(bits(x.direct.subarray(a, b)), bits(x.old.subarray(a, b)), `${what}: [${a}, ${b}) direct = old passes`);
                assert.equal(bits(x.chunked.subarray(a, b)), bits(x.old.subarray(a, b)), `${what}: [${a}, ${b}) chunked = old passes`);
              }
              assert.equal(x.squares.direct, x.squares.old, `${what}: squares`);
              assert.equal(x.squares.chunked, x.squares.old, `${what}: squares (chunked)`);
            }
          }
        }
      }
      // ops back to back, each rank rewriting its region as soon as its op returns
      for (const x of (await wg.backToBack!(50_001, 30)) as { sums: number[]; counts: { direct: number } }[]) {
        assert.ok(x.sums.every((b) => b === 0), `wrong elements per round: ${x.sums}`);
        assert.equal(x.counts.direct, 30);
      }
    }, 120_000);
  });
}

test("ranks that disagree on the direct path (one passes an ordinary array) all take the chunked one, with its bits", async () => {
  await withPool({ worldSize: 3, chunkElems: 1000 }, async (pool) => {
    const wg = await directWorker(pool);
    for (const op of ["sum", "mean", "min"] as ReduceOp[]) {
      const res = (await wg.allReduceBoth!(5003, op, 0, 1)) as BothResult[];
      const want = bits(reference(3, 5003, op, 2));
      for (const x of res) {
        assert.deepEqual(x.directCounts, { direct: 0, chunked: 1 }, `rank ${x.rank}: fell back`);
        assert.equal(bits(x.direct), want);
      }
    }
  }, 30_000);
});

test("a rank that fails before a direct reduce releases its peers; one that never comes times out naming it; the group recovers", async () => {
  await withPool({ worldSize: 2, timeoutMs: 1000 }, async (pool) => {
    const wg = await directWorker(pool);
    let t0 = Date.now();
    await assert.rejects(Promise.resolve(wg.directFailure!(1000, -1, 1)), (e: Error) => {
      assert.ok(e instanceof WorkerError);
      assert.match(e.message, /rank 1 gave up before the direct allReduce/);
      assert.match(e.message, /collective allReduce aborted on rank 0 in 'directFailure': rank 1 failed/);
      return true;
    });
    assert.ok(Date.now() - t0 < 5000, "released without waiting for the timeout");
    t0 = Date.now();
    await assert.rejects(Promise.resolve(wg.directFailure!(1000, 1, -1)), /collective allReduce timed out after 1 s on rank 0 in 'directFailure': ranks \[1\] did not arrive/);
    assert.ok(Date.now() - t0 < 5000);
    const res = (await wg.allReduceBoth!(2503, "sum", 0)) as BothResult[];
    for (const x of res) {
      assert.deepEqual(x.directCounts, { direct: 1, chunked: 0 }, "direct again after the failures");
      assert.equal(bits(x.direct), bits(reference(2, 2503, "sum", 2)));
    }
  });
});

test("peerRegions: every rank's region, its own included, once all have arrived; none on any rank over the limit; lengths that differ are an error", async () => {
  await withPool({ worldSize: 3, directMaxBytes: 64 * 1024 }, async (pool) => {
    const wg = await directWorker(pool);
    const n = 1000, want = [0, 1, 2].map((r) => Array.from({ length: n }, (_, i) => Math.fround(r + i / n)).reduce((a, b) => a + b, 0));
    const res = (await wg.peerRegionSums!([n, n, n])) as { got: boolean; sums: number[] }[];
    for (const x of res) assert.deepEqual(x, { got: true, sums: want }, "every rank sees what each rank wrote");
    const big = 16 * 1024 + 1; // over the 64 KiB limit: no region, on every rank alike
    for (const x of (await wg.peerRegionSums!([big, big, big])) as { got: boolean }[]) assert.deepEqual(x, { got: false, sums: [] });
    await assert.rejects(wg.peerRegionSums!([n, n + 1, n]), /ranks disagree on the operation or its length \(rank 0: peerRegions float32 of 1000; rank 1: peerRegions float32 of 1001/);
  });
});

test("the direct region: grown to fit and kept, bounded by directMaxBytes (over it, or 0: the chunked path)", async () => {
  await withPool({ worldSize: 2, directMaxBytes: 64 * 1024 }, async (pool) => {
    const wg = await directWorker(pool);
    assert.deepEqual(await wg.regionOf!(1000), [{ got: true, bytes: 4000 }, { got: true, bytes: 4000 }]);
    assert.deepEqual(await wg.regionOf!(500), [{ got: true, bytes: 4000 }, { got: true, bytes: 4000 }], "never shrunk");
    assert.deepEqual(await wg.regionOf!(16 * 1024 + 1), [{ got: false, bytes: 0 }, { got: false, bytes: 0 }], "over the limit: none");
    // and the chunked path then does the op
    const res = (await wg.allReduceBoth!(2503, "mean", 0, 0)) as BothResult[];
    for (const x of res) assert.equal(bits(x.direct), bits(reference(2, 2503, "mean", 2)));
  });
  await withPool({ worldSize: 2, directMaxBytes: 0 }, async (pool) => {
    const wg = await directWorker(pool);
    assert.deepEqual(await wg.regionOf!(10), [{ got: false, bytes: 0 }, { got: false, bytes: 0 }], "0 turns it off");
  });
  assert.equal(directMaxBytes({}, {}), MAX_DIRECT_REGION_BYTES);
  assert.equal(directMaxBytes({}, { VERL_COLLECTIVE_DIRECT_MAX_MB: "1.5" }), 1.5 * 2 ** 20);
  assert.equal(directMaxBytes({ directMaxBytes: 10 }, { VERL_COLLECTIVE_DIRECT_MAX_MB: "1" }), 8, "the option wins, whole float32s");
  assert.equal(directMaxBytes({}, { VERL_COLLECTIVE_DIRECT_MAX_MB: "1e9" }), MAX_DIRECT_REGION_BYTES, "capped at V8's limit");
  assert.throws(() => directMaxBytes({}, { VERL_COLLECTIVE_DIRECT_MAX_MB: "lots" }), /VERL_COLLECTIVE_DIRECT_MAX_MB=lots: give a size in MiB/);
  assert.equal(createCollectiveBuffers(1).regions!.length, 0, "one rank has no region");
  // one rank: no region; reduceScaled is the scale and the squares
  const solo = Collective.single();
  assert.equal(solo.reduceBuffer(10), undefined);
  const buf = Float32Array.of(1, 2, 3, 4, 9);
  assert.equal(solo.reduceScaled(buf, [0, 4], { scatter: true, scale: 0.5, acc: 1 }), 1 + 0.25 + 1 + 2.25 + 4);
  assert.deepEqual([...buf], [0.5, 1, 1.5, 2, 9], "the tail past bounds[W] is not scaled");
});
