import { test } from "node:test";
import assert from "node:assert/strict";
import { DataProto, tensor } from "../../src/protocol/index.js";
import {
  ClassWithInitArgs, Dispatch, FunctionRef, WorkerGroup, getDispatchMode, listDispatchModes, registerDispatchMode, updateDispatchMode,
} from "../../src/single_controller/index.js";
import { normalizeDispatch } from "../../src/single_controller/dispatch.js";
import type { EchoWorker } from "./fixtures/workers.js";
import { fixture, withPool } from "./helpers.js";

const rows = (n: number, uid = true) =>
  DataProto.fromDict(
    { x: tensor(Float32Array.from({ length: n * 2 }, (_, i) => i), [n, 2]) },
    uid ? { uid: Array.from({ length: n }, (_, i) => `u${i}`) } : {},
  );

test("the registry lists modes, rejects unknown names and conflicting re-registration", () => {
  for (const m of Object.values(Dispatch)) assert.ok(listDispatchModes().includes(m), m);
  assert.throws(() => getDispatchMode("NOPE"), /unknown dispatch mode 'NOPE'; known modes: .*DP_COMPUTE_PROTO/);
  const spec = { dispatchFn: () => [], collectFn: () => null };
  registerDispatchMode("TEST_MODE", spec);
  registerDispatchMode("TEST_MODE", spec); // same functions: a no-op
  assert.throws(() => registerDispatchMode("TEST_MODE", { ...spec, collectFn: () => 1 }), /already registered/);
  assert.throws(() => registerDispatchMode(Dispatch.ONE_TO_ALL, spec), /already registered/);
  updateDispatchMode("TEST_MODE", { ...spec, collectFn: () => 2 });
  assert.equal(getDispatchMode("TEST_MODE").collectFn({ worldSize: 1 }, []), 2);
  assert.throws(() => registerDispatchMode("BAD", { dispatchFn: () => [] } as never), /needs dispatchFn and collectFn/);
});

test("dispatch results must give one value per rank for every argument", () => {
  assert.throws(() => normalizeDispatch("M", 2, [[1]]), /argument 0 must become a list with one value per rank \(2\), got a list of 1/);
  assert.throws(() => normalizeDispatch("M", 2, { args: [[1, 2]], padSize: -1 }), /padSize must be a non-negative integer/);
  assert.deepEqual(normalizeDispatch("M", 2, [[1, 2]]), { args: [[1, 2]], padSize: 0 });
});

test("built-in dispatch functions split as verl's do (pure, no threads)", () => {
  const g = { worldSize: 2 };
  assert.deepEqual(getDispatchMode(Dispatch.ONE_TO_ALL).dispatchFn(g, "a", 3), [["a", "a"], [3, 3]]);
  assert.deepEqual(getDispatchMode(Dispatch.ALL_TO_ALL).dispatchFn(g, ["a", "b"], [1, 2]), [["a", "b"], [1, 2]]);
  assert.deepEqual(getDispatchMode(Dispatch.ALL_TO_ALL).dispatchFn(g, ["a", "b"], 7), [[["a", "b"], ["a", "b"]], [7, 7]]);
  assert.throws(() => getDispatchMode(Dispatch.DP_COMPUTE).dispatchFn(g, [1, 2, 3]), /DP_COMPUTE: argument 0 must be a list with one value per rank \(2\)/);
  const proto = getDispatchMode(Dispatch.DP_COMPUTE_PROTO).dispatchFn(g, rows(5), { lr: 1 }) as { args: unknown[][]; padSize: number };
  assert.equal(proto.padSize, 1);
  assert.deepEqual((proto.args[0] as DataProto[]).map((d) => d.nonTensorBatch.uid), [["u0", "u1", "u2"], ["u3", "u4", "u0"]]);
  assert.deepEqual(proto.args[1], [{ lr: 1 }, { lr: 1 }]);
  assert.throws(() => getDispatchMode(Dispatch.DP_COMPUTE_PROTO).dispatchFn(g, 1), /no DataProto argument/);
  assert.throws(() => getDispatchMode(Dispatch.DP_COMPUTE_PROTO).dispatchFn(g, rows(5), rows(4)), /pads differently/);
  const metric = getDispatchMode(Dispatch.DP_COMPUTE_METRIC).dispatchFn(g, rows(5)) as DataProto[][];
  assert.deepEqual(metric[0]!.map((d) => d.length), [3, 2]);
  assert.deepEqual(getDispatchMode(Dispatch.RANK_ZERO).collectFn(g, ["r0", "r1"]), "r0");
});

