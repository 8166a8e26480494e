import { test } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync, readFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { initModel } from "../../src/models/init.js";
import { makeConfig, fromHfConfig, toHfConfig, numParams } from "../../src/models/config.js";
import { ValueHeadModel } from "../../src/models/value_head.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { Rng } from "../../src/utils/rng.js";
import { storiesBin, tok512Bin, STORIES_MISSING, ONCE_UPON_A_TIME, README_CONTINUATION, tok512Pieces, decodePieces } from "./stories.js";

function greedyNoCache(m: LlamaModel, prompt: number[], steps: number): number[] {
  const ids = [...prompt];
  for (let s = 0; s < steps; s++) {
    const next = tf.tidy(() => {
      const logits = m.forward(tf.tensor2d(ids, [1, ids.length], "int32"));
      return logits.slice([0, ids.length - 1, 0], [1, 1, -1]).argMax(-1).dataSync()[0]!;
    });
    ids.push(next);
  }
  return ids.slice(prompt.length);
}

test("stories260K greedy decoding from 'Once upon a time' gives the README continuation", async (t) => {
  const bin = storiesBin(), tok = tok512Bin();
  if (!bin || !tok) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin);
  try {
    assert.equal(m.config.dim, 64);
    assert.equal(m.config.nKvHeads, 4);
    assert.equal(m.config.tieWordEmbeddings, true);
    const pieces = tok512Pieces(tok);
    assert.equal(decodePieces(pieces, ONCE_UPON_A_TIME.slice(1)), " Once upon a time");
    const out = greedyNoCache(m, ONCE_UPON_A_TIME, 40);
    const text = decodePieces(pieces, out);
    assert.ok(text.startsWith(README_CONTINUATION), `got: ${text}`);
  } finally {
    m.dispose();
  }
});

test("left padding with an attention mask leaves the logits of real tokens unchanged", async () => {
  await initBackend("wasm");
  const cfg = makeConfig({ vocabSize: 32, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: false });
  const m = initModel(cfg, new Rng(5));
  try {
    const seq = [3, 7, 1, 9, 4, 4, 2];
    const [alone, padded] = tf.tidy(() => {
      const a = m.forward(tf.tensor2d(seq, [1, 7], "int32"));
      const ids = tf.tensor2d([[0, 0, 0, ...seq], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]], [2, 10], "int32");
      const mask = tf.tensor2d([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], [2, 10], "int32");
      const p = m.forward(ids, { attentionMask: mask }).slice([0, 3, 0], [1, 7, -1]);
      return [a.dataSync(), p.dataSync()];
    });
    let md = 0;
    for (let i = 0; i < alone!.length; i++) md = Math.max(md, Math.abs(alone![i]! - padded![i]!));
    assert.ok(md < 1e-5, `max diff ${md}`);
  } finally {
    m.dispose();
  }
});

/** Write raw llama2.c arrays (already in llama2.c order) as a v0 and a v1 checkpoint. */
function writeLlama2c(dir: string, h: number[], arrays: Record<string, Float32Array>, shared: boolean): { v0: string; v1: string } {
  const [dim, , L, , , vocab, seqLen] = h as [number, number, number, number, number, number, number];
  const hd = dim / h[3]!;
  const cat = (parts: Float32Array[]) => { const n = parts.reduce((a, p) => a + p.length, 0); const o = new Float32Array(n); let at = 0; for (const p of parts) { o.set(p, at); at += p.length; } return o; };
  const a = arrays;
  const v0body = cat([a.emb!, a.attNorm!, a.wq!, a.wk!, a.wv!, a.wo!, a.ffnNorm!, a.w1!, a.w2!, a.w3!, a.norm!, new Float32Array(seqLen * hd), ...(shared ? [] : [a.cls!])]);
  const v0head = new Int32Array([...h.slice(0, 5), shared ? vocab : -vocab, seqLen]);
  const v0 = join(dir, "v0.bin"); writeFileSync(v0, Buffer.concat([Buffer.from(v0head.buffer), Buffer.from(v0body.buffer)]));
  const hdr = Buffer.alloc(256); hdr.writeUInt32LE(0x616b3432, 0); hdr.writeInt32LE(1, 4);
  h.forEach((v, i) => hdr.writeInt32LE(v, 8 + 4 * i)); hdr.writeUInt8(shared ? 1 : 0, 36);
  const v1body = cat([a.attNorm!, a.ffnNorm!, a.norm!, a.emb!, a.wq!, a.wk!, a.wv!, a.wo!, a.w1!, a.w2!, a.w3!, ...(shared ? [] : [a.cls!])]);
  const v1 = join(dir, "v1.bin"); writeFileSync(v1, Buffer.concat([hdr, Buffer.from(v1body.buffer)]));
  void L;
  return { v0, v1 };
}

