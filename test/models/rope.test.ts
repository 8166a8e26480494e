// RoPE theta and scaling from both config.json layouts (transformers 4: rope_theta + rope_scaling,
// transformers 5: rope_parameters), the scaled frequencies against values computed independently in
// float32 with numpy from transformers' formulas (modeling_rope_utils), and the export writing them back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { fromHfConfig, makeConfig, toHfConfig } from "../../src/models/config.js";
import { loadHfModel, saveHfModel } from "../../src/models/hf.js";
import { initModel } from "../../src/models/init.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { ropeInvFreq } from "../../src/models/rope.js";
import { Rng } from "../../src/utils/rng.js";

const QWEN = {
  architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", vocab_size: 24, hidden_size: 16, intermediate_size: 20,
  num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 32, rms_norm_eps: 1e-6,
};

function close(got: ArrayLike<number>, want: number[], what: string): void {
  assert.equal(got.length, want.length, what);
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= 1e-6 * Math.abs(want[i]!), `${what}[${i}]: ${got[i]} vs ${want[i]}`);
}

test("rope_theta is read from transformers 5's rope_parameters and from the top level", () => {
  assert.equal(fromHfConfig({ ...QWEN, rope_parameters: { rope_theta: 1e6, rope_type: "default" } }).ropeTheta, 1e6);
  assert.equal(fromHfConfig({ ...QWEN, rope_theta: 1e6, rope_scaling: null }).ropeTheta, 1e6);
  assert.equal(fromHfConfig({ ...QWEN }).ropeTheta, 10000);
  assert.equal(fromHfConfig({ ...QWEN, rope_parameters: { rope_theta: 1e6, rope_type: "default" } }).ropeScaling, null);
});

test("linear, dynamic and llama3 scaling give transformers' frequencies (head_dim 8, theta 1e4)", () => {
  // numpy float32, transformers' formulas: default, linear factor 4, dynamic factor 2 at 64 of 32 positions,
  // llama3 factor 8, low/high_freq_factor 1/4, original_max_position_embeddings 64 (one band each).
  close(ropeInvFreq(8, 1e4), [1.0, 0.10000000149011612, 0.009999999776482582, 0.0010000000474974513], "default");
  const linear = fromHfConfig({ ...QWEN, hidden_size: 16, num_attention_heads: 2, rope_parameters: { rope_type: "linear", factor: 4, rope_theta: 1e4 } });
  assert.deepEqual(linear.ropeScaling, { type: "linear", factor: 4 });
  close(ropeInvFreq(8, 1e4, linear.ropeScaling), [0.25, 0.02500000037252903, 0.0024999999441206455, 0.0002500000118743628], "linear");
  const dynamic = fromHfConfig({ ...QWEN, rope_theta: 1e4, rope_scaling: { type: "dynamic", factor: 2 } });
  close(ropeInvFreq(8, 1e4, dynamic.ropeScaling, 32), [1.0, 0.10000000149011612, 0.009999999776482582, 0.0010000000474974513], "dynamic within max_position_embeddings");
  close(ropeInvFreq(8, 1e4, dynamic.ropeScaling, 64), [1.0, 0.06933612376451492, 0.004807498771697283, 0.00033333332976326346], "dynamic at twice the length");
  const llama3 = fromHfConfig({
    ...QWEN, architectures: ["LlamaForCausalLM"], model_type: "llama", max_position_embeddings: 512,
    rope_parameters: { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64, rope_theta: 1e4 },
  });
  close(ropeInvFreq(8, 1e4, llama3.ropeScaling), [1.0, 0.013042256236076355, 0.0012499999720603228, 0.0001250000059371814], "llama3");
});

test("unknown rope types and bad factors are refused naming the file and key", () => {
  assert.throws(() => fromHfConfig({ ...QWEN, rope_parameters: { rope_type: "yarn", factor: 4, rope_theta: 1e4 } }, "m/config.json"),
    /^Error: m\/config\.json: rope_parameters\.rope_type "yarn" is not supported \(supported: default, linear, dynamic, llama3\)/);
  assert.throws(() => fromHfConfig({ ...QWEN, rope_scaling: { type: "longrope" } }, "c.json"), /c\.json: rope_scaling\.rope_type "longrope" is not supported/);
  assert.throws(() => fromHfConfig({ ...QWEN, rope_scaling: { type: "linear" } }, "c.json"), /c\.json: rope_scaling\.factor must be a positive number, got undefined/);
  assert.throws(() => fromHfConfig({ ...QWEN, rope_parameters: { rope_type: "default", rope_theta: 1e4, partial_rotary_factor: 0.5 } }, "c.json"), /partial_rotary_factor 0\.5 is not supported/);
});

function logitsOf(m: LlamaModel, positions: number[]): number[] {
  return tf.tidy(() => {
    const ids = tf.tensor2d([[0, 1, 5, 9, 3]], [1, 5], "int32");
    const pos = tf.tensor2d([positions], [1, 5], "int32");
    return Array.from(m.forward(ids, { positionIds: pos }).dataSync());
  });
}

test("a Qwen2 folder with theta 1e6 in rope_parameters loads with 1e6; the export writes theta and scaling back", async () => {
  await initBackend("wasm");
  const dir = mkdtempSync(join(tmpdir(), "verl-rope-"));
  const m = initModel(makeConfig({ vocabSize: 24, dim: 16, hiddenDim: 20, nLayers: 1, nHeads: 2, nKvHeads: 1, attentionBias: true, ropeTheta: 1e6, maxSeqLen: 64 }), new Rng(4));
  try {
    const folder = join(dir, "qwen");
    await saveHfModel(m, folder);
    // Rewrite config.json as transformers 5 saves it: no top-level rope_theta / rope_scaling.
    const cj = JSON.parse(readFileSync(join(folder, "config.json"), "utf8")) as Record<string, unknown>;
    delete cj.rope_theta; delete cj.rope_scaling;
    cj.rope_parameters = { rope_theta: 1e6, rope_type: "default" };
    writeFileSync(join(folder, "config.json"), JSON.stringify(cj));
    const back = await loadHfModel(folder);
    assert.equal(back.config.ropeTheta, 1e6);
    const far = [40, 41, 42, 43, 44];
    assert.deepEqual(logitsOf(back, far), logitsOf(m, far));
    back.dispose();

    // Linear scaling changes the logits the way dividing the positions by the factor does, and is written back.
    cj.rope_parameters = { rope_theta: 1e6, rope_type: "linear", factor: 4 };
    writeFileSync(join(folder, "config.json"), JSON.stringify(cj));
    const scaled = await loadHfModel(folder);
    const l4 = logitsOf(scaled, [0, 4, 8, 12, 16]), plain = logitsOf(m, [0, 1, 2, 3, 4]);
    assert.ok(l4.every((x, i) => Math.abs(x - plain[i]!) < 1e-4), "positions 4k under factor 4 = positions k unscaled");
    const out = toHfConfig(scaled.config);
    assert.equal(out.rope_theta, 1e6);
    assert.deepEqual(out.rope_scaling, { rope_type: "linear", type: "linear", factor: 4 });
    assert.deepEqual(out.rope_parameters, { rope_type: "linear", factor: 4, rope_theta: 1e6 });
    assert.deepEqual(fromHfConfig(out).ropeScaling, { type: "linear", factor: 4 }, "the export reads back the same");
    scaled.dispose();
  } finally {
    m.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
});
