// LoraAdapter.mergedWeight on WebGPU: one fused product with W as its bias (the rollout merges every
// adapted module every step) equals the composite W + s B A, at scale 1 and 2 and under DoRA.
// llvmpipe serves where there is no GPU; the test skips without any adapter.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { webgpuOrReason } from "../engine/webgpu_adapter.js";
import { makeConfig } from "../../src/models/config.js";
import { LoraAdapter, linearModules } from "../../src/models/lora.js";
import { Rng } from "../../src/utils/rng.js";

test("merged weights on WebGPU: the fused product equals W + s B A (scale 1, scale 2, DoRA)", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const config = makeConfig({ vocabSize: 64, dim: 32, hiddenDim: 48, nLayers: 1, nHeads: 4, nKvHeads: 2, maxSeqLen: 16 });
  let seed = 1;
  const base = new Map([...linearModules(config)].map(([n, shape]) => [n, tf.randomNormal(shape, 0, 0.1, "float32", seed++) as tf.Tensor2D]));
  const name = "model.layers.0.mlp.up_proj", w = base.get(name)!;
  for (const [alpha, dora] of [[4, false], [8, false], [8, true]] as const) {
    const lora = LoraAdapter.init(config, { rank: 4, alpha, targetModules: "all-linear", useDora: dora }, new Rng(2), "model", (mod) => base.get(mod)!);
    const m = lora.modules.get(name)!;
    m.b.assign(tf.randomNormal(m.b.shape, 0, 0.3, "float32", 3));
    const got = lora.mergedWeight(name, w);
    const want = tf.tidy(() => {
      const merged = tf.add(w, tf.matMul(m.b, m.a).mul(lora.scale));
      if (!m.magnitude) return merged;
      return tf.mul(merged, tf.div(m.magnitude.reshape([-1, 1]), tf.sqrt(tf.sum(tf.square(merged), 1, true))));
    });
    const d = (await tf.max(tf.abs(tf.sub(got, want))).data())[0]!, scale = (await tf.max(tf.abs(want)).data())[0]!;
    assert.ok(d <= 1e-6 * scale, `alpha ${alpha}${dora ? " DoRA" : ""}: ${d} off (of ${scale})`);
    assert.ok((await tf.max(tf.abs(tf.sub(got, w))).data())[0]! > 1e-3, "the adapter changed the weight");
    tf.dispose([got, want]);
    lora.dispose();
  }
  tf.dispose([...base.values()]);
});