test("llama2.c version 0 (untied, vocab < 0) and version 1 files of the same weights load to the same model", async () => {
  await initBackend("cpu");
  const rng = new Rng(9);
  const [dim, F, L, H, KV, V, S] = [8, 12, 2, 2, 1, 10, 16];
  const hd = dim / H, r = (n: number) => Float32Array.from({ length: n }, () => rng.normal() * 0.3);
  const arrays = {
    emb: r(V * dim), attNorm: r(L * dim), wq: r(L * dim * dim), wk: r(L * KV * hd * dim), wv: r(L * KV * hd * dim), wo: r(L * dim * dim),
    ffnNorm: r(L * dim), w1: r(L * F * dim), w2: r(L * dim * F), w3: r(L * F * dim), norm: r(dim), cls: r(V * dim),
  };
  const dir = mkdtempSync(join(tmpdir(), "llama2c-"));
  const { v0, v1 } = writeLlama2c(dir, [dim, F, L, H, KV, V, S], arrays, false);
  const a = loadLlama2c(v0), b = loadLlama2c(v1);
  try {
    assert.equal(a.config.tieWordEmbeddings, false);
    assert.deepEqual(Array.from(a.p("lm_head.weight").dataSync()), Array.from(arrays.cls));
    // q rows are permuted from interleaved pairs to halves: row 1 of head 0 is llama2.c's row 2
    assert.deepEqual(Array.from(a.p("model.layers.0.self_attn.q_proj.weight").dataSync().slice(dim, 2 * dim)), Array.from(arrays.wq.slice(2 * dim, 3 * dim)));
    const ids = tf.tensor2d([[1, 4, 2, 9]], [1, 4], "int32");
    const la = a.forward(ids).dataSync(), lb = b.forward(ids).dataSync();
    assert.deepEqual(Array.from(la), Array.from(lb));
    ids.dispose();
  } finally {
    a.dispose(); b.dispose();
  }
  writeFileSync(join(dir, "bad.bin"), Buffer.from(new Int32Array([8, 12, 2, 2, 1, 10, 16, 0]).buffer));
  assert.throws(() => loadLlama2c(join(dir, "bad.bin")), /bad\.bin: 32 bytes, but its header \(dim 8, 2 layers, vocab 10, seq_len 16\) calls for 4604 bytes: the file is cut off/);
  writeFileSync(join(dir, "long.bin"), Buffer.concat([readFileSync(v0), Buffer.alloc(4)]));
  assert.throws(() => loadLlama2c(join(dir, "long.bin")), /long\.bin: \d+ bytes, but its header .* calls for \d+ bytes: the file is longer than the model/);
  for (const [name, size] of [["empty.bin", 0], ["ten.bin", 10]] as const) {
    writeFileSync(join(dir, name), readFileSync(v0).subarray(0, size));
    assert.throws(() => loadLlama2c(join(dir, name)), new RegExp(`${name.replace(".", "\\.")}: ${size} bytes is too short for a llama2.c checkpoint \\(its header alone is 28 bytes\\)`));
  }
});

