import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { loadHfModel, saveHfModel } from "../../src/models/hf.js";
import { initModel } from "../../src/models/init.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { LoraAdapter, selectTargets } from "../../src/models/lora.js";
import { loraLinear } from "../../src/models/lora_linear.js";
import { loadLoraAdapter, saveLoraAdapter } from "../../src/models/peft.js";
import { readSafetensors } from "../../src/models/safetensors.js";
import { generate } from "../../src/rollout/index.js";
import { Rng } from "../../src/utils/rng.js";
import { DECODE_PROMPTS, decodeBothWays, GREEDY } from "./decode_both.js";

const config = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false, maxSeqLen: 64 });
const ids = [[1, 5, 9, 13, 2, 7], [3, 3, 8, 21, 30, 4]];

function logits(m: LlamaModel): Float32Array {
  return tf.tidy(() => m.forward(tf.tensor2d(ids.flat(), [2, 6], "int32")).dataSync() as Float32Array);
}

function maxDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

/** A LoRA model whose B matrices are non-zero (a fresh adapter is the identity). */
function adapted(targets: string | string[] = "all-linear"): LlamaModel {
  const m = initModel(config, new Rng(1));
  m.lora = LoraAdapter.init(config, { rank: 4, alpha: 8, targetModules: targets }, new Rng(2));
  let s = 10;
  for (const mod of m.lora.modules.values()) mod.b.assign(tf.randomNormal(mod.b.shape, 0, 0.2, "float32", s++));
  return m;
}

test("target_modules: all-linear leaves the output layer out; names match as suffixes, strings as full regexes; exclude_modules", () => {
  const all = selectTargets(config, { rank: 2, alpha: 4, targetModules: "all-linear" });
  assert.equal(all.length, 2 * 7);
  assert.ok(!all.includes("lm_head"));
  assert.deepEqual(selectTargets(config, { rank: 2, alpha: 4, targetModules: ["q_proj", "v_proj"] }), [
    "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj",
  ]);
  assert.deepEqual(selectTargets(config, { rank: 2, alpha: 4, targetModules: "model\\.layers\\.1\\..*_proj", excludeModules: ["mlp.down_proj"] }).length, 6);
  assert.deepEqual(selectTargets(config, { rank: 2, alpha: 4, targetModules: ["lm_head"] }), ["lm_head"]);
  assert.throws(() => selectTargets(config, { rank: 2, alpha: 4, targetModules: ["wq"] }, "actor_rollout_ref.model"), /actor_rollout_ref\.model\.target_modules.*matches no linear module/);
  assert.throws(() => LoraAdapter.init(config, { rank: 0, alpha: 4, targetModules: "all-linear" }, new Rng(0)), /lora_rank must be a positive integer/);
});

test("LoRA: A is kaiming-uniform (bound 1/sqrt(in)) and seeded, B is zero, so a fresh adapter leaves the logits unchanged", async () => {
  await initBackend("wasm");
  const m = initModel(config, new Rng(1));
  try {
    const base = logits(m);
    m.lora = LoraAdapter.init(config, { rank: 4, alpha: 16, targetModules: "all-linear" }, new Rng(2));
    assert.equal(m.lora.scale, 4);
    const q = m.lora.modules.get("model.layers.0.self_attn.q_proj")!;
    const a = q.a.dataSync();
    assert.ok(a.every((x) => Math.abs(x) <= 1 / Math.sqrt(16)) && a.some((x) => Math.abs(x) > 0.5 / Math.sqrt(16)));
    assert.ok(q.b.dataSync().every((x) => x === 0));
    assert.deepEqual(Array.from(a), Array.from(LoraAdapter.init(config, { rank: 4, alpha: 16, targetModules: "all-linear" }, new Rng(2)).modules.get("model.layers.0.self_attn.q_proj")!.a.dataSync()));
    assert.deepEqual(Array.from(logits(m)), Array.from(base));
    // only the adapter trains
    assert.equal(m.trainableVariables().length, 2 * 14);
    assert.ok([...m.trainableParams().keys()].every((n) => /\.lora_[AB]\.weight$/.test(n)));
  } finally {
    m.dispose();
  }
});