test("every dispatch mode through a 2-rank group", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, new ClassWithInitArgs(fixture("workers"), "EchoWorker"));
    // ONE_TO_ALL: replicated, list of outputs.
    assert.deepEqual(await wg.inc(3), [3, 3]);
    // ALL_TO_ALL: per-rank lists scatter; anything else is replicated.
    assert.deepEqual(await wg.tagged(["a", "b"]), ["0:a", "1:b"]);
    assert.deepEqual(await wg.tagged("z"), ["0:z", "1:z"]);
    // DP_COMPUTE: every argument a per-rank list.
    assert.deepEqual(await wg.scaled([1, 2], [3, 4]), [13, 1024]);
    await assert.rejects(wg.scaled([1, 2, 3], [1, 2, 3]).get(), /DP_COMPUTE: argument 0 must be a list with one value per rank/);
    // DP_COMPUTE_PROTO: 5 rows pad to 6, split 3/3, concat, unpad to 5; order and metrics kept.
    const out = await wg.double<DataProto>(rows(5));
    assert.equal(out.length, 5);
    assert.deepEqual([...out.tensor("x2").data], [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]);
    assert.deepEqual(out.tensor("x2").shape, [5, 2]);
    assert.deepEqual(out.nonTensorBatch.handledBy, [0, 0, 0, 1, 1]);
    assert.deepEqual(out.nonTensorBatch.uid, ["u0", "u1", "u2", "u3", "u4"]);
    assert.deepEqual(out.metaInfo.metrics, { rows: [3, 3] });
    const even = await wg.double<DataProto>(rows(4, false));
    assert.deepEqual(even.nonTensorBatch.handledBy, [0, 0, 1, 1]);
    // DP_COMPUTE_PROTO_WITH_FUNC: the function goes by module and name.
    const withFn = await wg.applyFn<DataProto>(new FunctionRef(fixture("functions"), "addRank"), rows(3));
    assert.deepEqual([...withFn.tensor("y").data], [0, 1, 2, 3, 104, 105]);
    await assert.rejects(wg.applyFn((d: DataProto) => d, rows(2)).get(), /first argument must be a FunctionRef/);
    await assert.rejects(wg.applyFn(new FunctionRef(fixture("functions"), "nothing"), rows(2)).get(), /no exported function 'nothing'/);
    // DP_COMPUTE_METRIC: uneven split, every row counted once, list of per-rank outputs.
    const stats = (await wg.rowStats(rows(5))) as { rank: number; rows: number; sum: number }[];
    assert.deepEqual(stats.map((s) => [s.rank, s.rows]), [[0, 3], [1, 2]]);
    assert.equal(stats[0]!.sum + stats[1]!.sum, 45);
    // RANK_ZERO: runs on rank 0, returns its value (not a list).
    assert.equal(await wg.whoAmI(), 0);
    // ONE_TO_ALL with execute RANK_ZERO: only rank 0 runs; the list has its one output.
    assert.deepEqual(await wg.onlyRankZero(), ["ran on 0"]);
    // Functions cannot cross threads.
    await assert.rejects(wg.tagged(() => 1).get(), /is a function; functions cannot cross threads/);
  });
});

test("DP_COMPUTE_PROTO on a single rank moves nothing the caller owns", async () => {
  await withPool(1, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, new ClassWithInitArgs(fixture("workers"), "EchoWorker"));
    const data = rows(3);
    const out = await wg.double<DataProto>(data);
    assert.deepEqual([...out.tensor("x2").data], [0, 2, 4, 6, 8, 10]);
    assert.deepEqual([...data.tensor("x").data], [0, 1, 2, 3, 4, 5]);
  });
});
