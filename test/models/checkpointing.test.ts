import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import { LoraAdapter } from "../../src/models/lora.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { Rng } from "../../src/utils/rng.js";

const config = makeConfig({ vocabSize: 48, dim: 32, nLayers: 3, nHeads: 4, nKvHeads: 2, hiddenDim: 64, attentionBias: true });
const B = 3, T = 7;
const ids = Array.from({ length: B * T }, (_, i) => (i * 7 + 3) % 48);
// left padding on row 1, right padding on row 2
const mask = [1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0];

/** Gradients of a weighted sum of the logits w.r.t. the model's trainable variables, by name. */
function grads(m: LlamaModel): Map<string, Float32Array> {
  const names = [...m.trainableParams().keys()];
  const { value, grads: g } = tf.variableGrads(() => {
    const logits = m.forward(tf.tensor2d(ids, [B, T], "int32"), { attentionMask: mask });
    const w = tf.tensor(Float32Array.from({ length: logits.size }, (_, i) => Math.sin(i)), logits.shape);
    return tf.sum(tf.mul(logits, w)) as tf.Scalar;
  }, m.trainableVariables());
  const out = new Map<string, Float32Array>();
  const byVar = new Map([...m.trainableParams()].map(([n, v]) => [v.name, n]));
  for (const [vn, t] of Object.entries(g)) out.set(byVar.get(vn)!, t.dataSync() as Float32Array);
  tf.dispose([value, ...Object.values(g)]);
  assert.equal(out.size, names.length, "every trainable variable gets a gradient");
  return out;
}

function assertClose(a: Map<string, Float32Array>, b: Map<string, Float32Array>, tol: number): void {
  assert.deepEqual([...a.keys()].sort(), [...b.keys()].sort());
  for (const [n, x] of a) {
    const y = b.get(n)!;
    let worst = 0, scale = 0;
    for (let i = 0; i < x.length; i++) { worst = Math.max(worst, Math.abs(x[i]! - y[i]!)); scale = Math.max(scale, Math.abs(x[i]!)); }
    assert.ok(worst <= tol * Math.max(1, scale), `${n}: max |diff| ${worst} (scale ${scale})`);
  }
}

for (const backend of ["wasm", "cpu"]) {
  test(`gradient checkpointing gives the same gradients as keeping activations (${backend}, full and LoRA)`, async () => {
    await initBackend(backend);
    const m = initModel(config, new Rng(3));
    try {
      const plain = grads(m);
      m.gradientCheckpointing = true;
      const before = tf.memory().numTensors;
      const ckpt = grads(m);
      assert.equal(tf.memory().numTensors, before, "no tensor leaks from the recomputed layers");
      assertClose(plain, ckpt, 1e-5);
      // LoRA: adapters only (B made non-zero so every adapter gets a real gradient)
      m.gradientCheckpointing = false;
      m.lora = LoraAdapter.init(config, { rank: 4, alpha: 8, targetModules: "all-linear" }, new Rng(5));
      for (const mod of m.lora.modules.values()) mod.b.assign(tf.randomNormal(mod.b.shape, 0, 0.1, "float32", 9));
      const lp = grads(m);
      assert.ok([...lp.keys()].every((n) => n.includes(".lora_")), "only adapters are trainable");
      m.gradientCheckpointing = true;
      assertClose(lp, grads(m), 1e-5);
    } finally {
      m.dispose();
    }
  });
}