test("LoRA: the reference view (adapter off) gives the base logits and shares the weights; gradients reach adapters only", async () => {
  await initBackend("wasm");
  const m = adapted();
  try {
    const ref = m.withoutAdapter();
    assert.equal(ref.params, m.params, "no second copy of the weights");
    const tmp = m.lora;
    m.lora = undefined;
    const base = logits(m);
    m.lora = tmp;
    assert.deepEqual(Array.from(logits(ref)), Array.from(base));
    ref.dispose(); // a view: the model's weights stay
    assert.ok(!m.p("model.embed_tokens.weight").isDisposed);
  } finally {
    m.dispose();
  }
  const m2 = adapted(["q_proj", "down_proj"]);
  try {
    const { value, grads } = tf.variableGrads(() => tf.sum(tf.square(m2.forward(tf.tensor2d(ids.flat(), [2, 6], "int32")))) as tf.Scalar);
    const names = Object.keys(grads);
    assert.equal(names.length, 8, "A and B of 4 modules, nothing else");
    assert.ok(names.every((n) => n.includes("lora")), names.join(","));
    assert.ok(Object.values(grads).every((g) => g.abs().max().dataSync()[0]! > 0));
    tf.dispose([value, ...Object.values(grads)]);
  } finally {
    m2.dispose();
  }
});