test("HF config.json round-trips and rejects unknown architectures", () => {
  const cfg = makeConfig({ vocabSize: 100, dim: 32, hiddenDim: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: true });
  const j = toHfConfig(cfg);
  assert.deepEqual(j["architectures"], ["Qwen2ForCausalLM"]);
  assert.equal(j["torch_dtype"], "float32");
  const back = fromHfConfig(j);
  for (const k of ["vocabSize", "dim", "hiddenDim", "nLayers", "nHeads", "nKvHeads", "ropeTheta", "normEps", "tieWordEmbeddings", "attentionBias", "headDim"] as const) {
    assert.equal(back[k], cfg[k], k);
  }
  assert.throws(() => fromHfConfig({ architectures: ["GPT2LMHeadModel"], model_type: "gpt2" }, "m/config.json"), /m\/config.json: unsupported model/);
  assert.throws(() => fromHfConfig({ architectures: ["LlamaForCausalLM"] }, "c.json"), /c.json: missing 'hidden_size'/);
  assert.equal(numParams(makeConfig({ vocabSize: 512, dim: 64, hiddenDim: 172, nLayers: 5, nHeads: 8, nKvHeads: 4 })), 260_032);
});

test("a fresh tiny model trains on wasm: loss falls and the live tensor count stays flat", async () => {
  await initBackend("wasm");
  const cfg = makeConfig({ vocabSize: 16, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 32 });
  const m = initModel(cfg, new Rng(1));
  const opt = tf.train.adam(3e-3);
  // a fixed periodic sequence: next token = (token + 3) mod 16
  const seq = Array.from({ length: 4 * 13 }, (_, i) => ((i % 13) * 3 + Math.floor(i / 13)) % 16);
  const x = tf.tensor2d(seq, [4, 13], "int32");
  const inp = x.slice([0, 0], [4, 12]) as tf.Tensor2D, tgt = x.slice([0, 1], [4, 12]);
  const losses: number[] = [], counts: number[] = [];
  try {
    for (let step = 0; step < 40; step++) {
      const loss = opt.minimize(() => tf.losses.softmaxCrossEntropy(tf.oneHot(tgt.toInt().reshape([-1]), 16), m.forward(inp).reshape([-1, 16])) as tf.Scalar, true, m.trainableVariables())!;
      losses.push(loss.dataSync()[0]!);
      loss.dispose();
      counts.push(tf.memory().numTensors);
    }
    assert.ok(losses[39]! < 0.5 * losses[0]!, `loss ${losses[0]} -> ${losses[39]}`);
    assert.equal(counts[39], counts[5], `tensor count drifted: ${counts.join(",")}`);
  } finally {
    opt.dispose(); m.dispose(); tf.dispose([x, inp, tgt]);
  }
});

test("the value head gives [B, T] values and gradients for the whole model", async () => {
  await initBackend("wasm");
  const cfg = makeConfig({ vocabSize: 16, dim: 16, hiddenDim: 24, nLayers: 1, nHeads: 2, tieWordEmbeddings: false });
  const policy = initModel(cfg, new Rng(2));
  const critic = ValueHeadModel.fromPolicy(policy, new Rng(3));
  try {
    assert.ok(!critic.params.has("lm_head.weight"));
    assert.deepEqual(critic.params.get("score.weight")!.shape, [1, 16]);
    const ids = tf.tensor2d([[1, 2, 3], [4, 5, 6]], [2, 3], "int32");
    const { value, grads } = tf.variableGrads(() => critic.forward(ids).square().mean() as tf.Scalar, critic.trainableVariables());
    assert.deepEqual(critic.forward(ids).shape, [2, 3]);
    assert.equal(Object.keys(grads).length, critic.trainableVariables().length);
    tf.dispose([value, ids, ...Object.values(grads)]);
    // the copied trunk is independent of the policy
    assert.notEqual(critic.params.get("model.norm.weight"), policy.params.get("model.norm.weight"));
  } finally {
    policy.dispose(); critic.dispose();
  }
});
