// The webgpu backend on a machine without a GPU (CI, this host): clear errors, never a hang.
import { test } from "node:test";
import assert from "node:assert/strict";
import { initBackend } from "../../src/engine/backend.js";

test("webgpu without an adapter (or without the optional Dawn package) fails with a clear error", async () => {
  await assert.rejects(initBackend("webgpu"), /engine backend 'webgpu': (no GPU adapter found|needs the optional 'webgpu' package)/);
});

test("training on webgpu takes one rank, with the reason", async () => {
  const { initWorkerBackend } = await import("../../src/workers/worker_setup.js");
  await assert.rejects(initWorkerBackend("webgpu", 2), /trainer\.device=webgpu runs one rank \(trainer\.n_gpus_per_node=1\), got 2/);
});
