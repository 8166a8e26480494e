import { test } from "node:test";
import assert from "node:assert/strict";
import { DataProto, tensor } from "../../src/protocol/index.js";
import {
  ClassWithInitArgs, DataProtoFuture, WorkerGroup, createColocatedWorkerClass, poolSizeFromConfig,
} from "../../src/single_controller/index.js";
import type { EchoWorker, PlainWorker } from "./fixtures/workers.js";
import type { InferWorker } from "./fixtures/infer_worker.js";
import type { ActorRolloutWorker, CriticWorker } from "./fixtures/colocated.js";
import { fixture, withPool } from "./helpers.js";

const echo = (...initArgs: unknown[]) => new ClassWithInitArgs(fixture("workers"), "EchoWorker", ...initArgs);

test("each rank is its own thread with RANK/WORLD_SIZE/LOCAL_RANK and its init args", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo("t1"));
    const infos = (await wg.info()) as { rank: number; worldSize: number; localRank: number; tag: string; threadId: number; env: Record<string, string> }[];
    assert.deepEqual(infos.map((i) => i.rank), [0, 1]);
    assert.deepEqual(infos.map((i) => i.env), [
      { RANK: "0", WORLD_SIZE: "2", LOCAL_RANK: "0" },
      { RANK: "1", WORLD_SIZE: "2", LOCAL_RANK: "1" },
    ]);
    assert.deepEqual(infos.map((i) => [i.worldSize, i.localRank, i.tag]), [[2, 0, "t1"], [2, 1, "t1"]]);
    assert.notEqual(infos[0]!.threadId, infos[1]!.threadId);
    assert.deepEqual(wg.methodNames().includes("double"), true);
  });
});

test("state persists across calls and calls run in the order they were made", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const calls = Array.from({ length: 20 }, () => wg.inc(1));
    assert.deepEqual(await Promise.all(calls), Array.from({ length: 20 }, (_, i) => [i + 1, i + 1]));
    assert.deepEqual(await wg.call("inc", 10), [30, 30]);
    assert.throws(() => wg.call("nope"), /no registered method 'nope'; registered: .*double/);
  });
});

test("futures: non-blocking calls return a DataProtoFuture; futures passed as arguments are awaited first", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const f = wg.slowRank(50);
    assert.ok(f instanceof DataProtoFuture);
    assert.deepEqual(await f.get(), [0, 1]);

    const data = DataProto.fromDict({ x: tensor(new Float32Array([1, 2, 3, 4]), [4, 1]) });
    const gen = wg.generate<DataProto>(data);
    const doubled = await wg.double<DataProto>(gen);
    assert.deepEqual([...doubled.tensor("x2").data], [3, 5, 7, 9]);

    const both = await DataProtoFuture.concat([wg.generate<DataProto>(data), wg.generate<DataProto>(data)]);
    assert.equal(both.length, 8);
  });
});

test("a failing non-blocking call holds its error until .get() (no unhandled rejection)", async () => {
  const unhandled: unknown[] = [];
  const onUnhandled = (e: unknown) => unhandled.push(e);
  process.on("unhandledRejection", onUnhandled);
  try {
    await withPool(2, async (pool) => {
      const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
      const f = wg.failLater(1);
      await new Promise((r) => setTimeout(r, 200));
      await assert.rejects(f.get(), (e: Error) => /failLater failed on rank 1: Error: late failure on rank 1/.test(e.message));
    });
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(unhandled, []);
  } finally {
    process.off("unhandledRejection", onUnhandled);
  }
});

test("the caller's DataProto stays usable: arguments it owns are copied, not moved", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const data = DataProto.fromDict({ x: tensor(new Float32Array([1, 2, 3, 4]), [4, 1]) });
    assert.deepEqual(await wg.mutate(data), [4, 4]);
    assert.deepEqual([...data.tensor("x").data], [1, 2, 3, 4]);
    const out = await wg.double<DataProto>(data);
    assert.deepEqual([...out.tensor("x2").data], [2, 4, 6, 8]);
    assert.deepEqual([...data.tensor("x").data], [1, 2, 3, 4]);
  });
});

