// Issue 28 item 9: the defaults fail a stuck rank within a minute, and a runaway allocation
// in a rank thread becomes an error naming the rank and the limit (trainer.rank_heap_limit_mb).
import { test } from "node:test";
import assert from "node:assert/strict";
import { composeConfig, getPath } from "../../src/config/index.js";
import {
  ClassWithInitArgs, DEFAULT_HEARTBEAT_TIMEOUT_MS, DEFAULT_RANK_HEAP_LIMIT_MB, ResourcePool, WorkerDiedError, WorkerGroup,
  rankHeapLimitFromConfig,
} from "../../src/single_controller/index.js";
import { containmentOptions } from "../../src/reward/contained.js";
import type { EchoWorker } from "./fixtures/workers.js";
import { fixture } from "./helpers.js";

process.env.VERL_LOG_LEVEL ??= "fatal";
const echo = () => new ClassWithInitArgs(fixture("workers"), "EchoWorker");

test("a stuck rank fails within 60 s by default, in PPO and in SFT", () => {
  assert.ok(DEFAULT_HEARTBEAT_TIMEOUT_MS <= 60_000, `DEFAULT_HEARTBEAT_TIMEOUT_MS=${DEFAULT_HEARTBEAT_TIMEOUT_MS}`);
  for (const name of ["ppo_trainer", "sft_trainer"]) {
    const v = getPath(composeConfig({ configName: name }), "trainer.heartbeat_timeout");
    assert.equal(typeof v, "number", `${name}: trainer.heartbeat_timeout`);
    assert.ok((v as number) > 0 && (v as number) <= 60, `${name}: trainer.heartbeat_timeout=${String(v)}`);
    assert.equal(getPath(composeConfig({ configName: name }), "trainer.rank_heap_limit_mb"), DEFAULT_RANK_HEAP_LIMIT_MB, name);
  }
});

test("a hung JS reward fails within 60 s under the default naive, dapo and batch managers", () => {
  assert.ok(containmentOptions({}).timeoutS <= 60, `default timeout_s ${containmentOptions({}).timeoutS}`);
  // prime keeps verl's own 300 s (a timed-out sample there scores 0, it does not fail the step)
  assert.equal(containmentOptions({}, "prime").timeoutS, 300);
  assert.equal(containmentOptions({ timeout_s: 7 }).timeoutS, 7);
});

test("trainer.rank_heap_limit_mb: a number of MiB, null or 0 for V8's own limit, anything else refused", () => {
  assert.equal(rankHeapLimitFromConfig({ trainer: {} }), undefined);
  assert.equal(rankHeapLimitFromConfig({ trainer: { rank_heap_limit_mb: 512 } }), 512);
  assert.equal(rankHeapLimitFromConfig({ trainer: { rank_heap_limit_mb: null } }), 0);
  assert.equal(rankHeapLimitFromConfig({ trainer: { rank_heap_limit_mb: 0 } }), 0);
  assert.throws(() => rankHeapLimitFromConfig({ trainer: { rank_heap_limit_mb: "2g" } }), /trainer\.rank_heap_limit_mb must be/);
  assert.throws(() => rankHeapLimitFromConfig({ trainer: { rank_heap_limit_mb: 8 } }), /trainer\.rank_heap_limit_mb must be/);
});

test("a pool's rank threads get a heap limit by default", async () => {
  const pool = new ResourcePool({ worldSize: 1 });
  try {
    assert.equal(pool.rankHeapLimitMb, DEFAULT_RANK_HEAP_LIMIT_MB);
  } finally {
    await pool.destroy();
  }
});

test("a leaking loop that still reports progress is stopped by the heap limit, with an error naming the rank and the key", async () => {
  const pool = ResourcePool.fromConfig({ trainer: { n_gpus_per_node: 2, rank_heap_limit_mb: 64 } });
  try {
    assert.equal(pool.rankHeapLimitMb, 64);
    const wg = await WorkerGroup.create<EchoWorker>(pool, echo());
    const t0 = Date.now();
    await assert.rejects(wg.leakWithHeartbeatsOn(1).get(), (e: Error) => {
      assert.ok(e instanceof WorkerDiedError, `${e.name}: ${e.message}`);
      assert.equal(e.rank, 1);
      assert.match(e.message, /rank 1/);
      assert.match(e.message, /ran out of memory: its V8 heap reached trainer\.rank_heap_limit_mb=64/);
      return true;
    });
    assert.ok(Date.now() - t0 < 20_000, `took ${Date.now() - t0} ms`);
    assert.equal(pool.alive, false);
  } finally {
    await pool.destroy();
  }
});
