// The batched form of loraLinear (a fixed number of products per fused call) against the per-block
// form and finite differences: values and every gradient, 1 to 3 blocks, tied A, dropout pre and post.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { initModel } from "../../src/models/init.js";
import { LoraAdapter } from "../../src/models/lora.js";
import { AdapterDropout } from "../../src/models/lora_dropout.js";
import { loraLinear, setLoraPath, type LoraBlock, type LoraPath } from "../../src/models/lora_linear.js";
import { Rng } from "../../src/utils/rng.js";

/** Largest |a - b| over the largest |b| (float32 rounding of sums of a few dozen terms is ~1e-6 of that). */
function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0, m = 1e-12;
  for (let i = 0; i < a.length; i++) { d = Math.max(d, Math.abs(a[i]! - b[i]!)); m = Math.max(m, Math.abs(b[i]!)); }
  return d / m;
}

type Dropout = "none" | "pre" | "post" | "pre-shared";

interface Case { blocks: number; tied: boolean; dropout: Dropout }

/** A random call: N rows, `in` inputs, blocks of random output sizes, rank r; returns its tensors. */
function makeCall(c: Case, seed: number) {
  const rng = new Rng(seed);
  const N = 3 + Math.floor(rng.random() * 5), inF = 4 + Math.floor(rng.random() * 6), r = 1 + Math.floor(rng.random() * 3);
  const outs = Array.from({ length: c.blocks }, () => 2 + Math.floor(rng.random() * 6));
  let s = seed * 100;
  const rnd = (shape: [number, number]) => tf.randomNormal(shape, 0, 0.5, "float32", s++) as tf.Tensor2D;
  const x = rnd([N, inF]), ws = outs.map((o) => rnd([o, inF]));
  const a0 = rnd([r, inF]);
  const as = outs.map((_, j) => (c.tied || j === 0 ? a0 : rnd([r, inF])));
  const bs = outs.map((o) => rnd([o, r]));
  const drop = new AdapterDropout(0.3, c.dropout === "post" ? "post" : "pre", seed);
  const shared = drop.mask("shared", N, inF);
  const masks = outs.map((o, j): Partial<LoraBlock> => {
    if (c.dropout === "pre") return { dropIn: c.tied ? shared : drop.mask(`in${j}`, N, inF) };
    if (c.dropout === "pre-shared") return { dropIn: shared };
    if (c.dropout === "post") return { dropOut: drop.mask(`out${j}`, N, o) };
    return {};
  });
  const dy = rnd([N, outs.reduce((p, q) => p + q, 0)]);
  return { x, ws, as, bs, masks, dy, scale: 0.5 + rng.random() * 2 };
}

/** The call as a function of x, the distinct A's and the B's (so tf.grads sees every trainable once). */
function callFn(t: ReturnType<typeof makeCall>, path: LoraPath) {
  const distinct = [...new Set(t.as)];
  return {
    inputs: [t.x, ...distinct, ...t.bs],
    fn: (...xs: tf.Tensor[]) => {
      const aOf = (j: number) => xs[1 + distinct.indexOf(t.as[j]!)] as tf.Tensor2D;
      const blocks = t.ws.map((w, j): LoraBlock => ({ w, a: aOf(j), b: xs[1 + distinct.length + j] as tf.Tensor2D, ...t.masks[j] }));
      return loraLinear(xs[0] as tf.Tensor2D, blocks, t.scale, path);
    },
  };
}

const CASES: Case[] = [];
for (const blocks of [1, 2, 3]) {
  for (const dropout of ["none", "pre", "post", "pre-shared"] as Dropout[]) {
    CASES.push({ blocks, tied: false, dropout });
    if (blocks > 1) CASES.push({ blocks, tied: true, dropout });
  }
}