test("several groups share one pool's threads; bad worker classes are refused clearly", async () => {
  await withPool(2, async (pool) => {
    const a = await WorkerGroup.create<EchoWorker>(pool, echo());
    const b = await WorkerGroup.create<PlainWorker>(pool, new ClassWithInitArgs(fixture("workers"), "PlainWorker"));
    assert.deepEqual(await b.hello(), ["hello from 0", "hello from 1"]);
    assert.equal(await b.execute(), "executed");
    await assert.rejects(WorkerGroup.create(pool, new ClassWithInitArgs(fixture("workers"), "ClashingWorker")), /worker method 'spawn' clashes with the WorkerGroup member/);
    assert.deepEqual(await a.inc(2), [2, 2]);
    await assert.rejects(WorkerGroup.create(pool, new ClassWithInitArgs(fixture("workers"), "NotAWorker")), /NotAWorker .* does not extend Worker/);
    await assert.rejects(WorkerGroup.create(pool, new ClassWithInitArgs(fixture("workers"), "Missing")), /has no exported class 'Missing'/);
    assert.throws(() => new ClassWithInitArgs("relative/path.js", "X"), /is relative/);
  });
});

test("the design notes' LIST_SPLIT custom dispatch mode works as written", async () => {
  await withPool(2, async (pool) => {
    const workerGroup = await WorkerGroup.create<InferWorker>(pool, new ClassWithInitArgs(fixture("infer_worker"), "InferWorker"));
    const modelInfo = await workerGroup.loadModel("qwen3.5-2b");
    assert.deepEqual(modelInfo, [["cpu-0", "qwen3.5-2b"], ["cpu-1", "qwen3.5-2b"]]);
    const prompts = ["问题A", "问题B", "问题C", "问题D", "问题E"];
    const results = await workerGroup.infer(prompts);
    assert.deepEqual(results, [
      "[rank0] response to: 问题A", "[rank0] response to: 问题B", "[rank0] response to: 问题C",
      "[rank1] response to: 问题D", "[rank1] response to: 问题E",
    ]);
  });
});

test("colocated roles live in the same threads, share state and the collective, and route to their own instance", async () => {
  await withPool(2, async (pool) => {
    const cls = createColocatedWorkerClass({
      actor_rollout: new ClassWithInitArgs(fixture("colocated"), "ActorRolloutWorker", 0.25),
      critic: new ClassWithInitArgs(fixture("colocated"), "CriticWorker"),
    });
    const wgDict = await WorkerGroup.create(pool, cls);
    const { actor_rollout, critic } = wgDict.spawn<{ actor_rollout: ActorRolloutWorker; critic: CriticWorker }>(["actor_rollout", "critic"]);
    const a = (await actor_rollout.setWeights(2)) as { role: string; rank: number; threadId: number }[];
    const c = (await critic.readWeights()) as { role: string; rank: number; threadId: number; weights: number[] }[];
    assert.deepEqual(a.map((x) => x.role), ["actor_rollout", "actor_rollout"]);
    assert.deepEqual(c.map((x) => x.role), ["critic", "critic"]);
    assert.deepEqual(a.map((x) => x.threadId), c.map((x) => x.threadId));
    assert.deepEqual(c.map((x) => x.weights), [[2, 4, 6], [4, 8, 12]]);
    assert.deepEqual(await actor_rollout.syncGradients(), [[1.5, 0.25], [1.5, 0.25]]);
    assert.deepEqual(await critic.sumRanks(), [1, 1]);
    assert.equal("readWeights" in actor_rollout, false);
    assert.throws(() => wgDict.spawn(["ref"]), /no role 'ref'; roles: actor_rollout, critic/);
    assert.throws(() => createColocatedWorkerClass({}), /at least one role/);
  });
});

test("pool size comes from trainer.n_gpus_per_node on one node", () => {
  assert.equal(poolSizeFromConfig({ trainer: { n_gpus_per_node: 2, nnodes: 1 } }), 2);
  assert.throws(() => poolSizeFromConfig({ trainer: { n_gpus_per_node: 2, nnodes: 2 } }), /trainer.nnodes=2/);
  assert.throws(() => poolSizeFromConfig({ trainer: { n_gpus_per_node: 0 } }), /trainer.n_gpus_per_node must be a positive integer/);
  assert.throws(() => poolSizeFromConfig({}), /no 'trainer' section/);
});
