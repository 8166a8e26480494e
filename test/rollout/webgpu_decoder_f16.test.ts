// The WebGPU decoder's 16-bit products (rollout.dtype=bf16/fp16, issue 23): the config key, the
// refusal where the adapter lacks the tensor cores, and (where an adapter has them) f16 greedy
// tokens against the f32 decoder's. The numerics are measured on the H200 (bench/gpu_decode.ts
// --only precision; docs/gpu.md); llvmpipe has no subgroup matrices, so there the refusal runs.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { webgpuOrReason } from "../engine/webgpu_adapter.js";
import { PackedMatrix, tensorCoreSupport } from "../../src/engine/webgpu_kernels.js";
import { loadConfig } from "../../src/config/index.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { rolloutPrecision } from "../../src/rollout/engines/webgpu.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { defaultSamplingParams, leftPadPrompts } from "../../src/rollout/index.js";
import { WebGpuDecoder } from "../../src/rollout/webgpu_decoder.js";
import { Rng } from "../../src/utils/rng.js";

const view = (overrides: string[]) => ({ rollout: new ConfigView(loadConfig({ configName: "ppo_trainer", overrides }), "actor_rollout_ref.rollout"), rank: 0 });

test("rollout.dtype: float32 by default, verl's names for 16-bit, a bad value names the key", () => {
  assert.equal(rolloutPrecision(view([])).precision, "f32");
  assert.equal(rolloutPrecision(view(["actor_rollout_ref.rollout.dtype=bfloat16"])).precision, "bf16");
  assert.equal(rolloutPrecision(view(["actor_rollout_ref.rollout.dtype=fp16"])).precision, "f16");
  assert.throws(() => rolloutPrecision(view(["actor_rollout_ref.rollout.dtype=int8"])), /actor_rollout_ref\.rollout\.dtype: unknown dtype 'int8'/);
});


const tiny = () => initModel(makeConfig({ vocabSize: 300, dim: 64, hiddenDim: 96, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, maxSeqLen: 64 }), new Rng(1));
const greedy = (n: number) => defaultSamplingParams({ temperature: 0, responseLength: n, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true });

test("16-bit products on an adapter without the tensor cores: a clear error", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (tensorCoreSupport.available) return t.skip("this adapter has the tensor cores (the next test runs)");
  const m = tiny();
  try {
    await assert.rejects(new WebGpuDecoder({ precision: "f16" }).generate(m, leftPadPrompts([[1, 2, 3]], 0), greedy(2), new Rng(0)),
      /rollout engine 'webgpu': f16 products need the tensor-core kernel, which this adapter cannot run/);
  } finally {
    m.dispose();
  }
});

test("16-bit products: greedy tokens as the f32 decoder's, weights packed once, live tensors flat", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  const m = tiny();
  try {
    const rng = new Rng(3), batch = leftPadPrompts(Array.from({ length: 6 }, (_, i) => Array.from({ length: 2 + i }, () => 1 + Math.floor(rng.random() * 299))), 0);
    const f32 = await new WebGpuDecoder().generate(m, batch, greedy(12), new Rng(0));
    const dec = new WebGpuDecoder({ precision: "f16" });
    await dec.generate(m, batch, greedy(12), new Rng(0));
    const live = tf.memory().numTensors, packs = PackedMatrix.packs;
    const f16 = await dec.generate(m, batch, greedy(12), new Rng(0));
    assert.equal(tf.memory().numTensors, live);
    assert.equal(PackedMatrix.packs, packs, "the unchanged weights are not packed again");
    // rows whose f16 tokens follow the f32 decoder's from the first token on (rounding may flip a near tie)
    const R = 12, a = f32.batch["responses"]!.data, b = f16.batch["responses"]!.data;
    let same = 0;
    for (let r = 0; r < 6; r++) if (a.slice(r * R, r * R + R).every((x, i) => x === b[r * R + i])) same++;
    assert.ok(same >= 4, `only ${same} of 6 rows decode as in f32`);
  } finally {
    m.dispose();
  }
});
