// Loader for Andrej Karpathy's llama2.c checkpoints: the legacy "version 0"
// layout (seven int32 then float32 arrays; vocab < 0 means an untied output
// projection) and the float32 "version 1" export (magic "ak42", 256-byte header).
// llama2.c rotates adjacent pairs (2i, 2i+1) in RoPE; we use Hugging Face's
// halves convention, so wq and wk rows are permuted on load, exactly as HF's
// conversion script does.
import { readFileSync } from "node:fs";
import * as tf from "@tensorflow/tfjs";
import { makeConfig, type ModelConfig } from "./config.js";
import { requireFiniteWeights } from "./finite.js";
import { LlamaModel, toVariables } from "./llama.js";

const MAGIC_V1 = 0x616b3432;

/** Reorder the rows of one projection from interleaved pairs to halves, per head. */
export function permuteInterleavedToHalves(w: Float32Array, nHeads: number, headDim: number, cols: number): Float32Array {
  const out = new Float32Array(w.length), h = headDim / 2;
  for (let head = 0; head < nHeads; head++) {
    for (let i = 0; i < h; i++) {
      for (let j = 0; j < 2; j++) {
        const src = (head * headDim + 2 * i + j) * cols, dst = (head * headDim + j * h + i) * cols;
        out.set(w.subarray(src, src + cols), dst);
      }
    }
  }
  return out;
}

interface Header { config: ModelConfig; shared: boolean; dataOffset: number; version: 0 | 1 }

const HEADER_BYTES = { 0: 28, 1: 256 } as const;

function readHeader(view: DataView, path: string): Header {
  let off = 0, version: 0 | 1 = 0;
  if (view.byteLength < HEADER_BYTES[0]) {
    throw new Error(`${path}: ${view.byteLength} bytes is too short for a llama2.c checkpoint (its header alone is ${HEADER_BYTES[0]} bytes); the file is empty or cut off: export it again`);
  }
  if (view.getUint32(0, true) === MAGIC_V1) {
    if (view.byteLength < HEADER_BYTES[1]) throw new Error(`${path}: ${view.byteLength} bytes is too short for a llama2.c version-1 checkpoint (its header alone is ${HEADER_BYTES[1]} bytes); export it again`);
    const v = view.getInt32(4, true);
    if (v !== 1) throw new Error(`${path}: llama2.c checkpoint version ${v} is not supported (only float32 versions 0 and 1)`);
    version = 1;
    off = 8;
  }
  const h = Array.from({ length: 7 }, (_, i) => view.getInt32(off + 4 * i, true));
  const [dim, hiddenDim, nLayers, nHeads, nKvHeads, vocab, seqLen] = h as [number, number, number, number, number, number, number];
  const shared = version === 1 ? view.getUint8(off + 28) !== 0 : vocab > 0;
  if ([dim, hiddenDim, nLayers, nHeads, nKvHeads, seqLen].some((v) => v <= 0) || vocab === 0 || dim % nHeads !== 0) {
    throw new Error(`${path}: not a llama2.c checkpoint (header ${JSON.stringify(h)})`);
  }
  const config = makeConfig({
    vocabSize: Math.abs(vocab), dim, hiddenDim, nLayers, nHeads, nKvHeads, maxSeqLen: seqLen,
    ropeTheta: 10000, normEps: 1e-5, tieWordEmbeddings: shared, attentionBias: false, headDim: dim / nHeads,
    modelType: "llama", bosTokenId: 1, eosTokenId: 2,
  });
  return { config, shared, dataOffset: HEADER_BYTES[version], version };
}

/** Bytes the header's shapes call for: a shorter or longer file is cut off or not this model. */
function expectedBytes(hdr: Header): number {
  const c = hdr.config, D = c.dim, q = c.nHeads * c.headDim, kv = c.nKvHeads * c.headDim, F = c.hiddenDim;
  const perLayer = 2 * D + q * D + 2 * kv * D + D * q + 3 * F * D;
  const ropeTables = hdr.version === 0 ? c.maxSeqLen * c.headDim : 0; // legacy freq_cis_real + freq_cis_imag
  const floats = c.vocabSize * D * (hdr.shared ? 1 : 2) + c.nLayers * perLayer + D + ropeTables;
  return hdr.dataOffset + 4 * floats;
}

