import { test } from "node:test";
import assert from "node:assert/strict";
import { backendImporters, resolveBackendName, initBackend, currentBackend } from "../../src/engine/backend.js";

test("auto falls back to wasm when tfjs-node cannot be imported", async () => {
  const saved = backendImporters.tensorflow;
  try {
    backendImporters.tensorflow = async () => { throw new Error("Cannot find module '@tensorflow/tfjs-node'"); };
    assert.equal(await resolveBackendName("auto"), "wasm");
    await assert.rejects(resolveBackendName("tensorflow"), /tfjs-node.*not installed/);
    backendImporters.tensorflow = async () => ({});
    assert.equal(await resolveBackendName("auto"), "tensorflow");
    assert.equal(await resolveBackendName("tensorflow"), "tensorflow");
  } finally {
    backendImporters.tensorflow = saved;
  }
});

test("explicit names pass through; unknown names list the choices", async () => {
  assert.equal(await resolveBackendName("cpu"), "cpu");
  assert.equal(await resolveBackendName("wasm"), "wasm");
  await assert.rejects(initBackend("tpu"), /unknown engine backend 'tpu'; choose one of auto, wasm, cpu, tensorflow, webgpu/);
});

test("initBackend switches between cpu and wasm and reports the backend in use", async () => {
  assert.equal(await initBackend("cpu"), "cpu");
  assert.equal(currentBackend(), "cpu");
  assert.equal(await initBackend("wasm"), "wasm");
  assert.equal(await initBackend("auto"), "wasm"); // already initialised: auto keeps it
});
