import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import {
  ClassWithInitArgs, WorkerDiedError, WorkerError, WorkerGroup, WorkerGroupClosedError, WorkerUnresponsiveError,
} from "../../src/single_controller/index.js";
import { NATIVE_CALL_GRACE } from "../../src/single_controller/heartbeat.js";
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

test("a rank that stops answering (a busy loop) fails the call within the heartbeat timeout, naming the rank and the call; the pool is torn down", async () => {
  await withPool({ worldSize: 2, heartbeatTimeoutMs: 1500 }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const t0 = Date.now();
    await assert.rejects(wg.spinOn(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerUnresponsiveError, `${e.name}: ${e.message}`);
      assert.equal(e.rank, 1);
      assert.match(e.message, /^rank 1 stopped responding during spinOn: no progress for 1\.5 s/);
      assert.match(e.message, /trainer\.heartbeat_timeout/);
      return true;
    });
    const took = Date.now() - t0;
    assert.ok(took < 6000, `failed after ${took} ms`);
    assert.equal(pool.alive, false);
    await assert.rejects(wg.inc(1).get(), /is not usable: rank 1 stopped responding/);
  }, 20_000);
});

test("a long call that reports progress is not mistaken for a stuck one", async () => {
  // 2.5 s calls under a 1 s timeout: the thread's 200 ms event-loop beat leaves room for a loaded machine.
  await withPool({ worldSize: 2, heartbeatTimeoutMs: 1000 }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    assert.deepEqual(await wg.busyWithHeartbeats(2500), [0, 1]);
    // A call awaiting a timer is alive too: the thread's event loop turns.
    assert.deepEqual(await wg.slowRank(2500), [0, 1]);
    assert.ok(pool.alive);
  });
});

test("a rank blocked in a marked native call (a pipeline compile) gets NATIVE_CALL_GRACE timeouts, then fails naming the native call", async () => {
  await withPool({ worldSize: 2, heartbeatTimeoutMs: 300 }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    // 1.5 s without a tick: five timeouts, within the grace (the same block outside a native call fails, test above)
    assert.deepEqual(await wg.blockedInNativeCall(1500), [0, 1]);
    assert.ok(pool.alive);
    const t0 = Date.now();
    await assert.rejects(wg.blockedInNativeCall(-1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerUnresponsiveError, `${e.name}: ${e.message}`);
      assert.match(e.message, new RegExp(`no progress for ${(0.3 * NATIVE_CALL_GRACE).toFixed(0)} s inside a native call`));
      return true;
    });
    const took = Date.now() - t0;
    assert.ok(took >= 300 * NATIVE_CALL_GRACE && took < 300 * NATIVE_CALL_GRACE + 5000, `failed after ${took} ms`);
    assert.equal(pool.alive, false);
  }, 20_000);
});

test("the first failure is reported at once: a healthy rank's collective timeout does not wait for a stuck peer", async () => {
  // No heartbeat watchdog: only the collective timeout can see the stuck rank.
  await withPool({ worldSize: 2, timeoutMs: 400, heartbeatTimeoutMs: 0 }, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const t0 = Date.now();
    await assert.rejects(wg.spinOn(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerError, `${e.name}: ${e.message}`);
      assert.match(e.message, /spinOn failed on rank 0: CollectiveError: collective allReduce timed out after 0\.4 s .*ranks \[1\] did not arrive/);
      assert.match(e.message, /\(also rank 1: has not answered spinOn yet/);
      return true;
    });
    assert.ok(Date.now() - t0 < 5000, "reported without waiting for rank 1");
  }, 15_000);
});

test("error messages are one summary; the worker's stack is kept in .stack and .workerStack", async () => {
  await withPool(2, async (pool) => {
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    await assert.rejects(wg.failOn(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerError);
      assert.equal(e.message, "failOn failed on rank 1: Error: boom on rank 1");
      assert.match(e.stack!, /--- worker stack \(rank 1\) ---\nError: boom on rank 1\n\s+at throwDeep/);
      return true;
    });
  });
});
