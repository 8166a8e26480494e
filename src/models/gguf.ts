// GGUF (version 3) writer for our Llama-family policies, so llama.cpp can load the
// trainer's current weights (the llama_cpp rollout engine). Layout, as llama.cpp
// reads it: magic, version, tensor and key counts, typed key/value metadata
// (architecture hyper-parameters under "llama.*", the tokenizer under
// "tokenizer.ggml.*"), tensor descriptors (dimensions innermost first), then the
// tensor bytes, each aligned to 32 bytes. Tensors are named as llama.cpp's llama
// architecture expects. llama.cpp's llama RoPE rotates adjacent pairs (2i, 2i+1)
// while our weights follow Hugging Face's halves convention, so the rows of q and
// k (weights and biases) are reordered per head, as llama.cpp's converter does.
import { closeSync, mkdirSync, openSync, renameSync, rmSync, writeSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { llamaGraphGap } from "./families.js";
import type { ModelConfig } from "./config.js";
import type { GgufVocab } from "./gguf_vocab.js";

export type GgufWeightType = "f32" | "f16";

const ALIGNMENT = 32;
const GGML_F32 = 0, GGML_F16 = 1;
// GGUF metadata value types
const T_UINT32 = 4, T_INT32 = 5, T_FLOAT32 = 6, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9;

type MetaValue =
  | { type: "u32" | "i32" | "f32"; value: number }
  | { type: "bool"; value: boolean }
  | { type: "str"; value: string }
  | { type: "strs"; value: readonly string[] }
  | { type: "f32s"; value: Float32Array }
  | { type: "i32s"; value: Int32Array };

/** A little-endian byte sink that grows as needed. */
class ByteWriter {
  private buf = Buffer.alloc(1 << 16);
  length = 0;

  private reserve(n: number): void {
    if (this.length + n <= this.buf.length) return;
    const next = Buffer.alloc(Math.max(this.buf.length * 2, this.length + n));
    this.buf.copy(next, 0, 0, this.length);
    this.buf = next;
  }
  u32(v: number): void { this.reserve(4); this.buf.writeUInt32LE(v, this.length); this.length += 4; }
  i32(v: number): void { this.reserve(4); this.buf.writeInt32LE(v, this.length); this.length += 4; }
  u64(v: number): void { this.reserve(8); this.buf.writeBigUInt64LE(BigInt(v), this.length); this.length += 8; }
  f32(v: number): void { this.reserve(4); this.buf.writeFloatLE(v, this.length); this.length += 4; }
  u8(v: number): void { this.reserve(1); this.buf[this.length++] = v; }
  str(s: string): void {
    const b = Buffer.from(s, "utf8");
    this.u64(b.length);
    this.reserve(b.length);
    b.copy(this.buf, this.length);
    this.length += b.length;
  }
  pad(to: number): void { while (this.length % to !== 0) this.u8(0); }
  bytes(): Buffer { return this.buf.subarray(0, this.length); }
}

function writeValue(w: ByteWriter, v: MetaValue): void {
  switch (v.type) {
    case "u32": w.u32(T_UINT32); w.u32(v.value); break;
    case "i32": w.u32(T_INT32); w.i32(v.value); break;
    case "f32": w.u32(T_FLOAT32); w.f32(v.value); break;
    case "bool": w.u32(T_BOOL); w.u8(v.value ? 1 : 0); break;
    case "str": w.u32(T_STRING); w.str(v.value); break;
    case "strs": w.u32(T_ARRAY); w.u32(T_STRING); w.u64(v.value.length); for (const s of v.value) w.str(s); break;
    case "f32s": w.u32(T_ARRAY); w.u32(T_FLOAT32); w.u64(v.value.length); for (const x of v.value) w.f32(x); break;
    case "i32s": w.u32(T_ARRAY); w.u32(T_INT32); w.u64(v.value.length); for (const x of v.value) w.i32(x); break;
  }
}

/** float32 -> IEEE half bits, round to nearest even (overflow to infinity, NaN kept). */
export function floatToHalf(f: number): number {
  const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
  f32[0] = f;
  const x = u32[0]!, sign = (x >>> 16) & 0x8000, exp = (x >>> 23) & 0xff, mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    const m = mant | 0x800000, shift = 14 - e;
    let h = m >>> shift;
    const rem = m & ((1 << shift) - 1), half = 1 << (shift - 1);
    if (rem > half || (rem === half && (h & 1))) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++;
  return sign | h;
}

function toHalfBytes(a: Float32Array): Buffer {
  const out = Buffer.alloc(a.length * 2);
  for (let i = 0; i < a.length; i++) out.writeUInt16LE(floatToHalf(a[i]!), 2 * i);
  return out;
}

/** Reorder the rows of q or k (weights [rows, cols] or a bias, cols 1) from halves to interleaved pairs, per head. */
export function permuteHalvesToInterleaved(w: Float32Array, nHeads: number, headDim: number, cols: number): Float32Array {
  if (w.length !== nHeads * headDim * cols) throw new Error(`gguf: q/k tensor of ${w.length} values is not ${nHeads} heads x ${headDim} x ${cols}`);
  const out = new Float32Array(w.length), h = headDim / 2;
  for (let head = 0; head < nHeads; head++) {
    for (let i = 0; i < h; i++) {
      for (let j = 0; j < 2; j++) {
        const src = (head * headDim + j * h + i) * cols, dst = (head * headDim + 2 * i + j) * cols;
        out.set(w.subarray(src, src + cols), dst);
      }
    }
  }
  return out;
}

/** One tensor of the file: our parameter name, llama.cpp's name, its [rows, cols] shape, and the q/k reordering. */
export interface GgufTensorPlan {
  source: string;
  name: string;
  shape: number[];
  permuteHeads?: number;
}

/** The tensors llama.cpp's llama architecture reads, from our (Hugging Face) parameter names. */
export function ggufTensorPlan(c: ModelConfig): GgufTensorPlan[] {
  const plan: GgufTensorPlan[] = [{ source: "model.embed_tokens.weight", name: "token_embd.weight", shape: [c.vocabSize, c.dim] }];
  const Q = c.nHeads * c.headDim, KV = c.nKvHeads * c.headDim;
  for (let i = 0; i < c.nLayers; i++) {
    const p = `model.layers.${i}.`, g = `blk.${i}.`;
    plan.push(
      { source: `${p}input_layernorm.weight`, name: `${g}attn_norm.weight`, shape: [c.dim] },
      { source: `${p}self_attn.q_proj.weight`, name: `${g}attn_q.weight`, shape: [Q, c.dim], permuteHeads: c.nHeads },
      { source: `${p}self_attn.k_proj.weight`, name: `${g}attn_k.weight`, shape: [KV, c.dim], permuteHeads: c.nKvHeads },
      { source: `${p}self_attn.v_proj.weight`, name: `${g}attn_v.weight`, shape: [KV, c.dim] },
    );
    if (c.attentionBias) {
      plan.push(
        { source: `${p}self_attn.q_proj.bias`, name: `${g}attn_q.bias`, shape: [Q], permuteHeads: c.nHeads },
        { source: `${p}self_attn.k_proj.bias`, name: `${g}attn_k.bias`, shape: [KV], permuteHeads: c.nKvHeads },
        { source: `${p}self_attn.v_proj.bias`, name: `${g}attn_v.bias`, shape: [KV] },
      );
    }
    plan.push(
      { source: `${p}self_attn.o_proj.weight`, name: `${g}attn_output.weight`, shape: [c.dim, Q] },
      { source: `${p}post_attention_layernorm.weight`, name: `${g}ffn_norm.weight`, shape: [c.dim] },
      { source: `${p}mlp.gate_proj.weight`, name: `${g}ffn_gate.weight`, shape: [c.hiddenDim, c.dim] },
      { source: `${p}mlp.up_proj.weight`, name: `${g}ffn_up.weight`, shape: [c.hiddenDim, c.dim] },
      { source: `${p}mlp.down_proj.weight`, name: `${g}ffn_down.weight`, shape: [c.dim, c.hiddenDim] },
    );
  }
  plan.push({ source: "model.norm.weight", name: "output_norm.weight", shape: [c.dim] });
  // tied embeddings: llama.cpp reuses token_embd when there is no output tensor
  if (!c.tieWordEmbeddings) plan.push({ source: "lm_head.weight", name: "output.weight", shape: [c.vocabSize, c.dim] });
  return plan;
}

function hyperParameters(c: ModelConfig, weightType: GgufWeightType, name: string): [string, MetaValue][] {
  return [
    ["general.architecture", { type: "str", value: "llama" }],
    ["general.name", { type: "str", value: name }],
    ["general.file_type", { type: "u32", value: weightType === "f16" ? 1 : 0 }],
    ["general.alignment", { type: "u32", value: ALIGNMENT }],
    ["llama.vocab_size", { type: "u32", value: c.vocabSize }],
    ["llama.context_length", { type: "u32", value: c.maxSeqLen }],
    ["llama.embedding_length", { type: "u32", value: c.dim }],
    ["llama.block_count", { type: "u32", value: c.nLayers }],
    ["llama.feed_forward_length", { type: "u32", value: c.hiddenDim }],
    ["llama.attention.head_count", { type: "u32", value: c.nHeads }],
    ["llama.attention.head_count_kv", { type: "u32", value: c.nKvHeads }],
    ["llama.attention.key_length", { type: "u32", value: c.headDim }],
    ["llama.attention.value_length", { type: "u32", value: c.headDim }],
    ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: c.normEps }],
    ["llama.rope.freq_base", { type: "f32", value: c.ropeTheta }],
    ["llama.rope.dimension_count", { type: "u32", value: c.headDim }],
  ];
}