test("loraLinear batched: value and gradients of x, A, B equal the per-block form's to float32 rounding (1-3 blocks, tied A, dropout pre/post)", async () => {
  await initBackend("wasm");
  CASES.forEach((c, n) => {
    const t = makeCall(c, n + 1);
    const old = callFn(t, "blocks"), neu = callFn(t, "batched");
    const what = JSON.stringify(c);
    const check = () => tf.tidy(() => {
      assert.ok(relDiff(neu.fn(...neu.inputs).dataSync(), old.fn(...old.inputs).dataSync()) < 2e-6, `${what}: value`);
      const g1 = tf.grads(neu.fn)(neu.inputs, t.dy), g2 = tf.grads(old.fn)(old.inputs, t.dy);
      g1.forEach((g, i) => assert.ok(relDiff(g.dataSync(), g2[i]!.dataSync()) < 2e-6, `${what}: gradient ${i}`));
    });
    check(); // the first call of a block layout makes its two kept constants
    const before = tf.memory().numTensors;
    check();
    assert.equal(tf.memory().numTensors, before, `${what}: no tensor left behind`);
    tf.dispose([t.x, ...t.ws, ...new Set(t.as), ...t.bs, t.dy, ...t.masks.flatMap((m) => [m.dropIn, m.dropOut].filter((v): v is tf.Tensor2D => !!v))]);
  });
});

test("loraLinear batched: gradients match central finite differences (the product is linear in each single entry)", async () => {
  await initBackend("wasm");
  for (const c of [{ blocks: 3, tied: false, dropout: "pre" }, { blocks: 2, tied: true, dropout: "post" }, { blocks: 2, tied: false, dropout: "none" }] as Case[]) {
    const t = makeCall(c, 77);
    const { inputs, fn } = callFn(t, "batched");
    const loss = (xs: tf.Tensor[]) => tf.tidy(() => tf.sum(tf.mul(fn(...xs), t.dy)).dataSync()[0]!);
    const grads = tf.grads(fn)(inputs, t.dy).map((g) => g.dataSync());
    const rng = new Rng(5), eps = 0.25;
    inputs.forEach((inp, i) => {
      const v = inp.dataSync();
      for (let probe = 0; probe < 4; probe++) {
        const e = Math.floor(rng.random() * v.length);
        const shifted = (d: number) => {
          const w = Float32Array.from(v);
          w[e] = w[e]! + d;
          const xs = inputs.slice();
          xs[i] = tf.tensor(w, inp.shape);
          const f = loss(xs);
          xs[i]!.dispose();
          return f;
        };
        const fd = (shifted(eps) - shifted(-eps)) / (2 * eps);
        assert.ok(Math.abs(fd - grads[i]![e]!) < 1e-3 * (1 + Math.abs(fd)), `${JSON.stringify(c)} input ${i} entry ${e}: fd ${fd} vs ${grads[i]![e]}`);
      }
    });
    tf.dispose([t.x, ...t.ws, ...new Set(t.as), ...t.bs, t.dy, ...t.masks.flatMap((m) => [m.dropIn, m.dropOut].filter((v): v is tf.Tensor2D => !!v))]);
  }
});

test("loraLinear batched: the products per call do not grow with the block count", async () => {
  await initBackend("wasm");
  const products = async (blocks: number, path: LoraPath) => {
    const t = makeCall({ blocks, tied: false, dropout: "none" }, 9);
    const { inputs, fn } = callFn(t, path);
    const info = await tf.profile(() => { tf.dispose(tf.grads(fn)(inputs, t.dy)); });
    tf.dispose([t.x, ...t.ws, ...new Set(t.as), ...t.bs, t.dy]);
    return info.kernels.filter((kn) => kn.name === "BatchMatMul").length;
  };
  const [b1, b2, b3] = [await products(1, "batched"), await products(2, "batched"), await products(3, "batched")];
  // several slots take the same products as one (dB's own slot is kept by a masked sum, no product), whatever their number
  assert.equal(b2, b1, "2 blocks: as many products as 1");
  assert.equal(b3, b2, "3 blocks: as many products as 2");
  assert.ok((await products(3, "blocks")) > b3 + 6, "the per-block form runs several products per block");
});

