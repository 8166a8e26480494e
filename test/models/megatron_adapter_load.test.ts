// lora.adapter_path: verl's Megatron adapter checkpoint (mp_rank_00_adapter.pt, written by torch
// with Megatron-Bridge's names and fused layouts) and the same adapter as a torch.distributed
// checkpoint, loaded into the PEFT-layout adapters of the qwen3 family fixture. The merged weight
// deltas are checked against (alpha / r) B A computed here from the file's own tensors, head by head.
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { loadConfig } from "../../src/config/index.js";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { openTorchFile, TorchTensor } from "../../src/models/torch/torch_save.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { readMegatronAdapter } from "../../src/workers/megatron_adapter.js";
import { applyModelMemoryOptions, readModelMemoryOptions } from "../../src/workers/model_options.js";
import { fixtureDir, maxDiff } from "./families_fixtures.js";

const M = "actor_rollout_ref.model";
const ADAPTER = "test/models/fixtures/torch/megatron_adapter";
const DCP = "test/models/fixtures/torch/megatron_adapter_dcp";
const lora = JSON.parse(readFileSync(join(ADAPTER, "lora.json"), "utf8")) as { rank: number; alpha: number; target_modules: string[] };

async function withAdapter(overrides: string[]): Promise<LlamaModel> {
  const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides: [`${M}.lora.rank=${lora.rank}`, `${M}.lora.alpha=${lora.alpha}`, ...overrides] });
  const view = new ConfigView(cfg, M);
  const model = await loadHfModel(fixtureDir("qwen3"));
  try {
    applyModelMemoryOptions(model, readModelMemoryOptions(view), view, 1);
  } catch (e) {
    model.dispose();
    throw e;
  }
  return model;
}

/** The file's adapter tensors, by Megatron name, as [rows][cols] float32. */
function fileTensors(): Map<string, { data: Float32Array; shape: number[] }> {
  const f = openTorchFile(join(ADAPTER, "mp_rank_00_adapter.pt"));
  try {
    const sd = (f.value as Map<string, unknown>).get("adapter_state_dict") as Map<string, TorchTensor>;
    return new Map([...sd].map(([k, t]) => [k, { data: t.toFloat32(), shape: t.shape }]));
  } finally {
    f.close();
  }
}

/** (alpha / r) B[rows] A: the expected delta [rows.length, in]. */
function delta(b: { data: Float32Array; shape: number[] }, a: { data: Float32Array; shape: number[] }, rows: number[], scale: number): Float32Array {
  const r = a.shape[0]!, inF = a.shape[1]!, out = new Float32Array(rows.length * inF);
  rows.forEach((row, o) => {
    for (let i = 0; i < inF; i++) {
      let s = 0;
      for (let k = 0; k < r; k++) s += b.data[row * r + k]! * a.data[k * inF + i]!;
      out[o * inF + i] = scale * s;
    }
  });
  return out;
}

function mergedDelta(model: LlamaModel, module: string): Float32Array {
  return tf.tidy(() => {
    const w = model.p(`${module}.weight`) as tf.Tensor2D;
    return tf.sub(model.lora!.mergedWeight(module, w), w).dataSync() as Float32Array;
  });
}

test("lora.adapter_path (verl's mp_rank_00_adapter.pt): every module's merged delta is (alpha / r) B A in HF layout, q/k/v from linear_qkv's query groups, gate/up from linear_fc1", async () => {
  await initBackend("cpu");
  const model = await withAdapter([`${M}.lora.target_modules=[${lora.target_modules.join(",")}]`, `++${M}.lora.adapter_path=${ADAPTER}`]);
  try {
    const c = model.config, hd = c.headDim, nh = c.nHeads, nkv = c.nKvHeads, perGroup = nh / nkv, scale = lora.alpha / lora.rank;
    assert.equal(model.lora!.scale, scale);
    const file = fileTensors();
    const range = (start: number, n: number) => Array.from({ length: n }, (_, j) => start + j);
    // query head h sits in group h / perGroup, after the group's earlier heads; k and v heads after the group's q heads
    const qRows = range(0, nh).flatMap((h) => range(Math.floor(h / perGroup) * (perGroup + 2) * hd + (h % perGroup) * hd, hd));
    const kRows = range(0, nkv).flatMap((g) => range(g * (perGroup + 2) * hd + perGroup * hd, hd));
    const vRows = range(0, nkv).flatMap((g) => range(g * (perGroup + 2) * hd + (perGroup + 1) * hd, hd));
    const I = c.hiddenDim;
    for (let layer = 0; layer < c.nLayers; layer++) {
      const meg = (m: string, part: string) => file.get(`decoder.layers.${layer}.${m}.adapter.linear_${part}.weight`)!;
      const hf = (m: string) => `model.layers.${layer}.${m}`;
      const cases: [string, string, number[]][] = [
        ["self_attn.q_proj", "self_attention.linear_qkv", qRows], ["self_attn.k_proj", "self_attention.linear_qkv", kRows],
        ["self_attn.v_proj", "self_attention.linear_qkv", vRows], ["self_attn.o_proj", "self_attention.linear_proj", range(0, c.dim)],
        ["mlp.gate_proj", "mlp.linear_fc1", range(0, I)], ["mlp.up_proj", "mlp.linear_fc1", range(I, I)], ["mlp.down_proj", "mlp.linear_fc2", range(0, c.dim)],
      ];
      for (const [h, m, rows] of cases) {
        const want = delta(meg(m, "out"), meg(m, "in"), rows, scale), got = mergedDelta(model, hf(h));
        assert.ok(maxDiff(got, want) < 1e-5, `layer ${layer} ${h}: delta differs by ${maxDiff(got, want)}`);
        assert.ok(want.some((v) => Math.abs(v) > 1e-3), `layer ${layer} ${h}: a non-trivial delta`);
      }
      // q, k and v share linear_qkv's A (one variable), as gate and up share linear_fc1's
      assert.equal(model.lora!.paramName(hf("self_attn.v_proj"), "A"), `${hf("self_attn.q_proj")}.lora_A.weight`);
      assert.equal(model.lora!.paramName(hf("mlp.up_proj"), "A"), `${hf("mlp.gate_proj")}.lora_A.weight`);
    }
  } finally {
    model.dispose();
  }
});