test("LoRA: peft folder round trip (same logits), peft key names and config; the merged HF export matches the adapted model", async () => {
  await initBackend("wasm");
  const m = adapted(["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]);
  const dir = mkdtempSync(join(tmpdir(), "lora-"));
  try {
    const want = logits(m);
    await saveLoraAdapter(m.lora!, join(dir, "adapter"), { baseModel: "base" });
    const cfg = JSON.parse(readFileSync(join(dir, "adapter", "adapter_config.json"), "utf8"));
    assert.equal(cfg.peft_type, "LORA");
    assert.equal(cfg.r, 4);
    assert.equal(cfg.lora_alpha, 8);
    assert.deepEqual(cfg.target_modules, ["k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]);
    const st = readSafetensors(join(dir, "adapter", "adapter_model.safetensors")).tensors;
    assert.deepEqual(st.get("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")!.shape, [4, 16]);
    assert.deepEqual(st.get("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight")!.shape, [24, 4]);
    assert.equal(st.size, 2 * 2 * 5);

    const fresh = initModel(config, new Rng(1));
    fresh.lora = loadLoraAdapter(join(dir, "adapter"), config);
    assert.ok(maxDiff(logits(fresh), want) === 0, "the reloaded adapter gives the same logits");
    fresh.dispose();

    await saveHfModel(m, join(dir, "merged"));
    const merged = await loadHfModel(join(dir, "merged"));
    assert.ok(merged.lora === undefined);
    assert.ok(maxDiff(logits(merged), want) < 1e-5, `merged export: ${maxDiff(logits(merged), want)}`);
    merged.dispose();
  } finally {
    m.dispose();
  }
});

test("LoRA: a layer-restricted adapter saves its exact module names as a regex; bad adapter folders fail clearly", async () => {
  await initBackend("wasm");
  const m = initModel(config, new Rng(1));
  const dir = mkdtempSync(join(tmpdir(), "lora-"));
  try {
    m.lora = LoraAdapter.init(config, { rank: 2, alpha: 2, targetModules: "model\\.layers\\.0\\.self_attn\\.(q|v)_proj" }, new Rng(2));
    await saveLoraAdapter(m.lora, join(dir, "a"));
    const cfg = JSON.parse(readFileSync(join(dir, "a", "adapter_config.json"), "utf8"));
    assert.equal(typeof cfg.target_modules, "string");
    const back = loadLoraAdapter(join(dir, "a"), config);
    assert.deepEqual([...back.modules.keys()], ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]);
    assert.deepEqual(selectTargets(config, back.settings), [...back.modules.keys()]);
    back.dispose();
    writeFileSync(join(dir, "a", "adapter_config.json"), JSON.stringify({ ...cfg, use_rslora: true }));
    assert.throws(() => loadLoraAdapter(join(dir, "a"), config), /use_rslora=true/);
    writeFileSync(join(dir, "a", "adapter_config.json"), JSON.stringify({ ...cfg, use_dora: true }));
    assert.throws(() => loadLoraAdapter(join(dir, "a"), config), /no lora_magnitude_vector for 'model\.layers\.0\.self_attn\.q_proj' \(use_dora is set\)/);
    assert.throws(() => loadLoraAdapter(join(dir, "nope"), config), /adapter_config\.json does not exist/);
  } finally {
    m.dispose();
  }
});

test("LoRA: the KV-cache decoder runs on merged weights (same greedy tokens as the adapted training forward)", async () => {
  await initBackend("wasm");
  const m = adapted();
  try {
    const { fast, slow } = decodeBothWays(m);
    assert.deepEqual(Array.from(fast.batch["responses"]!.data), Array.from(slow.batch["responses"]!.data));
    // and differs from the base model's decode (the adapter matters)
    const tmp = m.lora;
    m.lora = undefined;
    const base = generate(m, DECODE_PROMPTS, GREEDY, new Rng(0));
    m.lora = tmp;
    assert.notDeepEqual(Array.from(base.batch["rollout_log_probs"]?.data ?? []), Array.from(fast.batch["rollout_log_probs"]?.data ?? [1]));
  } finally {
    m.dispose();
  }
});

const PY_CHECK = `
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import PeftModel
d = sys.argv[1]
base = LlamaForCausalLM.from_pretrained(d + "/base", torch_dtype=torch.float32)
model = PeftModel.from_pretrained(base, d + "/adapter")
ids = torch.tensor(json.load(open(d + "/ids.json")))
with torch.no_grad():
    print(json.dumps(model(input_ids=ids).logits.flatten().tolist()))
`;

test("LoRA: Python peft loads the adapter folder onto the base model and gives our logits (needs python3 with torch, transformers, peft)", async (t) => {
  const py = process.env.VERL_TS_PYTHON ?? "python3";
  const probe = spawnSync(py, ["-c", "import torch, transformers, peft"], { encoding: "utf8" });
  if (probe.status !== 0) return t.skip(`${py} lacks torch/transformers/peft (set VERL_TS_PYTHON to an interpreter that has them)`);
  await initBackend("wasm");
  const m = adapted();
  const dir = mkdtempSync(join(tmpdir(), "lora-py-"));
  try {
    const tmp = m.lora!;
    m.lora = undefined;
    await saveHfModel(m, join(dir, "base"));
    m.lora = tmp;
    await saveLoraAdapter(tmp, join(dir, "adapter"));
    writeFileSync(join(dir, "ids.json"), JSON.stringify(ids));
    writeFileSync(join(dir, "check.py"), PY_CHECK);
    const r = spawnSync(py, [join(dir, "check.py"), dir], { encoding: "utf8", maxBuffer: 1 << 26 });
    assert.equal(r.status, 0, r.stderr);
    const theirs = Float32Array.from(JSON.parse(r.stdout.trim().split("\n").pop()!) as number[]);
    const d = maxDiff(theirs, logits(m));
    t.diagnostic(`peft vs verl-ts logits: max |diff| ${d}`);
    assert.ok(d < 1e-4, `peft vs verl-ts logits: ${d}`);
  } finally {
    m.dispose();
  }
});

test("loraLinear: value and gradients (x, A, B) match tfjs autodiff of x W^T + s (x A^T) B^T, with an unadapted block beside", async () => {
  for (const backend of ["wasm", "cpu"]) {
    await initBackend(backend);
    const r = (s: [number, number], seed: number) => tf.randomNormal(s, 0, 0.5, "float32", seed) as tf.Tensor2D;
    const x = r([5, 6], 1), w0 = r([4, 6], 2), w1 = r([3, 6], 3), a0 = r([2, 6], 4), b0 = r([4, 2], 5);
    const dy = r([5, 7], 6), s = 1.5;
    const fused = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor) => loraLinear(xx as tf.Tensor2D, [{ w: w0, a: aa as tf.Tensor2D, b: bb as tf.Tensor2D }, { w: w1 }], s);
    const plain = (xx: tf.Tensor, aa: tf.Tensor, bb: tf.Tensor) => {
      const d0 = tf.matMul(tf.matMul(xx, aa, false, true), bb, false, true).mul(s);
      return tf.matMul(xx, tf.concat([w0, w1], 0), false, true).add(tf.concat([d0, tf.zeros([5, 3])], 1));
    };
    assert.ok(maxDiff(fused(x, a0, b0).dataSync() as Float32Array, plain(x, a0, b0).dataSync() as Float32Array) < 1e-5);
    const g1 = tf.grads(fused)([x, a0, b0], dy), g2 = tf.grads(plain)([x, a0, b0], dy);
    g1.forEach((g, i) => assert.ok(maxDiff(g.dataSync() as Float32Array, g2[i]!.dataSync() as Float32Array) < 1e-5, `${backend} grad ${i}`));
    tf.dispose([x, w0, w1, a0, b0, dy, ...g1, ...g2]);
  }
});