function vocabMetadata(v: GgufVocab): [string, MetaValue][] {
  const kv: [string, MetaValue][] = [
    ["tokenizer.ggml.model", { type: "str", value: v.model }],
    ["tokenizer.ggml.tokens", { type: "strs", value: v.tokens }],
    ["tokenizer.ggml.token_type", { type: "i32s", value: v.tokenTypes }],
  ];
  if (v.pre) kv.push(["tokenizer.ggml.pre", { type: "str", value: v.pre }]);
  if (v.scores) kv.push(["tokenizer.ggml.scores", { type: "f32s", value: v.scores }]);
  if (v.merges) kv.push(["tokenizer.ggml.merges", { type: "strs", value: v.merges }]);
  const ids: [string, number | null | undefined][] = [
    ["bos_token_id", v.bosId], ["eos_token_id", v.eosId], ["unknown_token_id", v.unkId], ["padding_token_id", v.padId],
  ];
  for (const [k, id] of ids) if (id !== null && id !== undefined) kv.push([`tokenizer.ggml.${k}`, { type: "u32", value: id }]);
  // token ids go in directly: llama.cpp never adds BOS/EOS itself
  kv.push(["tokenizer.ggml.add_bos_token", { type: "bool", value: false }], ["tokenizer.ggml.add_eos_token", { type: "bool", value: false }]);
  return kv;
}

