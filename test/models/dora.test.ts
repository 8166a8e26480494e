// DoRA (peft's use_dora, Megatron-Bridge's lora.type=dora): W' = m (W + s B A) / ||W + s B A||
// per output row, m trained, the norm detached; merged for the rollout and the export, and saved
// in peft's layout (use_dora, lora_magnitude_vector).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { loadHfModel, saveHfModel } from "../../src/models/hf.js";
import { initModel } from "../../src/models/init.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { doraWeightNorm, LoraAdapter } from "../../src/models/lora.js";
import { AdapterDropout } from "../../src/models/lora_dropout.js";
import { loraLinear } from "../../src/models/lora_linear.js";
import { loadLoraAdapter, saveLoraAdapter } from "../../src/models/peft.js";
import { readSafetensors } from "../../src/models/safetensors.js";
import { Rng } from "../../src/utils/rng.js";
import { decodeBothWays } from "./decode_both.js";

const config = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false, maxSeqLen: 64 });
const IDS = [1, 5, 9, 13, 2, 7, 3, 3, 8, 21, 30, 4];
const TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"];

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

const logits = (m: LlamaModel) => tf.tidy(() => Float32Array.from(m.forward(tf.tensor2d(IDS, [2, 6], "int32")).dataSync()));

function dora(m: LlamaModel): LoraAdapter {
  return LoraAdapter.init(config, { rank: 4, alpha: 8, targetModules: TARGETS, useDora: true }, new Rng(2), "model", (n) => m.p(`${n}.weight`) as tf.Tensor2D);
}

/** Move B and m off their initial values, so the adapter and the magnitude both matter. */
function perturb(adapter: LoraAdapter): void {
  let s = 30;
  for (const mod of adapter.modules.values()) {
    mod.b.assign(tf.randomNormal(mod.b.shape, 0, 0.3, "float32", s++));
    mod.magnitude!.assign(tf.tidy(() => mod.magnitude!.mul(tf.randomUniform(mod.magnitude!.shape, 0.7, 1.3, "float32", s++))));
  }
}

test("DoRA at initialisation is the base model: m starts at the row norms of W (B = 0), and trains beside A and B", async () => {
  await initBackend("cpu");
  const m = initModel(config, new Rng(1));
  const base = logits(m);
  m.lora = dora(m);
  assert.ok(maxDiff(logits(m), base) < 1e-5, `fresh DoRA vs base: ${maxDiff(logits(m), base)}`);
  const q = "model.layers.0.self_attn.q_proj";
  const want = tf.tidy(() => Array.from(tf.norm(m.p(`${q}.weight`), "euclidean", 1).dataSync()));
  assert.ok(maxDiff(m.lora.modules.get(q)!.magnitude!.dataSync(), want) < 1e-5, "m = ||W|| per output row");
  const named = m.lora.namedParams();
  assert.deepEqual(named.get(`${q}.lora_magnitude_vector`)!.shape, [16]);
  assert.equal(named.size, 3 * 5 * 2);
  // the reference policy is the adapter-off model: the same as a fresh DoRA model, and unchanged after training moves m
  perturb(m.lora);
  assert.ok(maxDiff(logits(m), base) > 1e-3, "a trained DoRA adapter moves the logits");
  assert.equal(maxDiff(logits(m.withoutAdapter()), base), 0);
  m.dispose();
});

test("DoRA gradients: finite differences of m, A and B (the norm held constant, as it is detached), with and without input dropout", async () => {
  await initBackend("cpu");
  const r = (s: number[], seed: number) => tf.randomNormal(s, 0, 0.5, "float32", seed);
  const x = r([5, 6], 1) as tf.Tensor2D, w = r([4, 6], 2) as tf.Tensor2D, w1 = r([3, 6], 8) as tf.Tensor2D;
  const a = r([2, 6], 3) as tf.Tensor2D, b = r([4, 2], 4) as tf.Tensor2D, m = tf.add(r([4], 5), 2) as tf.Tensor1D, dy = r([5, 7], 6);
  const s = 1.5, norm = doraWeightNorm(w, a, b, s);
  for (const dropIn of [undefined, new AdapterDropout(0.3, "pre", 4).mask("k", 5, 6)]) {
    const f = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor, mm: tf.Tensor) =>
      loraLinear(xx as tf.Tensor2D, [{ w, a: aa as tf.Tensor2D, b: bb as tf.Tensor2D, magnitude: mm as tf.Tensor1D, weightNorm: norm, ...(dropIn ? { dropIn } : {}) }, { w: w1 }], s);
    const loss = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor, mm: tf.Tensor) => tf.tidy(() => f(xx, aa, bb, mm).mul(dy).sum().dataSync()[0]!);
    const grads = tf.grads(f)([x, a, b, m], dy);
    const ins = [x, a, b, m];
    const h = 1e-2;
    ins.forEach((t, k) => {
      const g = grads[k]!.dataSync(), v = t.dataSync();
      for (let i = 0; i < v.length; i++) {
        const at = (d: number) => {
          const p = Float32Array.from(v);
          p[i]! += d;
          const pt = tf.tensor(p, t.shape);
          const args = ins.map((u, j) => (j === k ? pt : u));
          const out = loss(args[0]!, args[1]!, args[2]!, args[3]!);
          pt.dispose();
          return out;
        };
        const fd = (at(h) - at(-h)) / (2 * h);
        assert.ok(Math.abs(fd - g[i]!) < 2e-2 * Math.max(1, Math.abs(fd)), `${dropIn ? "dropout" : "no dropout"}: input ${k}[${i}]: analytic ${g[i]} vs finite difference ${fd}`);
      }
    });
    if (!dropIn) {
      // without dropout the block is m (W + s B A) / ||W + s B A|| x
      const want = tf.tidy(() => tf.matMul(x, tf.add(w, tf.matMul(b, a).mul(s)).mul(m.div(norm).reshape([-1, 1])), false, true).dataSync());
      assert.ok(maxDiff(f(x, a, b, m).slice([0, 0], [5, 4]).dataSync(), want) < 1e-5);
    }
    tf.dispose(grads);
  }
});

