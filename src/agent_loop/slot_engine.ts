// The decoding engine behind the continuous-batching server: one KV cache per
// slot (a sequence), each slot at its own length, so one decode step can
// advance sequences at different positions together, and a sequence can join
// (prefill into a free slot) between steps. The arithmetic mirrors
// src/rollout/decoder.ts's KvCacheDecoder operation for operation (float32
// buffers, float64 reductions, XNNPACK products via host kernels), so greedy
// tokens agree with `generate` (tested); that decoder keeps one cache column
// for the whole batch, which cannot hold sequences at different positions.
import { hostKernels, type HostBuffer, type HostKernels, type HostWeight } from "../engine/host_kernels.js";
import type { ModelConfig } from "../models/config.js";
import { ropeInvFreq, type LlamaModel } from "../models/llama.js";

interface LayerWeights {
  attnNorm: Float32Array; wqkv: HostWeight; bqkv?: Float32Array; wo: HostWeight;
  ffnNorm: Float32Array; wgu: HostWeight; wd: HostWeight;
}

export interface SlotEngineOptions {
  numSlots: number;
  /** Longest sequence (prompt + generated) a slot holds. */
  maxLen: number;
  /** Rows per forward call when prefilling (bounds the activation buffers). */
  prefillChunk?: number;
  kernels?: HostKernels;
}

