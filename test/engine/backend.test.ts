import { test } from "node:test";
import assert from "node:assert/strict";
import { backendImporters, resolveBackendName, initBackend, currentBackend } from "../../src/engine/backend.js";

test("auto falls back to wasm when tfjs-node cannot be imported, and says why once", async () => {
  const saved = backendImporters.tensorflow;
  const write = process.stderr.write;
  const lines: string[] = [];
  try {
    backendImporters.tensorflow = async () => { throw new Error("Cannot find module '@tensorflow/tfjs-node'"); };
    process.stderr.write = ((chunk: string) => { lines.push(String(chunk)); return true; }) as typeof process.stderr.write;
    try {
      assert.equal(await resolveBackendName("auto"), "wasm");
      assert.equal(await resolveBackendName("auto"), "wasm");
    } finally {
      process.stderr.write = write;
    }
    assert.equal(lines.length, 1, lines.join(""));
    assert.match(lines[0]!, /^trainer\.device=auto: using wasm, not tensorflow: @tensorflow\/tfjs-node-gpu is not installed \(an optional dependency: npm drops it when its install script fails.*npm install @tensorflow\/tfjs-node-gpu@4\.22\.0/);
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
