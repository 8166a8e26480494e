// The WebGPU decoder on the model families it serves (Qwen3 dense: its q/k norms), against
// transformers' greedy tokens and log-probs from the committed fixtures; the families it does
// not serve are refused naming them (checked everywhere). The GPU part runs where a WebGPU
// adapter exists (the H200, or llvmpipe as docs/gpu.md explains) and skips with one line elsewhere.
import { test } from "node:test";
import assert from "node:assert/strict";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import { defaultSamplingParams, leftPadPrompts } from "../../src/rollout/index.js";
import { WebGpuDecoder } from "../../src/rollout/webgpu_decoder.js";
import { Rng } from "../../src/utils/rng.js";
import { fixtureDir, maxDiff, reference } from "./families_fixtures.js";

const R = 32;
const greedy = () => defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true });

test("the WebGPU decoder refuses the families it does not serve, naming them", async () => {
  await initBackend("wasm");
  for (const [name, re] of [["gemma2", /does not serve gemma2/], ["qwen3_moe", /does not serve qwen3_moe \(routed experts\)/], ["mistral", /does not serve mistral with sliding_window 8/], ["llama_bias", /attention_bias \(an o_proj bias\)/]] as const) {
    const m = await loadHfModel(fixtureDir(name));
    try {
      await assert.rejects(new WebGpuDecoder().generate(m, leftPadPrompts([[1, 2]], 0), greedy(), new Rng(0)), re, name);
    } finally {
      m.dispose();
    }
  }
});

test("Qwen3 (tied and untied) on the WebGPU decoder: transformers' greedy tokens and log-probs", async (t) => {
  try {
    await initBackend("webgpu");
  } catch (e) {
    return t.skip(`no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`);
  }
  for (const name of ["qwen3", "qwen3_untied"]) {
    const ref = reference(name), m = await loadHfModel(fixtureDir(name));
    try {
      const out = await new WebGpuDecoder().generate(m, leftPadPrompts(ref.prompts, 0), greedy(), new Rng(0));
      const resp = out.batch["responses"]!.data, lp = out.batch["rollout_log_probs"]!.data;
      for (let i = 0; i < ref.prompts.length; i++) {
        assert.deepEqual(Array.from(resp.subarray(i * R, (i + 1) * R)), ref.greedy[i], `${name} prompt ${i}: greedy tokens`);
        const d = maxDiff(lp.subarray(i * R, (i + 1) * R), ref.tensors.get(`logprobs_${i}`)!.data);
        assert.ok(d < 1e-4, `${name} prompt ${i}: log-probs differ by ${d}`);
      }
    } finally {
      m.dispose();
    }
  }
});
