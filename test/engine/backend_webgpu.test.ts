// The webgpu backend on a machine without a GPU (CI, this host): clear errors, never a hang.
// Also the shutdown path WebGPU rank threads rely on: pool.destroy() runs each thread's closers
// (onThreadClose) before stopping it; releaseBackend is a no-op off WebGPU.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, existsSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isMainThread } from "node:worker_threads";
import { currentBackend, initBackend, releaseBackend } from "../../src/engine/backend.js";
import { ClassWithInitArgs, onThreadClose, register, ResourcePool, Worker, WorkerGroup } from "../../src/single_controller/index.js";

/** Registers closers in its rank thread: one writes a file named after the rank, one may throw. */
export class CloserWorker extends Worker {
  @register()
  arm(dir: string, failing: boolean): number {
    onThreadClose(() => writeFileSync(join(dir, `closed-${this.rank}`), String(this.rank)));
    if (failing) onThreadClose(() => { throw new Error("closer failed on purpose"); });
    return this.rank;
  }
}

if (isMainThread) {
  const NO_WEBGPU = /^(Error: )?trainer\.device=webgpu(: no GPU adapter found \(Dawn needs a GPU with a Vulkan driver\); use trainer\.device=auto| needs the 'webgpu' package \(Dawn\), installed on request: npm install --no-save webgpu@0\.6\.2)/;
  // where the machine has an adapter (a GPU, or a software Vulkan such as Mesa 25's lavapipe) there is nothing to refuse
  const refusal = (init: Promise<unknown>) => init.then(() => null, (e: unknown) => e as Error);
  const HAS_ADAPTER = "this machine has a WebGPU adapter (a GPU or a software Vulkan): the refusal cannot be tested here";

  test("webgpu without an adapter (or without the optional Dawn package) fails with a clear error", async (t) => {
    const e = await refusal(initBackend("webgpu"));
    if (e === null) return t.skip(HAS_ADAPTER); // kept for the next test, which releases it (a released webgpu backend cannot be set up again in this thread)
    assert.match(String(e), NO_WEBGPU);
  });

  test("a worker thread's backend setup on webgpu without a GPU fails with the adapter error", async (t) => {
    const { initWorkerBackend } = await import("../../src/workers/worker_setup.js");
    const e = await refusal(initWorkerBackend("webgpu"));
    if (e === null) { await releaseBackend(); return t.skip(HAS_ADAPTER); }
    assert.match(String(e), NO_WEBGPU);
  });

  test("releaseBackend leaves a CPU backend alone", async () => {
    const name = await initBackend("cpu");
    await releaseBackend();
    assert.equal(currentBackend(), name);
  });

  for (const failing of [false, true]) {
    test(`pool.destroy() runs every rank thread's closers before stopping it${failing ? " (a failing closer does not block the others)" : ""}`, async () => {
      const dir = mkdtempSync(join(tmpdir(), "verl-closers-"));
      const pool = new ResourcePool({ worldSize: 2, name: "closers" });
      try {
        const group = await WorkerGroup.create<CloserWorker>(pool, new ClassWithInitArgs(import.meta.url, "CloserWorker"));
        assert.deepEqual(await group.arm(dir, failing), [0, 1]);
        assert.equal(existsSync(join(dir, "closed-0")), false);
      } finally {
        await pool.destroy();
      }
      assert.equal(readFileSync(join(dir, "closed-0"), "utf8"), "0");
      assert.equal(readFileSync(join(dir, "closed-1"), "utf8"), "1");
    });
  }
}
