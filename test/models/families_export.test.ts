// Export of every family back to a Hugging Face folder: the same architecture and the same
// values for every config.json key that changes the math, weights that reload in verl-ts to
// the same logits; and, opt-in (VERL_TRANSFORMERS_PYTHON, as hf_transformers.test.ts), that
// transformers loads the export as the same class and computes the same logits within 1e-4.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel, saveHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { FAMILY_FIXTURES, fixtureDir, maxDiff, reference } from "./families_fixtures.js";

/** The config.json keys that change the math (absent in the source: not compared). */
const MATH_KEYS = [
  "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
  "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_parameters", "rms_norm_eps", "tie_word_embeddings",
  "hidden_act", "hidden_activation", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "layer_types",
  "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "moe_intermediate_size", "num_experts_per_tok",
  "norm_topk_prob", "router_aux_loss_coef", "mlp_only_layers",
];

const readJson = (p: string) => JSON.parse(readFileSync(p, "utf8")) as Record<string, unknown>;

function logitsOf(m: LlamaModel, ids: number[]): Float32Array {
  return tf.tidy(() => m.forward(tf.tensor2d(ids, [1, ids.length], "int32")).dataSync() as Float32Array);
}

for (const name of FAMILY_FIXTURES) {
  test(`${name}: export keeps the architecture and config keys, and reloads to the same logits`, async () => {
    await initBackend("wasm");
    const src = fixtureDir(name), dir = mkdtempSync(join(tmpdir(), `export-${name}-`));
    const ref = reference(name), ids = [...ref.prompts[1]!, ...ref.greedy[1]!];
    const model = await loadHfModel(src);
    try {
      await saveHfModel(model, join(dir, "out"));
      const a = readJson(join(src, "config.json")), b = readJson(join(dir, "out", "config.json"));
      for (const k of MATH_KEYS) if (k in a && a[k] !== null) assert.deepEqual(b[k], a[k], `${name}: config.json ${k}`);
      // Qwen3-MoE: transformers 5 writes num_local_experts, 4 num_experts; the export says both readers' name
      if ("num_local_experts" in a) assert.equal(b["num_experts"], a["num_local_experts"], `${name}: num_experts`);
      // transformers 5 checks float fields strictly: a float there (30.0) must not come back as an int (30)
      const floats = (text: string) => [...text.matchAll(/"(\w+)": (-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+)/gi)].map((m) => m[1]!);
      const written = readFileSync(join(dir, "out", "config.json"), "utf8");
      for (const k of floats(readFileSync(join(src, "config.json"), "utf8"))) {
        if (written.includes(`"${k}"`)) assert.match(written, new RegExp(`"${k}": -?(\\d+\\.\\d+|\\d+(\\.\\d+)?e[-+]?\\d+)`, "i"), `${name}: ${k} written as a float`);
      }
      const back = await loadHfModel(join(dir, "out"));
      try {
        assert.equal(maxDiff(logitsOf(back, ids), logitsOf(model, ids)), 0, `${name}: reloaded logits`);
      } finally {
        back.dispose();
      }
    } finally {
      model.dispose();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

const PY = `
import json, sys, torch, numpy as np
from transformers import AutoModelForCausalLM
d = json.load(open(sys.argv[1]))
out = {}
for name, spec in d.items():
    m = AutoModelForCausalLM.from_pretrained(spec["path"], dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        lg = m(input_ids=torch.tensor([spec["ids"]])).logits[0].numpy()
    out[name] = {"cls": type(m).__name__, "diff": float(np.abs(lg - np.array(spec["logits"]).reshape(lg.shape)).max())}
print(json.dumps(out))
`;

test("transformers loads every family's export as the same class with the same logits", async (t) => {
  const python = process.env.VERL_TRANSFORMERS_PYTHON;
  if (!python) return t.skip("set VERL_TRANSFORMERS_PYTHON to a python with torch + transformers");
  await initBackend("wasm");
  const dir = mkdtempSync(join(tmpdir(), "export-x-"));
  try {
    const spec: Record<string, { path: string; ids: number[]; logits: number[]; cls: string }> = {};
    for (const name of FAMILY_FIXTURES) {
      const ref = reference(name), ids = [...ref.prompts[1]!, ...ref.greedy[1]!];
      const model = await loadHfModel(fixtureDir(name));
      try {
        await saveHfModel(model, join(dir, name));
        spec[name] = { path: join(dir, name), ids, logits: Array.from(logitsOf(model, ids)), cls: (readJson(join(fixtureDir(name), "config.json"))["architectures"] as string[])[0]! };
      } finally {
        model.dispose();
      }
    }
    writeFileSync(join(dir, "spec.json"), JSON.stringify(spec));
    writeFileSync(join(dir, "check.py"), PY);
    const r = spawnSync(python, [join(dir, "check.py"), join(dir, "spec.json")], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    const res = JSON.parse(r.stdout.trim().split("\n").pop()!) as Record<string, { cls: string; diff: number }>;
    for (const name of FAMILY_FIXTURES) {
      assert.equal(res[name]!.cls, spec[name]!.cls, `${name}: transformers class`);
      assert.ok(res[name]!.diff < 1e-4, `${name}: transformers logits differ by ${res[name]!.diff}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