function concat(parts: Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

export class SlotKvEngine {
  readonly vocabSize: number;
  readonly numSlots: number;
  readonly maxLen: number;
  /** Tokens cached per slot. */
  readonly lengths: Int32Array;
  private readonly c: ModelConfig;
  private readonly kernels: HostKernels;
  private readonly layers: LayerWeights[] = [];
  private readonly emb: Float32Array;
  private readonly finalNorm: Float32Array;
  private readonly lmHead: HostWeight;
  /** kCache[slot][layer], allocated on first use: [nKvHeads, maxLen, headDim]. */
  private readonly kCache: Float32Array[][] = [];
  private readonly vCache: Float32Array[][] = [];
  private readonly maxRows: number;
  private readonly x: Float32Array;
  private readonly xn: HostBuffer; private readonly qkv: HostBuffer; private readonly att: HostBuffer;
  private readonly o: HostBuffer; private readonly gu: HostBuffer; private readonly h: HostBuffer;
  private readonly logits: HostBuffer;
  private readonly scores: Float64Array;
  private readonly qScratch: Float64Array;
  private readonly maxScratch: Float64Array;
  private readonly denScratch: Float64Array;
  private readonly ropeCos: Float32Array;
  private readonly ropeSin: Float32Array;

  constructor(model: LlamaModel, opts: SlotEngineOptions) {
    const c = (this.c = model.config);
    if (!Number.isInteger(opts.numSlots) || opts.numSlots < 1) throw new Error(`SlotKvEngine: numSlots must be a positive integer, got ${opts.numSlots}`);
    if (!Number.isInteger(opts.maxLen) || opts.maxLen < 2) throw new Error(`SlotKvEngine: maxLen must be an integer >= 2, got ${opts.maxLen}`);
    this.vocabSize = c.vocabSize;
    this.numSlots = opts.numSlots;
    this.maxLen = opts.maxLen;
    this.lengths = new Int32Array(opts.numSlots);
    this.kernels = opts.kernels ?? hostKernels();
    // Weights are copied now: an engine decodes with the weights of its creation.
    const read = (n: string) => model.p(n).dataSync() as Float32Array;
    const Q = c.nHeads * c.headDim, KV = c.nKvHeads * c.headDim, D = c.dim, F = c.hiddenDim;
    for (let i = 0; i < c.nLayers; i++) {
      const p = (n: string) => read(`model.layers.${i}.${n}`);
      this.layers.push({
        attnNorm: p("input_layernorm.weight"),
        wqkv: this.kernels.weight(concat([p("self_attn.q_proj.weight"), p("self_attn.k_proj.weight"), p("self_attn.v_proj.weight")]), Q + 2 * KV, D),
        bqkv: c.attentionBias ? concat([p("self_attn.q_proj.bias"), p("self_attn.k_proj.bias"), p("self_attn.v_proj.bias")]) : undefined,
        wo: this.kernels.weight(p("self_attn.o_proj.weight"), D, Q),
        ffnNorm: p("post_attention_layernorm.weight"),
        wgu: this.kernels.weight(concat([p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")]), 2 * F, D),
        wd: this.kernels.weight(p("mlp.down_proj.weight"), D, F),
      });
    }
    this.emb = read("model.embed_tokens.weight");
    this.finalNorm = read("model.norm.weight");
    this.lmHead = this.kernels.weight(c.tieWordEmbeddings ? this.emb : read("lm_head.weight"), c.vocabSize, D);
    const N = (this.maxRows = Math.max(opts.numSlots, opts.prefillChunk ?? 256));
    this.x = new Float32Array(N * D);
    this.xn = this.kernels.alloc(N * D);
    this.qkv = this.kernels.alloc(N * (Q + 2 * KV));
    this.att = this.kernels.alloc(N * Q);
    this.o = this.kernels.alloc(N * D);
    this.gu = this.kernels.alloc(N * 2 * F);
    this.h = this.kernels.alloc(N * F);
    this.logits = this.kernels.alloc(opts.numSlots * c.vocabSize);
    const g = c.nHeads / c.nKvHeads;
    this.scores = new Float64Array(g * opts.maxLen);
    this.qScratch = new Float64Array(g * c.headDim);
    this.maxScratch = new Float64Array(g);
    this.denScratch = new Float64Array(g);
    // Angles in float32, as the tfjs forward and PyTorch compute them.
    const inv = ropeInvFreq(c.headDim, c.ropeTheta), h = c.headDim / 2;
    this.ropeCos = new Float32Array(opts.maxLen * h);
    this.ropeSin = new Float32Array(opts.maxLen * h);
    for (let p = 0; p < opts.maxLen; p++) {
      for (let i = 0; i < h; i++) {
        const a = Math.fround(p * inv[i]!);
        this.ropeCos[p * h + i] = Math.cos(a);
        this.ropeSin[p * h + i] = Math.sin(a);
      }
    }
  }

  /** Forget all but the first `len` cached tokens of a slot (0 frees it). */
  truncate(slot: number, len: number): void {
    if (len < 0 || len > this.lengths[slot]!) throw new Error(`SlotKvEngine: cannot truncate slot ${slot} of ${this.lengths[slot]} tokens to ${len}`);
    this.lengths[slot] = len;
  }

  /** Feed `tokens` to `slot` after what it holds; returns the last token's logits [V] (valid until the next call). */
  append(slot: number, tokens: ArrayLike<number>): Float32Array {
    if (tokens.length === 0) throw new Error("SlotKvEngine.append: no tokens");
    if (this.lengths[slot]! + tokens.length > this.maxLen) {
      throw new Error(`SlotKvEngine: ${this.lengths[slot]! + tokens.length} tokens exceed the slot length ${this.maxLen}`);
    }
    const slots = Int32Array.of(slot);
    let out: Float32Array = new Float32Array(0);
    for (let c0 = 0; c0 < tokens.length; c0 += this.maxRows) {
      const chunk = Int32Array.from({ length: Math.min(this.maxRows, tokens.length - c0) }, (_, i) => tokens[c0 + i]!);
      out = this.run(slots, chunk, chunk.length);
    }
    return out;
  }

  /** One token for each slot, each at its own next position; returns logits [slots.length, V]. */
  decode(slots: Int32Array, tokens: Int32Array): Float32Array {
    if (slots.length > this.maxRows) throw new Error(`SlotKvEngine: ${slots.length} rows exceed the buffers`);
    for (const s of slots) if (this.lengths[s]! >= this.maxLen) throw new Error(`SlotKvEngine: slot ${s} is full (${this.maxLen} tokens)`);
    return this.run(slots, tokens, 1);
  }

  /** T new tokens for each of `slots`, appended at their own lengths; logits of each row's last token. */
  private run(slots: Int32Array, tokens: Int32Array, T: number): Float32Array {
    const c = this.c, D = c.dim, F = c.hiddenDim, R = slots.length, N = R * T;
    const W = (c.nHeads + 2 * c.nKvHeads) * c.headDim;
    const x = this.x, k = this.kernels;
    for (const s of slots) this.ensureCache(s);
    for (let n = 0; n < N; n++) {
      const tkn = tokens[n]!;
      if (tkn < 0 || tkn >= c.vocabSize) throw new Error(`SlotKvEngine: token id ${tkn} outside the vocabulary [0, ${c.vocabSize})`);
      x.set(this.emb.subarray(tkn * D, tkn * D + D), n * D);
    }
    for (let l = 0; l < c.nLayers; l++) {
      const L = this.layers[l]!;
      rmsNorm(x, this.xn.view(), N, D, L.attnNorm, c.normEps);
      k.matmul(this.xn, N, L.wqkv, this.qkv);
      const qkv = this.qkv.view();
      if (L.bqkv) for (let n = 0; n < N; n++) for (let j = 0; j < W; j++) qkv[n * W + j]! += L.bqkv[j]!;
      this.ropeAndStore(l, qkv, slots, T);
      this.attention(l, qkv, this.att.view(), slots, T);
      k.matmul(this.att, N, L.wo, this.o);
      addInto(x, this.o.view(), N * D);
      rmsNorm(x, this.xn.view(), N, D, L.ffnNorm, c.normEps);
      k.matmul(this.xn, N, L.wgu, this.gu);
      swiGlu(this.gu.view(), this.h.view(), N, F);
      k.matmul(this.h, N, L.wd, this.o);
      addInto(x, this.o.view(), N * D);
    }
    for (const s of slots) this.lengths[s]! += T;
    let last: Float32Array = x;
    if (T > 1) {
      last = new Float32Array(R * D);
      for (let r = 0; r < R; r++) last.set(x.subarray((r * T + T - 1) * D, (r * T + T) * D), r * D);
    }
    rmsNorm(last, this.xn.view(), R, D, this.finalNorm, c.normEps);
    k.matmul(this.xn, R, this.lmHead, this.logits);
    return this.logits.view().subarray(0, R * c.vocabSize);
  }

  private ensureCache(slot: number): void {
    if (slot < 0 || slot >= this.numSlots) throw new Error(`SlotKvEngine: slot ${slot} out of [0, ${this.numSlots})`);
    if (this.kCache[slot]) return;
    const size = this.c.nKvHeads * this.maxLen * this.c.headDim;
    this.kCache[slot] = Array.from({ length: this.c.nLayers }, () => new Float32Array(size));
    this.vCache[slot] = Array.from({ length: this.c.nLayers }, () => new Float32Array(size));
  }

  /** Rotate q and k in place (HF halves) at each token's position (= its column) and cache k, v. */
  private ropeAndStore(l: number, qkv: Float32Array, slots: Int32Array, T: number): void {
    const c = this.c, hd = c.headDim, h = hd / 2, W = (c.nHeads + 2 * c.nKvHeads) * hd, nRot = c.nHeads + c.nKvHeads;
    const cos = this.ropeCos, sin = this.ropeSin;
    for (let r = 0; r < slots.length; r++) {
      const s = slots[r]!, K = this.kCache[s]![l]!, V = this.vCache[s]![l]!;
      for (let t = 0; t < T; t++) {
        const n = r * T + t, base = n * W, col = this.lengths[s]! + t, tp = col * h;
        for (let head = 0; head < nRot; head++) {
          const o = base + head * hd;
          for (let i = 0; i < h; i++) {
            const x1 = qkv[o + i]!, x2 = qkv[o + i + h]!, co = cos[tp + i]!, si = sin[tp + i]!;
            qkv[o + i] = x1 * co - x2 * si;
            qkv[o + i + h] = x2 * co + x1 * si;
          }
        }
        for (let j = 0; j < c.nKvHeads; j++) {
          const dst = (j * this.maxLen + col) * hd;
          const ks = base + (c.nHeads + j) * hd, vs = base + (c.nHeads + c.nKvHeads + j) * hd;
          for (let d = 0; d < hd; d++) { K[dst + d] = qkv[ks + d]!; V[dst + d] = qkv[vs + d]!; }
        }
      }
    }
  }

  /**
   * Causal attention of each new token over its slot's columns [0, its own].
   * The g query heads sharing a kv head go through the cached keys and values
   * together (one pass over memory); each dot product and each output sum runs
   * in the same order as KvCacheDecoder's, so the numbers are the same.
   */
  private attention(l: number, qkv: Float32Array, out: Float32Array, slots: Int32Array, T: number): void {
    const c = this.c, hd = c.headDim, g = c.nHeads / c.nKvHeads, W = (c.nHeads + 2 * c.nKvHeads) * hd, Q = c.nHeads * hd;
    const scale = 1 / Math.sqrt(hd), maxLen = this.maxLen, sc = this.scores, q = this.qScratch;
    const max = this.maxScratch, den = this.denScratch;
    for (let r = 0; r < slots.length; r++) {
      const s = slots[r]!, K = this.kCache[s]![l]!, V = this.vCache[s]![l]!;
      for (let t = 0; t < T; t++) {
        const n = r * T + t, qc = this.lengths[s]! + t, span = qc + 1;
        for (let kvh = 0; kvh < c.nKvHeads; kvh++) {
          const kvBase = kvh * maxLen * hd, h0 = kvh * g;
          for (let i = 0; i < g * hd; i++) q[i] = qkv[n * W + h0 * hd + i]!;
          for (let i = 0; i < g; i++) max[i] = -Infinity;
          for (let j = 0; j <= qc; j++) {
            const ko = kvBase + j * hd;
            for (let i = 0; i < g; i++) {
              let dot = 0;
              const qo = i * hd;
              for (let d = 0; d < hd; d++) dot += q[qo + d]! * K[ko + d]!;
              dot *= scale;
              sc[i * span + j] = dot;
              if (dot > max[i]!) max[i] = dot;
            }
          }
          for (let i = 0; i < g; i++) {
            let sum = 0;
            const m = max[i]!, so = i * span;
            for (let j = 0; j <= qc; j++) { const e = Math.exp(sc[so + j]! - m); sc[so + j] = e; sum += e; }
            den[i] = 1 / sum;
            out.fill(0, n * Q + (h0 + i) * hd, n * Q + (h0 + i + 1) * hd);
          }
          for (let j = 0; j <= qc; j++) {
            const vo = kvBase + j * hd;
            for (let i = 0; i < g; i++) {
              const p = sc[i * span + j]! * den[i]!;
              if (p === 0) continue;
              const oo = n * Q + (h0 + i) * hd;
              for (let d = 0; d < hd; d++) out[oo + d]! += p * V[vo + d]!;
            }
          }
        }
      }
    }
  }

  dispose(): void {
    this.kernels.dispose();
    this.kCache.length = 0;
    this.vCache.length = 0;
  }
}

function rmsNorm(x: Float32Array, out: Float32Array, N: number, D: number, w: Float32Array, eps: number): void {
  for (let n = 0; n < N; n++) {
    const o = n * D;
    let ss = 0;
    for (let d = 0; d < D; d++) ss += x[o + d]! * x[o + d]!;
    const r = 1 / Math.sqrt(ss / D + eps);
    for (let d = 0; d < D; d++) out[o + d] = x[o + d]! * r * w[d]!;
  }
}

function addInto(x: Float32Array, y: Float32Array, n: number): void {
  for (let i = 0; i < n; i++) x[i]! += y[i]!;
}

/** h = silu(gate) * up, from rows laid out [gate (F) | up (F)]. */
function swiGlu(gu: Float32Array, h: Float32Array, N: number, F: number): void {
  for (let n = 0; n < N; n++) {
    const gi = n * 2 * F, ho = n * F;
    for (let j = 0; j < F; j++) {
      const g = gu[gi + j]!;
      h[ho + j] = (g / (1 + Math.exp(-g))) * gu[gi + F + j]!;
    }
  }
}