/** Load a llama2.c checkpoint as a LlamaModel with HF parameter names and RoPE convention. */
export function loadLlama2c(path: string): LlamaModel {
  const file = readFileSync(path);
  const bytes = new Uint8Array(file.byteLength);
  bytes.set(file); // own, aligned buffer
  const hdr = readHeader(new DataView(bytes.buffer), path);
  const want = expectedBytes(hdr);
  if (bytes.byteLength !== want) {
    const c = hdr.config;
    throw new Error(`${path}: ${bytes.byteLength} bytes, but its header (dim ${c.dim}, ${c.nLayers} layers, vocab ${c.vocabSize}, seq_len ${c.maxSeqLen}) `
      + `calls for ${want} bytes: the file is ${bytes.byteLength < want ? "cut off" : "longer than the model"} or not a llama2.c checkpoint; export it again`);
  }
  const c = hdr.config, hd = c.headDim, L = c.nLayers;
  const floats = new Float32Array(bytes.buffer, hdr.dataOffset, Math.floor((bytes.byteLength - hdr.dataOffset) / 4));
  let at = 0;
  const take = (n: number, what: string): Float32Array => {
    if (at + n > floats.length) throw new Error(`${path}: file ends inside '${what}' (truncated or wrong header)`);
    const a = floats.subarray(at, at + n);
    at += n;
    if (what !== "rope tables") requireFiniteWeights(a, what, path);
    return a;
  };
  const perLayer = (n: number, what: string) => { const all = take(L * n, what); return (i: number) => all.subarray(i * n, (i + 1) * n); };
  const q = c.nHeads * hd, kv = c.nKvHeads * hd, D = c.dim, F = c.hiddenDim;

  let emb: Float32Array, attNorm, ffnNorm, wq, wk, wv, wo, w1, w2, w3, finalNorm: Float32Array;
  if (hdr.version === 0) {
    emb = take(c.vocabSize * D, "token embedding");
    attNorm = perLayer(D, "attention norm"); wq = perLayer(q * D, "wq"); wk = perLayer(kv * D, "wk"); wv = perLayer(kv * D, "wv");
    wo = perLayer(D * q, "wo"); ffnNorm = perLayer(D, "ffn norm"); w1 = perLayer(F * D, "w1"); w2 = perLayer(D * F, "w2"); w3 = perLayer(F * D, "w3");
    finalNorm = take(D, "final norm");
    take(c.maxSeqLen * hd, "rope tables"); // legacy freq_cis_real + freq_cis_imag, unused
  } else {
    attNorm = perLayer(D, "attention norm"); ffnNorm = perLayer(D, "ffn norm"); finalNorm = take(D, "final norm");
    emb = take(c.vocabSize * D, "token embedding");
    wq = perLayer(q * D, "wq"); wk = perLayer(kv * D, "wk"); wv = perLayer(kv * D, "wv"); wo = perLayer(D * q, "wo");
    w1 = perLayer(F * D, "w1"); w2 = perLayer(D * F, "w2"); w3 = perLayer(F * D, "w3");
  }
  const cls = hdr.shared ? undefined : take(c.vocabSize * D, "output projection");
  if (at !== floats.length) throw new Error(`${path}: ${floats.length - at} trailing floats after the weights (wrong header?)`);

  const t = new Map<string, tf.Tensor>();
  t.set("model.embed_tokens.weight", tf.tensor2d(emb, [c.vocabSize, D]));
  for (let i = 0; i < L; i++) {
    const p = `model.layers.${i}.`;
    t.set(p + "input_layernorm.weight", tf.tensor1d(attNorm(i)));
    t.set(p + "self_attn.q_proj.weight", tf.tensor2d(permuteInterleavedToHalves(wq(i), c.nHeads, hd, D), [q, D]));
    t.set(p + "self_attn.k_proj.weight", tf.tensor2d(permuteInterleavedToHalves(wk(i), c.nKvHeads, hd, D), [kv, D]));
    t.set(p + "self_attn.v_proj.weight", tf.tensor2d(wv(i), [kv, D]));
    t.set(p + "self_attn.o_proj.weight", tf.tensor2d(wo(i), [D, q]));
    t.set(p + "post_attention_layernorm.weight", tf.tensor1d(ffnNorm(i)));
    t.set(p + "mlp.gate_proj.weight", tf.tensor2d(w1(i), [F, D]));
    t.set(p + "mlp.down_proj.weight", tf.tensor2d(w2(i), [D, F]));
    t.set(p + "mlp.up_proj.weight", tf.tensor2d(w3(i), [F, D]));
  }
  t.set("model.norm.weight", tf.tensor1d(finalNorm));
  if (cls) t.set("lm_head.weight", tf.tensor2d(cls, [c.vocabSize, D]));
  try {
    return new LlamaModel(c, toVariables(t));
  } finally {
    tf.dispose([...t.values()]);
  }
}
