// A pool spanning two "hosts" (two agent processes on 127.0.0.1, two ranks each):
// global ranks, dispatch modes, DataProto round trips, hierarchical collectives
// equal to the one-process ones bit for bit where the order allows, and failures
// that release every host.
import { test } from "node:test";
import assert from "node:assert/strict";
import { DataProto, tensor } from "../../../src/protocol/index.js";
import { ClassWithInitArgs, WorkerGroup } from "../../../src/single_controller/index.js";
import { fixture, withPool } from "../helpers.js";
import { launchCluster } from "./cluster_helpers.js";

test("two agents of two ranks: ranks, dispatch, DataProto, collectives, failures", { timeout: 60_000 }, async () => {
  const cluster = await launchCluster([{ name: "hostA" }, { name: "hostB" }], 2, { timeoutMs: 8000 });
  try {
    const wg = (await WorkerGroup.create(cluster.pool, new ClassWithInitArgs(fixture("workers"), "EchoWorker", "x"))) as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>;
    const info = (await wg.info!()) as { rank: number; worldSize: number; localRank: number; env: Record<string, string> }[];
    assert.deepEqual(info.map((i) => [i.rank, i.worldSize, i.localRank, i.env.RANK, i.env.LOCAL_RANK]), [[0, 4, 0, "0", "0"], [1, 4, 1, "1", "1"], [2, 4, 0, "2", "0"], [3, 4, 1, "3", "1"]]);
    assert.deepEqual(await wg.inc!(2), [2, 2, 2, 2]);

    // DP_COMPUTE_PROTO across hosts: 10 rows padded to 12, chunked, results back in order.
    const x = Float32Array.from({ length: 20 }, (_, i) => i);
    const out = (await wg.generate!(DataProto.fromDict({ x: tensor(x, [10, 2]) }))) as DataProto;
    assert.deepEqual([...out.tensor("x").data], [...x].map((v) => v + 0.5));

    // Collectives: the same bits as one process of four ranks for sum/max/min over 2 hosts of 2.
    const n = 300_001;
    const spanning = (await wg.reduceValues!(n, "max")) as Float32Array[];
    const spanningSum = (await wg.reduceValues!(n, "mean")) as Float32Array[];
    const local = await withPool(4, async (pool) => {
      const g = (await WorkerGroup.create(pool, new ClassWithInitArgs(fixture("workers"), "EchoWorker"))) as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>;
      return [(await g.reduceValues!(n, "max")) as Float32Array[], (await g.reduceValues!(n, "mean")) as Float32Array[]];
    }, 30_000);
    for (let r = 0; r < 4; r++) assert.deepEqual(spanning[r], local[0]![0], `max on rank ${r}`);
    for (let r = 1; r < 4; r++) assert.deepEqual(spanningSum[r], spanningSum[0], "every rank holds the same mean bits");
    let worst = 0;
    for (let i = 0; i < n; i++) worst = Math.max(worst, Math.abs(spanningSum[0]![i]! - local[1]![0]![i]!) / (Math.abs(local[1]![0]![i]!) + 1));
    assert.ok(worst < 1e-6, `mean across hosts within float tolerance of one process (host partial sums round to float32 once) (worst relative ${worst})`);

    const b = (await wg.broadcastFrom!(3, 1_500_001)) as Int32Array[];
    for (let r = 0; r < 4; r++) assert.equal(b[r]![1_500_000], 1_500_000 * 7 + 300000, `broadcast from rank 3 reached rank ${r}`);
    assert.deepEqual(await wg.barriers!(5), [5, 5, 5, 5]);

    // A rank that throws before a collective releases the ranks of the other host at once.
    const t0 = Date.now();
    await assert.rejects(wg.failBeforeAllReduce!(3), /rank 3 gave up before allReduce/);
    assert.ok(Date.now() - t0 < 5000, `released in ${Date.now() - t0} ms, not by the timeout`);
    await assert.rejects(wg.mismatched!(), /disagree/);
    // The group stays usable after failed calls.
    assert.deepEqual(await wg.barriers!(2), [2, 2, 2, 2]);
    assert.deepEqual(await wg.inc!(1), [3, 3, 3, 3]);
  } finally {
    await cluster.stop();
  }
  for (const a of cluster.agents) assert.equal(await a.exited, 0, `${a.name} exits 0 after shutdown:\n${a.output.join("")}`);
});