export interface WriteGgufOptions {
  weightType?: GgufWeightType;
  name?: string;
}

/**
 * Write a GGUF file for a model of config `c`: `read(name)` returns each parameter
 * (our names, row-major [out, in]) when its turn comes, so only one tensor is held at
 * a time. Written to a temporary file beside `path`, then renamed into place.
 */
export async function writeGguf(
  path: string, c: ModelConfig, vocab: GgufVocab, read: (source: string) => Promise<Float32Array> | Float32Array, opts: WriteGgufOptions = {},
): Promise<{ bytes: number }> {
  const weightType = opts.weightType ?? "f32";
  if (weightType !== "f32" && weightType !== "f16") throw new Error(`gguf: weight type must be f32 or f16, got '${String(weightType)}'`);
  if (vocab.tokens.length !== c.vocabSize) {
    throw new Error(`gguf: the tokenizer table holds ${vocab.tokens.length} tokens but the model's vocabulary is ${c.vocabSize}`);
  }
  // the metadata below carries rope.freq_base only: a scaled RoPE would run unscaled there
  const gap = llamaGraphGap(c) ?? (c.ropeScaling ? `rope scaling '${c.ropeScaling.type}' (only plain RoPE is written to the GGUF)` : null);
  if (gap) throw new Error(`gguf: llama.cpp's llama architecture (the one this export writes) does not run ${gap}; use rollout.name=tfjs`);
  const plan = ggufTensorPlan(c);
  // 2-D weights take the chosen type; norms and biases stay f32, as llama.cpp's converter keeps them
  const typeOf = (t: GgufTensorPlan) => (weightType === "f16" && t.shape.length === 2 ? GGML_F16 : GGML_F32);
  const sizeOf = (t: GgufTensorPlan) => t.shape.reduce((a, b) => a * b, 1) * (typeOf(t) === GGML_F16 ? 2 : 4);
  const meta = [...hyperParameters(c, weightType, opts.name ?? "verl-ts policy"), ...vocabMetadata(vocab)];

  const head = new ByteWriter();
  head.u32(0x46554747); // "GGUF"
  head.u32(3);
  head.u64(plan.length);
  head.u64(meta.length);
  for (const [k, v] of meta) { head.str(k); writeValue(head, v); }
  let offset = 0;
  for (const t of plan) {
    head.str(t.name);
    head.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) head.u64(d); // innermost dimension first
    head.u32(typeOf(t));
    head.u64(offset);
    offset += Math.ceil(sizeOf(t) / ALIGNMENT) * ALIGNMENT;
  }
  head.pad(ALIGNMENT);

  mkdirSync(dirname(path), { recursive: true });
  const tmp = join(dirname(path), `.${basename(path)}.tmp-${process.pid}-${Date.now()}`);
  const fd = openSync(tmp, "w");
  try {
    let total = writeSync(fd, head.bytes());
    for (const t of plan) {
      let data = await read(t.source);
      const n = t.shape.reduce((a, b) => a * b, 1);
      if (data.length !== n) throw new Error(`gguf: parameter '${t.source}' holds ${data.length} values, expected [${t.shape}]`);
      if (t.permuteHeads) data = permuteHalvesToInterleaved(data, t.permuteHeads, c.headDim, t.shape.length === 2 ? t.shape[1]! : 1);
      const bytes = typeOf(t) === GGML_F16 ? toHalfBytes(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
      total += writeSync(fd, bytes);
      const pad = (ALIGNMENT - (bytes.length % ALIGNMENT)) % ALIGNMENT;
      if (pad) total += writeSync(fd, Buffer.alloc(pad));
    }
    closeSync(fd);
    renameSync(tmp, path);
    return { bytes: total };
  } catch (e) {
    try { closeSync(fd); } catch { /* already closed */ }
    rmSync(tmp, { force: true });
    throw e;
  }
}