test("DoRA on the model: the gradient of m matches finite differences of the loss; A and B train", async () => {
  await initBackend("cpu");
  const model = initModel(config, new Rng(1));
  model.lora = dora(model);
  perturb(model.lora);
  const ids = tf.tensor2d(IDS, [2, 6], "int32"), weights = tf.randomNormal([2, 6, 40], 0, 1, "float32", 7);
  const loss = () => tf.tidy(() => model.forward(ids).mul(weights).sum().dataSync()[0]!);
  const named = model.lora.namedParams();
  const { grads } = tf.variableGrads(() => model.forward(ids).mul(weights).sum() as tf.Scalar, [...named.values()]);
  const mName = "model.layers.1.self_attn.o_proj.lora_magnitude_vector", mv = named.get(mName)!;
  const g = grads[mv.name]!.dataSync(), v = Float32Array.from(mv.dataSync()), h = 1e-2;
  for (let i = 0; i < v.length; i++) {
    const at = (d: number) => { const p = Float32Array.from(v); p[i]! += d; mv.assign(tf.tensor1d(p)); return loss(); };
    const fd = (at(h) - at(-h)) / (2 * h);
    mv.assign(tf.tensor1d(v));
    assert.ok(Math.abs(fd - g[i]!) < 2e-2 * Math.max(1, Math.abs(fd)), `${mName}[${i}]: ${g[i]} vs ${fd}`);
  }
  for (const n of ["model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.0.mlp.down_proj.lora_B.weight"]) {
    assert.ok(grads[named.get(n)!.name]!.abs().max().dataSync()[0]! > 0, `${n} has a gradient`);
  }
  tf.dispose([ids, weights, ...Object.values(grads)]);
  model.dispose();
});

test("DoRA: merged weights reproduce the adapted model (rollout and HF export); peft folder with use_dora and lora_magnitude_vector, reloaded to the same logits", async () => {
  await initBackend("wasm");
  const m = initModel(config, new Rng(1));
  m.lora = dora(m);
  perturb(m.lora);
  const want = logits(m);
  const dir = mkdtempSync(join(tmpdir(), "dora-"));
  try {
    await saveLoraAdapter(m.lora, join(dir, "adapter"));
    const cfg = JSON.parse(readFileSync(join(dir, "adapter", "adapter_config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(cfg.use_dora, true);
    assert.equal(cfg.peft_type, "LORA");
    const st = readSafetensors(join(dir, "adapter", "adapter_model.safetensors")).tensors;
    // peft's saved name has no ".weight" (get_peft_model_state_dict strips it for DoRA)
    assert.deepEqual(st.get("base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector")!.shape, [16]);
    assert.deepEqual(st.get("base_model.model.model.layers.1.self_attn.k_proj.lora_magnitude_vector")!.shape, [8]);
    assert.equal(st.size, 3 * 5 * 2);
    const fresh = initModel(config, new Rng(1));
    fresh.lora = loadLoraAdapter(join(dir, "adapter"), config);
    assert.equal(fresh.lora.settings.useDora, true);
    assert.equal(maxDiff(logits(fresh), want), 0, "the reloaded DoRA adapter gives the same logits");
    fresh.dispose();

    await saveHfModel(m, join(dir, "merged"));
    const merged = await loadHfModel(join(dir, "merged"));
    assert.ok(maxDiff(logits(merged), want) < 1e-4, `merged export: ${maxDiff(logits(merged), want)}`);
    merged.dispose();
  } finally {
    m.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("DoRA: the KV-cache decoder on merged weights gives the adapted training forward's greedy tokens", async () => {
  await initBackend("wasm");
  const m = initModel(config, new Rng(1));
  m.lora = dora(m);
  perturb(m.lora);
  try {
    const { fast, slow } = decodeBothWays(m);
    assert.deepEqual(Array.from(fast.batch["responses"]!.data), Array.from(slow.batch["responses"]!.data));
    const lf = fast.batch["rollout_log_probs"]!.data, ls = slow.batch["rollout_log_probs"]!.data;
    assert.ok(maxDiff(lf, ls) < 1e-4, `log-probs: merged decode vs adapted forward ${maxDiff(lf, ls)}`);
  } finally {
    m.dispose();
  }
});
