// reduceScatter and allGather (the collectives of a ZeRO-1 sharded optimizer): a rank's slice of a
// reduceScatter, and the tail past the last bound, hold the bits allReduce gives them, and an
// allGather leaves every rank with each writer's slice; in one process (shared memory, through a
// scratch buffer smaller than the data) and across host agents (the ring).
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClassWithInitArgs, Collective, WorkerGroup, type ResourcePool } from "../../src/single_controller/index.js";
import { shardBounds } from "../../src/engine/optim/grad_utils.js";
import { gatherValue, type ScatterGatherResult } from "./fixtures/shard_worker.js";
import { fixture, withPool } from "./helpers.js";
import { launchCluster } from "./distributed/cluster_helpers.js";

type Wg = Record<string, (...a: unknown[]) => Promise<unknown>>;
const shardWorker = (pool: ResourcePool) => WorkerGroup.create(pool, new ClassWithInitArgs(fixture("shard_worker"), "ShardWorker")) as unknown as Promise<Wg>;
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

/** Splits to try for W ranks over n values: even, with empty slices, with a tail past the last bound. */
function boundSets(world: number, n: number): number[][] {
  const even = shardBounds(n, world);
  const lumpy = Array.from({ length: world + 1 }, (_, r) => (r === world ? n : Math.min(n, r * r * 700)));
  const tail = shardBounds(n - 3, world);
  return [even, lumpy, tail];
}

function check(res: ScatterGatherResult[], bounds: number[], gatherBounds: number[], what: string): void {
  const world = res.length, n = res[0]!.reduced.length;
  for (const x of res) {
    assert.ok(bits(x.reduced).equals(bits(res[0]!.reduced)), `${what}: rank ${x.rank} allReduce agrees with rank 0`);
    for (const [a, b] of [[bounds[x.rank]!, bounds[x.rank + 1]!], [bounds[world]!, n]] as const) {
      assert.ok(bits(x.scattered.subarray(a, b)).equals(bits(x.reduced.subarray(a, b))), `${what}: rank ${x.rank} [${a}, ${b}) has allReduce's bits`);
    }
    for (let r = 0; r < world; r++) {
      for (let i = gatherBounds[r]!; i < gatherBounds[r + 1]!; i++) {
        if (x.gathered[i] !== Math.fround(gatherValue(r, i))) assert.fail(`${what}: rank ${x.rank} gathered[${i}] = ${x.gathered[i]}, rank ${r} wrote ${gatherValue(r, i)}`);
      }
    }
    for (let i = 0; i < gatherBounds[0]!; i++) assert.equal(x.gathered[i], -1, `${what}: allGather leaves what lies before bounds[0]`);
  }
}

for (const world of [2, 3, 4]) {
  test(`reduceScatter and allGather on ${world} ranks in one process`, async () => {
    await withPool({ worldSize: world, chunkElems: 1000 }, async (pool) => {
      const wg = await shardWorker(pool);
      const n = 5003;
      for (const bounds of boundSets(world, n)) {
        // allGather from an offset, over a range the scratch (world + 1 chunks) takes in several windows
        const gatherBounds = bounds.map((b, i) => (i === 0 ? 7 : Math.max(7, b)));
        check((await wg.scatterGather!(n, bounds, gatherBounds)) as ScatterGatherResult[], bounds, gatherBounds, `world ${world} [${bounds.join(",")}]`);
      }
    }, 30_000);
  });
}

interface BucketedScatter {
  whole: Float32Array;
  bucketed: Float32Array;
  bucket: number;
  bounds: number[];
}

/** Each rank's slice and the tail of the bucketed reduce-scatter have the bits of one call. */
function checkBucketed(res: BucketedScatter[], expectBucket: number, what: string): void {
  const n = res[0]!.whole.length - 2;
  for (const [r, x] of res.entries()) {
    assert.equal(x.bucket, expectBucket, `${what}: bucket size`);
    for (const [a, b] of [[x.bounds[r]!, x.bounds[r + 1]!], [n, n + 2]] as const) {
      assert.ok(bits(x.bucketed.subarray(a, b)).equals(bits(x.whole.subarray(a, b))), `${what}: rank ${r} [${a}, ${b})`);
    }
  }
}

test("the optimizer's bucketed reduce-scatter has one call's bits (in one process)", async () => {
  await withPool({ worldSize: 3, chunkElems: 1000 }, async (pool) => {
    const wg = await shardWorker(pool);
    // 1000-element buckets over 5000 values: slice bounds fall inside buckets
    checkBucketed((await wg.bucketedScatter!(5000, 4000)) as BucketedScatter[], 1000, "one process");
  }, 30_000);
});

test("the collectives refuse bad bounds, and a rank reduce-scattering while another all-reduces", async () => {
  const solo = Collective.single();
  assert.throws(() => solo.reduceScatter(new Float32Array(4), [1, 4]), /reduceScatter: bounds must be 2 non-decreasing offsets from 0 within the buffer of 4, got \[1, 4\]/);
  assert.throws(() => solo.allGather(new Float32Array(4), [0, 5]), /allGather: bounds must be 2 non-decreasing offsets within the buffer of 4/);
  const one = Float32Array.of(1, 2, 3);
  solo.reduceScatter(one, [0, 2]);
  solo.allGather(one, [0, 3]);
  assert.deepEqual([...one], [1, 2, 3], "one rank: both are the identity");
  await withPool(2, async (pool) => {
    const wg = await shardWorker(pool);
    await assert.rejects(Promise.resolve(wg.mismatchedScatter!()),
      /ranks disagree on the operation or its length \(rank 0: reduceScatter sum float32 of 8; rank 1: allReduce sum float32 of 8\)/);
  });
});

test("reduceScatter and allGather across hosts (2 hosts x 2 ranks)", { timeout: 90_000 }, async () => {
  // A 4 KiB bridge: the data crosses in several requests.
  const cluster = await launchCluster([{ name: "hostA" }, { name: "hostB" }], 2, { timeoutMs: 8000, bridgeBytes: 4096, chunkBytes: 1024 });
  try {
    const wg = await shardWorker(cluster.pool);
    const n = 5003;
    for (const bounds of boundSets(4, n)) {
      const gatherBounds = bounds.map((b, i) => (i === 0 ? 7 : Math.max(7, b)));
      check((await wg.scatterGather!(n, bounds, gatherBounds)) as ScatterGatherResult[], bounds, gatherBounds, `hosts [${bounds.join(",")}]`);
    }
    // buckets at the bridge's multiples (1024 float32): the bits of one call across hosts too
    checkBucketed((await wg.bucketedScatter!(n, 8192)) as BucketedScatter[], 2048, "across hosts");
  } finally {
    await cluster.stop();
  }
});
