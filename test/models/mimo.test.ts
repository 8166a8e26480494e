// MiMo (model_type "mimo"): a Qwen2 trunk plus multi-token-prediction layers. The trunk must be
// Qwen2's exactly; the MTP layer is checked against the math written out below in plain
// float64 (token and hidden RMSNorms, input_proj of [hidden; token], one Qwen2 decoder layer,
// final norm, the shared lm_head), since no transformers reference for MiMo exists offline.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel, loadHfValueModel, readHfWeights, saveHfModel } from "../../src/models/hf.js";
import { Rng } from "../../src/utils/rng.js";
import type { NamedArray } from "../../src/models/safetensors.js";
import { maxDiff } from "./families_fixtures.js";
import { mimoConfigJson, writeTinyMimo } from "./mimo_fixture.js";

type Weights = Map<string, NamedArray>;
const C = { dim: 32, heads: 4, kvHeads: 2, headDim: 8, ffn: 48, layers: 2, vocab: 320, eps: 1e-6, theta: 10000 };

function rms(x: number[], w: ArrayLike<number>): number[] {
  const s = Math.sqrt(x.reduce((a, v) => a + v * v, 0) / x.length + C.eps);
  return x.map((v, i) => (v / s) * w[i]!);
}

function linear(x: number[], w: NamedArray, b?: NamedArray): number[] {
  const [out, inp] = w.shape as [number, number];
  return Array.from({ length: out }, (_, o) => {
    let s = b ? b.data[o]! : 0;
    for (let i = 0; i < inp; i++) s += w.data[o * inp + i]! * x[i]!;
    return s;
  });
}

/** Rotate one head's vector by position `pos` (rotate-halves convention). */
function rope(v: number[], pos: number): number[] {
  const h = C.headDim / 2, out = v.slice();
  for (let i = 0; i < h; i++) {
    const a = pos * Math.pow(C.theta, (-2 * i) / C.headDim), c = Math.cos(a), s = Math.sin(a);
    out[i] = v[i]! * c - v[i + h]! * s;
    out[i + h] = v[i + h]! * c + v[i]! * s;
  }
  return out;
}

/** A Qwen2 decoder layer under `p` over rows `xs` at positions 0.., causal. */
function decoderLayer(w: Weights, p: string, xs: number[][]): number[][] {
  const g = (n: string) => w.get(p + n)!;
  const n1 = xs.map((x) => rms(x, g("input_layernorm.weight").data));
  const q = n1.map((x) => linear(x, g("self_attn.q_proj.weight"), g("self_attn.q_proj.bias")));
  const k = n1.map((x) => linear(x, g("self_attn.k_proj.weight"), g("self_attn.k_proj.bias")));
  const v = n1.map((x) => linear(x, g("self_attn.v_proj.weight"), g("self_attn.v_proj.bias")));
  const head = (row: number[], h: number) => row.slice(h * C.headDim, (h + 1) * C.headDim);
  const out = xs.map((x, t) => {
    const att: number[] = [];
    for (let h = 0; h < C.heads; h++) {
      const kv = Math.floor(h / (C.heads / C.kvHeads)), qh = rope(head(q[t]!, h), t);
      const scores = Array.from({ length: t + 1 }, (_, s) => rope(head(k[s]!, kv), s).reduce((a, kk, i) => a + kk * qh[i]!, 0) / Math.sqrt(C.headDim));
      const m = Math.max(...scores), e = scores.map((s) => Math.exp(s - m)), z = e.reduce((a, b) => a + b, 0);
      for (let i = 0; i < C.headDim; i++) att.push(e.reduce((a, es, s) => a + (es / z) * head(v[s]!, kv)[i]!, 0));
    }
    const h1 = linear(att, g("self_attn.o_proj.weight")).map((o, i) => o + x[i]!);
    const n2 = rms(h1, g("post_attention_layernorm.weight").data);
    const gate = linear(n2, g("mlp.gate_proj.weight")), up = linear(n2, g("mlp.up_proj.weight"));
    const act = gate.map((a, i) => (a / (1 + Math.exp(-a))) * up[i]!);
    return linear(act, g("mlp.down_proj.weight")).map((o, i) => o + h1[i]!);
  });
  return out;
}

/** The trunk's logits and the MTP head's (row t predicts token t+2; T-1 rows) for one sequence. */
function reference(w: Weights, ids: number[]): { logits: number[][]; mtp: number[][] } {
  const emb = (id: number) => Array.from(w.get("model.embed_tokens.weight")!.data.subarray(id * C.dim, (id + 1) * C.dim));
  let xs = ids.map(emb);
  for (let i = 0; i < C.layers; i++) xs = decoderLayer(w, `model.layers.${i}.`, xs);
  const head = (x: number[]) => linear(x, w.get("lm_head.weight")!);
  const logits = xs.map((x) => head(rms(x, w.get("model.norm.weight")!.data)));
  const P = "model.mtp_layers.0.", g = (n: string) => w.get(P + n)!;
  // MTP: the trunk's state before the final norm at t, joined with the embedding of token t+1
  const inputs = xs.slice(0, -1).map((h, t) => linear([...rms(h, g("hidden_layernorm.weight").data), ...rms(emb(ids[t + 1]!), g("token_layernorm.weight").data)], g("input_proj.weight")));
  const mtp = decoderLayer(w, P, inputs).map((y) => head(rms(y, g("final_layernorm.weight").data)));
  return { logits, mtp };
}

const IDS = [5, 17, 250, 3, 99, 42, 7, 300, 11];