test("LlamaModel under LoRA (tied A, pre-dropout, all-linear): the auto path's logits and adapter gradients equal the per-block form's; DoRA falls back", async () => {
  await initBackend("wasm");
  const config = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: false, maxSeqLen: 32 });
  const tiedA = [0, 1].flatMap((i) => [[`model.layers.${i}.self_attn.q_proj`, `model.layers.${i}.self_attn.k_proj`, `model.layers.${i}.self_attn.v_proj`]]);
  for (const settings of [
    { rank: 3, alpha: 6, targetModules: "all-linear", dropout: 0.2, tiedA },
    { rank: 3, alpha: 6, targetModules: "all-linear", dropout: 0.2, dropoutPosition: "post" as const },
    { rank: 2, alpha: 4, targetModules: "all-linear", useDora: true },
  ]) {
    const m = initModel(config, new Rng(1));
    m.lora = LoraAdapter.init(config, settings, new Rng(2), "model", (n) => m.p(`${n}.weight`) as tf.Tensor2D);
    let s = 3;
    for (const mod of m.lora.modules.values()) mod.b.assign(tf.randomNormal(mod.b.shape, 0, 0.3, "float32", s++));
    const ids = tf.tensor2d([[1, 5, 9, 13, 2, 7], [3, 3, 8, 21, 30, 4]], [2, 6], "int32");
    const run = (path: LoraPath) => {
      const prev = setLoraPath(path);
      try {
        const { value, grads } = m.lora!.trainingPass(11, () => tf.variableGrads(() => tf.tidy(() => tf.mean(tf.square(m.forward(ids))) as tf.Scalar)));
        const out = new Map(Object.entries(grads).map(([k, g]) => [k, g.dataSync()]));
        out.set("loss", value.dataSync());
        tf.dispose([value, ...Object.values(grads)]);
        return out;
      } finally {
        setLoraPath(prev);
      }
    };
    const a = run("auto"), b = run("blocks");
    assert.equal(a.size, b.size);
    for (const [k, v] of b) assert.ok(relDiff(a.get(k)!, v) < 1e-5, `${JSON.stringify(settings).slice(0, 80)}: ${k}`);
    ids.dispose();
    m.dispose();
  }
});

test("LlamaModel under LoRA: the adapter operands are made once per weight version (a changed B is seen), the live tensor count stays flat", async () => {
  await initBackend("wasm");
  const config = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: false, maxSeqLen: 32 });
  const m = initModel(config, new Rng(1));
  m.lora = LoraAdapter.init(config, { rank: 3, alpha: 6, targetModules: "all-linear" }, new Rng(2));
  const ids = tf.tensor2d([[1, 5, 9, 13, 2, 7], [3, 3, 8, 21, 30, 4]], [2, 6], "int32");
  const setB = (seed: number) => { let s = seed; for (const mod of m.lora!.modules.values()) tf.tidy(() => mod.b.assign(tf.randomNormal(mod.b.shape, 0, 0.3, "float32", s++))); };
  const logits = (path: LoraPath) => {
    const prev = setLoraPath(path);
    try { return tf.tidy(() => m.forward(ids).dataSync()); } finally { setLoraPath(prev); }
  };
  const kernels = async () => (await tf.profile(() => { tf.tidy(() => { m.forward(ids).dataSync(); }); })).kernels.length;
  setB(3);
  const first = await kernels(), again = await kernels();
  assert.ok(again < first, `a second pass on the same weights reuses the operands (${again} kernels against ${first})`);
  const live = tf.memory().numTensors;
  for (const seed of [10, 20]) {
    setB(seed); // an optimizer step: new data for every B
    assert.ok(relDiff(logits("auto"), logits("blocks")) < 1e-5, `after B changed (seed ${seed}): the batched form sees the new B`);
  }
  assert.equal(tf.memory().numTensors, live, "the operands are replaced, not accumulated");
  ids.dispose();
  m.dispose();
});
