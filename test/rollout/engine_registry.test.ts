import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigView } from "../../src/workers/config_view.js";
import { createRolloutEngine, registerRolloutEngine, rolloutEngineNames, HostRolloutEngine, LlamaCppRolloutEngine, type RolloutEngine } from "../../src/rollout/index.js";
import { BestAvailableRolloutEngine, WebGpuRolloutEngine } from "../../src/rollout/engines/index.js";
import { importNodeLlamaCpp } from "../../src/rollout/llama_cpp/binding.js";
import { DataProto } from "../../src/protocol/data_proto.js";

const rolloutView = (over: Record<string, unknown> = {}) =>
  new ConfigView({ actor_rollout_ref: { rollout: { name: "tfjs", max_num_seqs: 256, engine_kwargs: { llama_cpp: { weight_dtype: "f16", kv_cache_dtype: "f32", gpu: "cpu", gguf_dir: "/tmp", threads: 1, flash_attention: false } }, ...over } } }).at("actor_rollout_ref.rollout");

test("rollout engine registry: the host engine answers to tfjs, hf, naive; verl's vllm/sglang pick the GPU engine on WebGPU; llama_cpp reads engine_kwargs.llama_cpp", () => {
  for (const name of ["tfjs", "hf", "naive"]) assert.ok(createRolloutEngine(name, { rollout: rolloutView(), rank: 0 }) instanceof HostRolloutEngine, name);
  for (const name of ["vllm", "sglang"]) assert.ok(createRolloutEngine(name, { rollout: rolloutView(), rank: 0 }) instanceof BestAvailableRolloutEngine, name);
  assert.ok(createRolloutEngine("webgpu", { rollout: rolloutView(), rank: 0 }) instanceof WebGpuRolloutEngine);
  const llama = createRolloutEngine("llama_cpp", { rollout: rolloutView({ max_num_seqs: 1000 }), rank: 1 });
  assert.ok(llama instanceof LlamaCppRolloutEngine);
  assert.deepEqual((llama as LlamaCppRolloutEngine).settings, {
    weightType: "f16", kvCacheType: "f32", gpu: "cpu", ggufDir: "/tmp", threads: 1, flashAttention: false, maxNumSeqs: 256,
  });
  assert.throws(() => createRolloutEngine("llama_cpp", { rollout: rolloutView({ engine_kwargs: { llama_cpp: { kv_cache_dtype: "q4" } } }), rank: 0 }),
    /actor_rollout_ref\.rollout\.engine_kwargs\.llama_cpp\.kv_cache_dtype must be one of f32, f16, got 'q4'/);
  assert.throws(() => createRolloutEngine("trt", { rollout: rolloutView(), rank: 0 }), /unknown rollout engine \(actor_rollout_ref\.rollout\.name\) 'trt' \(known: .*tfjs.*llama_cpp/);
});

test("rollout engine registry: users register their own engine and the name selects it", async () => {
  class EchoEngine implements RolloutEngine {
    readonly name = "echo";
    async generate(): Promise<DataProto> { return new DataProto({}, {}, { engine: "echo" }); }
    async dispose(): Promise<void> {}
  }
  registerRolloutEngine("echo_test", () => new EchoEngine());
  assert.ok(rolloutEngineNames().includes("echo_test"));
  const e = createRolloutEngine("echo_test", { rollout: rolloutView(), rank: 0 });
  assert.equal(e.name, "echo");
  assert.throws(() => registerRolloutEngine("tfjs", () => new EchoEngine()), /already registered/);
});

test("llama_cpp binding: a missing node-llama-cpp is a clear error naming the package, version and install command", async () => {
  await assert.rejects(importNodeLlamaCpp("node-llama-cpp-not-installed-here"),
    /rollout\.name=llama_cpp needs the optional package node-llama-cpp@3\.21\.1 \(installed on request: bash scripts\/install-optional\.sh llama, or npm install --no-save node-llama-cpp@3\.21\.1\)/);
});
