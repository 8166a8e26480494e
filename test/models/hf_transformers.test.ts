// Opt-in cross-check against Python's transformers: set VERL_TRANSFORMERS_PYTHON to
// a python that has torch and transformers (e.g. a venv built from the local wheels).
// Saves stories260K and a Qwen2-style model here, loads them there, compares logits.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig } from "../../src/models/config.js";
import { saveHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { loadTokenizer } from "../../src/models/tokenizers/index.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, tok512Bin, README_CONTINUATION } from "./stories.js";

const PY = `
import json, sys, torch, numpy as np
from transformers import AutoModelForCausalLM, AutoTokenizer
d = json.load(open(sys.argv[1]))
ids, mask = torch.tensor(d["ids"]), torch.tensor(d["mask"])
pos = (mask.cumsum(-1) - 1).clamp(min=0)
out = {}
for name, path in d["models"].items():
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        lg = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits.numpy()
    out[name] = float((np.abs(lg - np.array(d["logits"][name]).reshape(lg.shape)) * mask.numpy()[..., None]).max())
tok = AutoTokenizer.from_pretrained(d["models"]["stories"])
m = AutoModelForCausalLM.from_pretrained(d["models"]["stories"], dtype=torch.float32).eval()
enc = tok("Once upon a time", return_tensors="pt")
g = m.generate(**enc, max_new_tokens=30, do_sample=False)
out["greedy"] = tok.decode(g[0][enc.input_ids.shape[1]:], skip_special_tokens=True)
print(json.dumps(out))
`;

test("transformers loads our saved folders and computes the same logits", async (t) => {
  const python = process.env.VERL_TRANSFORMERS_PYTHON, bin = storiesBin(), tokPath = tok512Bin();
  if (!python) return t.skip("set VERL_TRANSFORMERS_PYTHON to a python with torch + transformers");
  if (!bin || !tokPath) return t.skip("../shared/models/stories260K absent");
  await initBackend("wasm");
  const dir = mkdtempSync(join(tmpdir(), "hf-x-"));
  const ids = [[1, 403, 407, 261, 378, 29, 0, 0], [0, 0, 1, 300, 301, 302, 303, 304]];
  const mask = [[1, 1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1, 1]];
  const logitsOf = (m: LlamaModel) => tf.tidy(() => Array.from(m.forward(tf.tensor2d(ids, [2, 8], "int32"), { attentionMask: tf.tensor2d(mask, [2, 8], "int32") }).dataSync()));
  const stories = loadLlama2c(bin);
  const qwen = initModel(makeConfig({ vocabSize: 512, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, ropeTheta: 1e6, normEps: 1e-6 }), new Rng(3));
  try {
    await saveHfModel(stories, join(dir, "stories"), await loadTokenizer(tokPath));
    await saveHfModel(qwen, join(dir, "qwen"));
    const spec = { ids, mask, models: { stories: join(dir, "stories"), qwen: join(dir, "qwen") }, logits: { stories: logitsOf(stories), qwen: logitsOf(qwen) } };
    writeFileSync(join(dir, "spec.json"), JSON.stringify(spec));
    writeFileSync(join(dir, "check.py"), PY);
    const r = spawnSync(python, [join(dir, "check.py"), join(dir, "spec.json")], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    const res = JSON.parse(r.stdout.trim().split("\n").pop()!) as Record<string, number | string>;
    assert.ok((res["stories"] as number) < 1e-4, `stories logits differ by ${res["stories"]}`);
    assert.ok((res["qwen"] as number) < 1e-5, `qwen logits differ by ${res["qwen"]}`);
    assert.ok(README_CONTINUATION.startsWith((res["greedy"] as string).trim().slice(0, 60)), `transformers greedy: ${res["greedy"]}`);
  } finally {
    stories.dispose(); qwen.dispose();
  }
});
