import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import {
  ClassWithInitArgs, WorkerDiedError, WorkerError, WorkerGroup, WorkerGroupClosedError,
} from "../../src/single_controller/index.js";
import type { EchoWorker } from "./fixtures/workers.js";
import { fixture, waitFor, withPool } from "./helpers.js";

const echo = () => new ClassWithInitArgs(fixture("workers"), "EchoWorker");
process.env.VERL_LOG_LEVEL ??= "fatal";

test("an exception in a worker reaches the driver with the rank, the method and the worker's stack; the group goes on", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    await assert.rejects(wg.failOn(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerError);
      assert.equal(e.rank, 1);
      assert.equal(e.method, "failOn");
      assert.match(e.message, /^failOn failed on rank 1: Error: boom on rank 1/);
      assert.match(e.workerStack, /at throwDeep \(.*fixtures\/workers\.js/);
      assert.match(e.workerStack, /at EchoWorker\.failOn/);
      return true;
    });
    assert.deepEqual(await wg.inc(1), [1, 1]);
    assert.ok(pool.alive);
  });
});

test("values that cannot cross threads fail the call with a clear error and never kill the thread", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    await assert.rejects(wg.uncloneable("function").get(), /uncloneable result\.nested\[0\]\.cb is a function; functions cannot cross threads/);
    await assert.rejects(wg.uncloneable("promise").get(), /uncloneable result\.pending is a Promise \(await it first\)/);
    await assert.rejects(wg.uncloneable("instance").get(), /uncloneable result\.onDone is a function/);
    const ok = (await wg.uncloneable("fine")) as { set: Set<number>; map: Map<string, Float32Array>; at: Date }[];
    assert.deepEqual([...ok[1]!.set], [1, 2]);
    assert.ok(ok[1]!.map.get("k") instanceof Float32Array);
    await assert.rejects(wg.inc(new Map([["f", () => 1]])).get(), /inc argument\[0\]\.get\(f\) is a function/);
    assert.ok(pool.alive);
    assert.deepEqual(await wg.inc(1), [1, 1]);
  });
});

test("a worker thread that calls process.exit fails the call and the group, loudly", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    await assert.rejects(wg.exitOn(1, 3).get(), (e: Error) => {
      assert.ok(e instanceof WorkerDiedError, `${e.name}: ${e.message}`);
      assert.equal(e.rank, 1);
      assert.match(e.message, /worker thread of rank 1 died during exitOn: thread exited with code 3/);
      return true;
    });
    assert.equal(pool.alive, false);
    // Never a silent replacement: later calls fail, even after piscina had time to start a new thread.
    await new Promise((r) => setTimeout(r, 300));
    await assert.rejects(wg.inc(1).get(), (e: Error) => e instanceof WorkerGroupClosedError && /rank 1 died/.test(e.message));
  });
});

test("an uncaught error in a worker's timer (between calls) fails the group", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    assert.deepEqual(await wg.throwInTimerOn(0), [0, 1]);
    await waitFor(() => !pool.alive, 5000, "the pool to notice the dead thread");
    const err = pool.error;
    assert.ok(err instanceof WorkerDiedError);
    assert.equal(err.rank, 0);
    assert.match(err.message, /timer boom on rank 0/);
    await assert.rejects(wg.inc(1).get(), /resource pool 'global_pool' is not usable: worker thread of rank 0 died/);
  });
});

test("peers blocked in a collective are released when a rank dies (no timeout wait)", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const t0 = Date.now();
    await assert.rejects(wg.dieDuringAllReduce(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerDiedError, `${e.name}: ${e.message}`);
      assert.equal(e.rank, 1);
      assert.match(e.message, /exited with code 7/);
      assert.match(e.message, /also rank 0: /);
      return true;
    });
    assert.ok(Date.now() - t0 < 5000, "released well before the 120 s default timeout");
  }, 15_000);
});

test("a worker thread that runs out of memory fails the call with the reason", async () => {
  await withPool({ worldSize: 2, resourceLimits: { maxOldGenerationSizeMb: 48, maxYoungGenerationSizeMb: 8 } }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    await assert.rejects(wg.exhaustMemoryOn(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerDiedError, `${e.name}: ${e.message}`);
      assert.equal(e.rank, 1);
      assert.match(e.message, /ERR_WORKER_OUT_OF_MEMORY/);
      return true;
    });
    assert.equal(pool.alive, false);
  }, 20_000);
});

test("shutdown stops calls in flight, refuses new ones, and lets the process exit", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const inFlight = wg.slowRank(60_000);
    await new Promise((r) => setTimeout(r, 50));
    await wg.shutdown();
    await assert.rejects(inFlight.get(), (e: Error) => e instanceof WorkerGroupClosedError && /was shut down/.test(e.message));
    await assert.rejects(wg.inc(1).get(), /is not usable: resource pool 'global_pool' was shut down/);
  });
  const script = fileURLToPath(fixture("exit_script"));
  const { code, stdout } = await new Promise<{ code: number | null; stdout: string }>((resolve, reject) => {
    const child = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error("the process did not exit within 15 s after shutdown"));
    }, 15_000);
    child.on("exit", (c) => {
      clearTimeout(timer);
      resolve({ code: c, stdout: out });
    });
  });
  assert.equal(code, 0);
  assert.equal(stdout.trim(), "[1,1]");
});