test("lora.adapter_path: the torch_dist folder, a file path and the .pt give the same adapter", async () => {
  await initBackend("cpu");
  const targets = `${M}.lora.target_modules=[${lora.target_modules.join(",")}]`;
  const [pt, dcp, file] = [
    await withAdapter([targets, `++${M}.lora.adapter_path=${ADAPTER}`]),
    await withAdapter([targets, `++${M}.lora.adapter_path=${DCP}`]),
    await withAdapter([targets, `++${M}.lora.adapter_path=${join(ADAPTER, "mp_rank_00_adapter.pt")}`]),
  ];
  try {
    const params = (m: LlamaModel) => new Map([...m.lora!.namedParams()].map(([k, v]) => [k, Array.from(v.dataSync())]));
    const want = params(pt);
    assert.equal(want.size, 3 * (4 + 7), "3 layers x (A of qkv, fc1, proj, fc2 + B of q, k, v, o, gate, up, down)");
    assert.deepEqual(params(dcp), want);
    assert.deepEqual(params(file), want);
  } finally {
    [pt, dcp, file].forEach((m) => m.dispose());
  }
});

test("lora.adapter_path: a rank, module set or type off the checkpoint, and several model-parallel ranks, are refused naming what differs", async () => {
  await initBackend("cpu");
  const at = `++${M}.lora.adapter_path=${ADAPTER}`;
  await assert.rejects(withAdapter([`${M}.lora.rank=8`, at]), /'decoder\.layers\.0\.self_attention\.linear_qkv\.adapter\.linear_in\.weight' has shape \[4,64\], expected \[8,64\] for this model \(rank 4 in the file, actor_rollout_ref\.model\.lora\.rank=8\)/);
  await assert.rejects(withAdapter([`${M}.lora.target_modules=[linear_qkv]`, at]), /mp_rank_00_adapter\.pt: holds decoder\.layers\.0\.self_attention\.linear_proj\.adapter\.linear_in\.weight, .*\(\d+ in all\), which no adapted module of the model has \(lora\.type=lora/);
  await assert.rejects(withAdapter([`${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=[linear_q,linear_k,linear_v,linear_proj,linear_fc1_up,linear_fc1_gate,linear_fc2]`, at]),
    /has no decoder\.layers\.0\.self_attention\.linear_qkv\.adapter\.adapter_q\.linear_in\.weight, .* which the adapter \(lora\.type=canonical_lora/);
  await assert.rejects(withAdapter([`${M}.lora.type=dora`, `${M}.lora.target_modules=[${lora.target_modules.join(",")}]`, at]), /has no decoder\.layers\.0\.self_attention\.linear_qkv\.adapter\.weight_magnitude/);
  // tp = 2: one file per tensor-parallel rank, refused when the config is read (before any model loads)
  const dir = mkdtempSync(join(tmpdir(), "megad-"));
  mkdirSync(join(dir, "tp2"));
  copyFileSync(join(ADAPTER, "mp_rank_00_adapter.pt"), join(dir, "tp2", "mp_rank_00_adapter.pt"));
  copyFileSync(join(ADAPTER, "mp_rank_00_adapter.pt"), join(dir, "tp2", "mp_rank_01_adapter.pt"));
  const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides: [`${M}.lora.rank=4`, `++${M}.lora.adapter_path=${join(dir, "tp2")}`] });
  assert.throws(() => readModelMemoryOptions(new ConfigView(cfg, M)), /lora\.adapter_path=.*tp2 holds verl's Megatron adapter checkpoint of several model-parallel ranks \(mp_rank_00_adapter\.pt, mp_rank_01_adapter\.pt\): .*merging them is not built/);
});

test("lora.adapter_path (torch_dist, layers stacked on a leading axis as Megatron saves them, DoRA): split by layer into each module's A, B and magnitude; chunks placed; base and optimizer keys left out", async () => {
  await initBackend("cpu");
  const dir = "test/models/fixtures/torch_mimic/megatron_dcp_stacked";
  const want = JSON.parse(readFileSync(join(dir, "expected.json"), "utf8")) as Record<string, { shape: number[]; values: number[] }>;
  const model = await withAdapter([`${M}.lora.type=dora`, `${M}.lora.target_modules=[linear_proj,linear_fc2]`, `++${M}.lora.adapter_path=${dir}`]);
  try {
    const layer = (key: string, i: number) => {
      const { shape, values } = want[key]!, per = values.length / shape[0]!;
      return values.slice(i * per, (i + 1) * per);
    };
    assert.equal(model.lora!.modules.size, 2 * model.config.nLayers);
    for (let i = 0; i < model.config.nLayers; i++) {
      for (const [hf, meg] of [["self_attn.o_proj", "self_attention.linear_proj"], ["mlp.down_proj", "mlp.linear_fc2"]]) {
        const m = model.lora!.modules.get(`model.layers.${i}.${hf}`)!, key = (p: string) => `decoder.layers.${meg}.adapter.${p}`;
        assert.deepEqual(Array.from(m.a.dataSync()), layer(key("linear_in.weight"), i), `layer ${i} ${hf}: A`);
        assert.deepEqual(Array.from(m.b.dataSync()), layer(key("linear_out.weight"), i), `layer ${i} ${hf}: B`);
        assert.deepEqual(Array.from(m.magnitude!.dataSync()), layer(key("weight_magnitude"), i), `layer ${i} ${hf}: DoRA magnitude`);
      }
    }
  } finally {
    model.dispose();
  }
  // only the model's adapter tensors are read (the base weight, the optimizer moment and the bytes entry are not)
  assert.deepEqual([...readMegatronAdapter({ kind: "dcp", dir }, 3).tensors.keys()].filter((k) => k.startsWith("decoder.layers.0.")).sort(), [
    "decoder.layers.0.mlp.linear_fc2.adapter.linear_in.weight", "decoder.layers.0.mlp.linear_fc2.adapter.linear_out.weight", "decoder.layers.0.mlp.linear_fc2.adapter.weight_magnitude",
    "decoder.layers.0.self_attention.linear_proj.adapter.linear_in.weight", "decoder.layers.0.self_attention.linear_proj.adapter.linear_out.weight", "decoder.layers.0.self_attention.linear_proj.adapter.weight_magnitude",
  ]);
  // a stacked axis off the model's layer count is named
  assert.throws(() => readMegatronAdapter({ kind: "dcp", dir }, 2), /megatron_dcp_stacked: 'decoder\.layers\.self_attention\.linear_proj\.adapter\.linear_in\.weight' stacks 3 layers on its first axis \[3,4,96\], but the model has 2/);
});

test("lora.adapter_path under lora.type=canonical_lora: adapter_q / adapter_v / adapter_up are the projections' own A and B (no row regrouping, no shared A)", async () => {
  await initBackend("cpu");
  const dir = "test/models/fixtures/torch_mimic/megatron_canonical";
  const want = JSON.parse(readFileSync(join(dir, "expected.json"), "utf8")) as Record<string, { values: number[] }>;
  const model = await withAdapter([`${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=[linear_q,linear_v,linear_fc1_up]`, `++${M}.lora.adapter_path=${dir}`]);
  try {
    assert.equal(model.lora!.modules.size, 3 * model.config.nLayers);
    for (let i = 0; i < model.config.nLayers; i++) {
      for (const [hf, meg] of [["self_attn.q_proj", "self_attention.linear_qkv.adapter.adapter_q"], ["self_attn.v_proj", "self_attention.linear_qkv.adapter.adapter_v"], ["mlp.up_proj", "mlp.linear_fc1.adapter.adapter_up"]]) {
        const m = model.lora!.modules.get(`model.layers.${i}.${hf}`)!;
        assert.deepEqual(Array.from(m.a.dataSync()), want[`decoder.layers.${i}.${meg}.linear_in.weight`]!.values, `layer ${i} ${hf}: A`);
        assert.deepEqual(Array.from(m.b.dataSync()), want[`decoder.layers.${i}.${meg}.linear_out.weight`]!.values, `layer ${i} ${hf}: B`);
        assert.equal(model.lora!.paramName(`model.layers.${i}.${hf}`, "A"), `model.layers.${i}.${hf}.lora_A.weight`, "an A of its own");
      }
    }
  } finally {
    model.dispose();
  }
});
