// The gradient all-reduce in buckets (dp_optimizer.ts) gives the bits of one call over the whole
// buffer: across three host agents (where the ring's summation order depends on where requests
// start, so buckets must start at the bridge's multiples) and in one process.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClassWithInitArgs, WorkerGroup } from "../../../src/single_controller/index.js";
import type { BucketedResult } from "../fixtures/bucket_worker.js";
import { fixture, withPool } from "../helpers.js";
import { launchCluster } from "./cluster_helpers.js";

const N = 5000;

function check(res: BucketedResult[], expectBucket: number): void {
  for (const [r, x] of res.entries()) {
    assert.equal(x.bucket, expectBucket, `rank ${r}: bucket size`);
    assert.deepEqual(x.bucketed, x.whole, `rank ${r}: bucketed reduce has the one-call bits`);
    assert.deepEqual(x.whole, res[0]!.whole, `rank ${r} holds rank 0's bits`);
    assert.deepEqual(x.inPlace, x.whole, `rank ${r}: the sum in reduceBuffer has the ordinary call's bits`);
    assert.deepEqual(x.meanInPlace, x.mean, `rank ${r}: the mean in reduceBuffer has the ordinary call's bits`);
  }
}

test("bucketed reduce across three hosts equals one call bit for bit; an unaligned split does not", { timeout: 60_000 }, async () => {
  // A 4 KiB bridge: float32 requests of 1024 elements, so a 5002-element buffer crosses in 5.
  const cluster = await launchCluster([{ name: "hostA" }, { name: "hostB" }, { name: "hostC" }], 1, { timeoutMs: 8000, bridgeBytes: 4096, chunkBytes: 1024 });
  try {
    const wg = (await WorkerGroup.create(cluster.pool, new ClassWithInitArgs(fixture("bucket_worker"), "BucketWorker"))) as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>;
    const res = (await wg.bucketed!(N, 8192, 1500)) as BucketedResult[];
    assert.equal(res[0]!.align, 1024);
    check(res, 2048);
    assert.ok(res.every((x) => x.placedShared), "across hosts each leader's reduceBuffer lies in the bridge memory (reduced in place)");
    // Pieces of 1500 move the ring segments, so some sums run in another host order: the alignment is what keeps the bits.
    assert.notDeepEqual(res[0]!.split, res[0]!.whole, "an unaligned split changes some bits (the test can tell)");
  } finally {
    await cluster.stop();
  }
});

test("bucketed reduce in one process equals one call bit for bit", { timeout: 30_000 }, async () => {
  const res = await withPool(2, async (pool) => {
    const wg = (await WorkerGroup.create(pool, new ClassWithInitArgs(fixture("bucket_worker"), "BucketWorker"))) as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>;
    return (await wg.bucketed!(N, 4000, 1500)) as BucketedResult[];
  }, 30_000);
  assert.equal(res[0]!.align, null);
  check(res, 1000);
  assert.ok(res.every((x) => x.placedShared), "in one process reduceBuffer is the rank's direct region (shared memory, reduced in place)");
  assert.deepEqual(res[0]!.split, res[0]!.whole, "in one process any split sums in rank order");
});
