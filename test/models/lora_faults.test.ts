// Issue 28 item 12: bad LoRA adapters and ranks are refused up front, naming the
// file, the key and the module: NaN in an adapter (refused for base weights too),
// a rank larger than a targeted layer, a module the model does not have (in the
// weights or in adapter_config.json's target_modules).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { LoraAdapter } from "../../src/models/lora.js";
import { loadLoraAdapter, saveLoraAdapter } from "../../src/models/peft.js";
import { readSafetensors, serializeSafetensors } from "../../src/models/safetensors.js";
import { Rng } from "../../src/utils/rng.js";

const config = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: false, maxSeqLen: 64 });

async function withAdapter(body: (dir: string) => void | Promise<void>): Promise<void> {
  await initBackend("wasm");
  const root = mkdtempSync(join(tmpdir(), "lora-faults-"));
  const a = LoraAdapter.init(config, { rank: 2, alpha: 4, targetModules: ["q_proj", "v_proj"] }, new Rng(3));
  try {
    await saveLoraAdapter(a, join(root, "a"));
    await body(join(root, "a"));
  } finally {
    a.dispose();
    rmSync(root, { recursive: true, force: true });
  }
}

function editWeights(dir: string, edit: (t: Map<string, { data: Float32Array; shape: number[] }>) => void): void {
  const file = join(dir, "adapter_model.safetensors");
  const { tensors } = readSafetensors(file);
  const m = new Map([...tensors].map(([k, v]) => [k, { data: Float32Array.from(v.data as ArrayLike<number>), shape: [...v.shape] }]));
  edit(m);
  writeFileSync(file, serializeSafetensors(m));
}

test("an adapter holding NaN is refused, naming the file and the tensor", () => withAdapter((dir) => {
  editWeights(dir, (t) => { t.get("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight")!.data[3] = NaN; });
  assert.throws(() => loadLoraAdapter(dir, config), /adapter_model\.safetensors: weight 'base_model\.model\.model\.layers\.1\.self_attn\.v_proj\.lora_B\.weight' holds NaN \(element 3\)/);
}));

test("an adapter with weights for a module the model lacks is refused, naming the module", () => withAdapter((dir) => {
  editWeights(dir, (t) => {
    t.set("base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight", { data: new Float32Array(2 * 16), shape: [2, 16] });
    t.set("base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight", { data: new Float32Array(16 * 2), shape: [16, 2] });
  });
  assert.throws(() => loadLoraAdapter(dir, config), /adapter_model\.safetensors.*'model\.layers\.7\.self_attn\.q_proj', which is not a linear module of the model/);
}));

test("target_modules naming a module the model does not have is refused, naming it", () => withAdapter((dir) => {
  const cfgPath = join(dir, "adapter_config.json");
  const cfg = JSON.parse(readFileSync(cfgPath, "utf8"));
  writeFileSync(cfgPath, JSON.stringify({ ...cfg, target_modules: ["q_proj", "v_proj", "qkv_proj"] }));
  assert.throws(() => loadLoraAdapter(dir, config), /target_modules names 'qkv_proj', which matches no linear module of the model/);
  // and the config keys of a fresh adapter the same
  assert.throws(() => LoraAdapter.init(config, { rank: 2, alpha: 4, targetModules: ["q_proj", "wq"] }, new Rng(0), "actor_rollout_ref.model"),
    /actor_rollout_ref\.model\.target_modules names 'wq', which matches no linear module of the model/);
}));

test("a LoRA rank larger than a targeted layer is refused up front, naming the key and the layer", async () => {
  await initBackend("wasm");
  const t0 = Date.now();
  assert.throws(() => LoraAdapter.init(config, { rank: 100_000, alpha: 16, targetModules: "all-linear" }, new Rng(0), "actor_rollout_ref.model"),
    /actor_rollout_ref\.model\.lora_rank=100000 is larger than model\.layers\.0\.self_attn\.k_proj \[8, 16\]: a LoRA rank is at most min\(out, in\) = 8/);
  assert.ok(Date.now() - t0 < 1000, `took ${Date.now() - t0} ms`);
  // the largest useful rank still works
  LoraAdapter.init(config, { rank: 8, alpha: 16, targetModules: "all-linear" }, new Rng(0)).dispose();
});