test("MiMo: the trunk's and the MTP layer's logits match the math written out", async () => {
  await initBackend("cpu");
  const dir = mkdtempSync(join(tmpdir(), "mimo-"));
  try {
    writeTinyMimo(dir);
    const model = await loadHfModel(dir);
    try {
      assert.equal(model.config.modelType, "mimo");
      assert.equal(model.config.mtpLayers, 1);
      const ref = reference(readHfWeights(dir), IDS);
      const { logits, mtpLogits } = model.forwardWithMtp(tf.tensor2d([IDS], [1, IDS.length], "int32"));
      const got = logits.arraySync()[0]!, gotMtp = mtpLogits.arraySync()[0]!;
      tf.dispose([logits, mtpLogits]);
      assert.ok(maxDiff(got.flat(), ref.logits.flat()) < 2e-4, `trunk logits differ by ${maxDiff(got.flat(), ref.logits.flat())}`);
      const d = maxDiff(gotMtp.slice(0, -1).flat(), ref.mtp.flat());
      assert.ok(d < 2e-4, `MTP logits differ by ${d}`);
      // the MTP head is not the trunk's head: it predicts something else
      assert.ok(maxDiff(gotMtp.slice(0, -1).flat(), got.slice(1).flat()) > 0.1);
    } finally {
      model.dispose();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("MiMo: the trunk equals Qwen2 with the same weights; mtp:false leaves the MTP layers out", async () => {
  await initBackend("cpu");
  const dir = mkdtempSync(join(tmpdir(), "mimo-"));
  try {
    const mimo = await loadHfModel(writeTinyMimo(join(dir, "mimo")));
    const qwen = await loadHfModel(writeTinyMimo(join(dir, "qwen2"), { trunkOnly: true }));
    const trunk = await loadHfModel(join(dir, "mimo"), undefined, { mtp: false });
    try {
      assert.equal(qwen.config.modelType, "qwen2");
      assert.equal([...trunk.params.keys()].some((n) => n.includes("mtp_layers")), false);
      assert.equal(trunk.config.mtpLayers, 0);
      const ids = tf.tensor2d([IDS], [1, IDS.length], "int32");
      const [a, b, c] = [mimo, qwen, trunk].map((m) => m.forward(ids).dataSync());
      ids.dispose();
      assert.deepEqual(a, b);
      assert.deepEqual(c, b);
      assert.throws(() => trunk.forwardWithMtp(tf.tensor2d([IDS], [1, IDS.length], "int32")), /without multi-token-prediction layers/);
      // a value model (critic) from a MiMo folder is the trunk plus its score head
      const critic = await loadHfValueModel(join(dir, "mimo"), new Rng(1));
      assert.equal([...critic.params.keys()].some((n) => n.includes("mtp_layers")), false);
      critic.dispose();
    } finally {
      for (const m of [mimo, qwen, trunk]) m.dispose();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("MiMo: config mismatches are refused by name", async () => {
  await initBackend("cpu");
  const dir = mkdtempSync(join(tmpdir(), "mimo-"));
  try {
    writeTinyMimo(dir);
    // MTP weights but num_nextn_predict_layers 0
    writeFileSync(join(dir, "config.json"), JSON.stringify(mimoConfigJson(0)));
    await assert.rejects(loadHfModel(dir), /unexpected parameter 'model\.mtp_layers\.0\./);
    // a config.json promising two MTP layers where the folder has one
    writeFileSync(join(dir, "config.json"), JSON.stringify(mimoConfigJson(2)));
    await assert.rejects(loadHfModel(dir), /missing parameter 'model\.mtp_layers\.1\./);
    // MTP layers are a MiMo key only
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...mimoConfigJson(1), model_type: "qwen2", architectures: ["Qwen2ForCausalLM"] }));
    await assert.rejects(loadHfModel(dir), /num_nextn_predict_layers=1 is not supported \(multi-token-prediction layers are built for MiMo only/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("MiMo: save keeps the MTP layers and num_nextn_predict_layers (vLLM's MiMoForCausalLM layout); a trunk-only load saves none", async () => {
  await initBackend("cpu");
  const dir = mkdtempSync(join(tmpdir(), "mimo-"));
  try {
    const src = writeTinyMimo(join(dir, "src"));
    const model = await loadHfModel(src), trunk = await loadHfModel(src, undefined, { mtp: false });
    try {
      await saveHfModel(model, join(dir, "out"));
      await saveHfModel(trunk, join(dir, "trunk"));
    } finally {
      model.dispose();
      trunk.dispose();
    }
    const cfg = JSON.parse(readFileSync(join(dir, "out", "config.json"), "utf8")) as Record<string, unknown>;
    assert.deepEqual(cfg["architectures"], ["MiMoForCausalLM"]);
    assert.equal(cfg["model_type"], "mimo");
    assert.equal(cfg["num_nextn_predict_layers"], 1);
    const before = readHfWeights(src), after = readHfWeights(join(dir, "out"));
    assert.deepEqual([...after.keys()].sort(), [...before.keys()].sort());
    for (const [n, t] of before) assert.deepEqual(after.get(n)!.data, t.data, n);
    assert.ok([...after.keys()].filter((n) => n.startsWith("model.mtp_layers.0.")).length >= 15);
    const trunkCfg = JSON.parse(readFileSync(join(dir, "trunk", "config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(trunkCfg["num_nextn_predict_layers"], 0);
    assert.equal([...readHfWeights(join(dir, "trunk")).keys()].some((n) => n.includes("mtp_layers")), false);
    // what was saved loads back
    const again = await loadHfModel(join(dir, "out"));
    assert.equal(again.config.mtpLayers, 1);
    again.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
