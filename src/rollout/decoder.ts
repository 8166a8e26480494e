// Autoregressive decoding engines behind `generate`. The rollout's fast path is
// `KvCacheDecoder`: a dedicated inference engine (as verl hands rollout to vLLM)
// over host Float32Arrays, with a preallocated KV cache written in place, one
// fused q/k/v product and one fused gate/up product per layer, and the dense
// products in XNNPACK (host_kernels.ts). `FullForwardDecoder` recomputes the
// whole prefix with the tfjs training forward each step: slow, but it is the
// reference the fast path is tested against (same tokens, same log-probs).
import * as tf from "@tensorflow/tfjs";
import { hostKernels, type HostBuffer, type HostKernels } from "../engine/host_kernels.js";
import type { ModelConfig } from "../models/config.js";
import { layerWindow, sparseLayerCount } from "../models/config.js";
import { ropeInvFreq, type LlamaModel } from "../models/llama.js";
import type { RopeScaling } from "../models/rope.js";
import { KvCache } from "./kv_cache.js";
import { samePromptSource } from "./prompts.js";
import { cachedDecodeWeights, prepareDecodeWeights, type DecodeWeights, type LayerWeights } from "./decode_weights.js";
import { activationGroup, quantizeActivations, rolloutQuantization, type RolloutQuantSpec } from "./fp8.js";
import { SimdArena } from "../engine/simd/arena.js";
import { buildSwiGluKernel, type SwiGluKernel } from "../engine/simd/swiglu_kernel.js";

export interface StepDecoder {
  readonly vocabSize: number;
  /**
   * Run the prompt columns [0, P) of every row (ids, positions, mask are [B, P]).
   * Returns the logits [B, V] at column P-1. The view is valid until the next call.
   */
  prefill(ids: Int32Array, positions: Int32Array, mask: ArrayLike<number>, P: number): Float32Array;
  /** Append one token to each of `rows` at column `slot` (one for all, or one per row); returns logits [rows.length, V]. */
  step(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slot: number | Int32Array): Float32Array;
  dispose(): void;
}

/**
 * A decoder of independent cache rows ("slots"), each at its own column: what a
 * continuous-batching server drives (requests join and leave between calls, a
 * finished conversation's row is kept for its next turn). A GPU decoder may
 * answer asynchronously.
 */
/** One request's sampling for SlotDecoder.forwardSample: its settings, its stream's seed (32 bits) and the index of the token drawn. */
export interface RowSampling { temperature: number; topK: number; topP: number; doSample: boolean; seed: number; step: number }

/** What forwardSample reads back: one id and its log-prob per row. */
export interface SampledRows { ids: Int32Array; logProbs: Float32Array }

/** A device-sampled step queued by forwardSample. */
export interface SampledStep {
  /** Its ids and log-probs, once the device has run it. */
  readonly result: Promise<SampledRows>;
  /** Frees its ids on the device (once read back, if not yet); call after the last step fed from it was queued. */
  dispose(): void;
}

export interface SlotDecoder {
  readonly vocabSize: number;
  /**
   * T new tokens for each of `rows`, at columns slotStart[r] .. slotStart[r]+T-1 (positions
   * per token); returns the logits [rows.length, V] of each row's last new token, valid until the next call.
   */
  forwardRows(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number): Float32Array | Promise<Float32Array>;
  /**
   * Optional (a decoder that samples on its device): as forwardRows, then each row's next token
   * drawn from its last logits with `sampling[r]`; only the ids and their log-probs come back
   * (log p under softmax(logits / T), T = 1 when greedy, as TokenSampler reports). A row's draw
   * depends on its (seed, step) alone, not on the other rows of the call. Returns at once, with
   * the step queued: its ids stay on the device, so the next step can be queued before this one
   * is read back, with `prev` set to this step and a token -1 - j meaning "the id this step drew
   * for its row j" (T = 1). `sampling` null: the tokens are only written to the cache (a prefill
   * chunk before the last) and null comes back.
   */
  forwardSample?(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number, sampling: readonly RowSampling[] | null, prev?: SampledStep): SampledStep | null;
  /** Keep only columns [0, len) of `row`. */
  truncateRow(row: number, len: number): void;
  /** MoE: record each forwarded token's experts, [slots, maxLen, sparseLayers, topK]; decoders without it cannot. */
  recordRouting?(): Int32Array;
  dispose(): void;
}

/** What a forwardRows call takes besides token ids, or gives besides the last tokens' logits (speculative decoding's needs). */
export interface ForwardIo {
  /** [N, dim] input rows in place of the token embeddings (an MTP layer's projected input) */
  inputRows?: Float32Array;
  /** receives every token's hidden state before the final norm [N, dim] */
  hidden?: Float32Array;
  /** logits of every token [N, V] rather than of each row's last */
  allTokens?: boolean;
  /** the tokens (indices in [0, N)) whose logits come back, in this order, in place of each row's last; none skips the output projection */
  logitsOf?: ArrayLike<number>;
}

/** Builds a SlotDecoder of `slots` rows of `maxLen` columns over the model's current weights. */
export type SlotDecoderFactory = (model: LlamaModel, slots: number, maxLen: number, prefillChunk: number) => SlotDecoder;

export class KvCacheDecoder implements StepDecoder, SlotDecoder {
  readonly vocabSize: number;
  private readonly c: ModelConfig;
  private readonly kernels: HostKernels;
  private readonly w: DecodeWeights;
  private readonly cache: KvCache;
  private readonly glu?: { kernel: SwiGluKernel; gu: Float32Array; h: Float32Array; guAt: number; hAt: number };
  private readonly maxRows: number;
  private readonly x: Float32Array;
  private readonly xn: HostBuffer; private readonly qkv: HostBuffer; private readonly att: HostBuffer;
  private readonly o: HostBuffer; private readonly gu: HostBuffer; private readonly h: HostBuffer;
  private readonly logits: HostBuffer;
  /** logits of every token of a call (ForwardIo.allTokens), grown on demand */
  private allLogits?: HostBuffer;
  /** rotary tables: [0] the full layers', [1] the sliding layers' when their RoPE differs (Gemma 3) */
  private readonly ropes: RopeTable[];
  /** MoE buffers: router logits, one expert's gathered rows, its gate/up, hidden and output */
  private readonly moe?: { logits: HostBuffer; xe: HostBuffer; gu: HostBuffer; h: HostBuffer; ye: HostBuffer; rows: Int32Array; weights: Float32Array };
  /**
   * MoE routing record (rollout.enable_rollout_routing_replay): the experts each token was routed to,
   * [batch, maxLen, sparseLayers, topK] by cache row and column; null until recordRouting() is called.
   */
  private routing: Int32Array | null = null;
  /** For each layer, its index among the sparse layers (-1 for dense ones). */
  private readonly sparseIndex: Int32Array;
  /** The quantized rollout the weights were laid out for (its products' inputs are rounded to match) */
  private readonly quant?: RolloutQuantSpec;

  constructor(model: LlamaModel, readonly batch: number, readonly maxLen: number, opts: { kernels?: HostKernels; maxRowsPerCall?: number; simd?: boolean } = {}) {
    const c = (this.c = model.config);
    this.vocabSize = c.vocabSize;
    this.kernels = opts.kernels ?? hostKernels();
    // with the default kernels the weights come from a per-model cache; given kernels own their own copy
    this.w = opts.kernels ? prepareDecodeWeights(model, opts.kernels) : cachedDecodeWeights(model, tf.getBackend());
    this.quant = rolloutQuantization(model);
    const Q = c.nHeads * c.headDim, KV = c.nKvHeads * c.headDim, D = c.dim, F = c.hiddenDim;
    // rows per forward: enough for prompt chunks of 64 columns, at most 2048 (prefill is chunked to fit)
    const N = (this.maxRows = Math.max(batch, opts.maxRowsPerCall ?? Math.min(2048, 64 * batch)));
    // SIMD kernels (attention, SwiGLU) work in one arena that also holds the cache
    const need = KvCache.arenaNeeds(c, batch, maxLen, N), gluFloats = F % 4 === 0 ? 3 * N * F : 0;
    const arena = opts.simd === false ? undefined : SimdArena.create(need.floats + gluFloats, need.regions + 2);
    this.cache = new KvCache(c, batch, maxLen, N, arena);
    if (arena && gluFloats) {
      const guAt = arena.take(2 * N * F), hAt = arena.take(N * F);
      this.glu = { kernel: buildSwiGluKernel(arena.memory, F), gu: arena.view(guAt, 2 * N * F), h: arena.view(hAt, N * F), guAt, hAt };
    }
    this.x = new Float32Array(N * D);
    this.xn = this.kernels.alloc(N * D);
    this.qkv = this.kernels.alloc(N * (Q + 2 * KV));
    this.att = this.kernels.alloc(N * Q);
    this.o = this.kernels.alloc(N * D);
    this.gu = this.kernels.alloc(N * 2 * F);
    this.h = this.kernels.alloc(N * F);
    this.logits = this.kernels.alloc(batch * c.vocabSize);
    this.ropes = [new RopeTable(c.headDim, c.ropeTheta, c.ropeScaling ?? null)];
    if (c.localRope) this.ropes.push(new RopeTable(c.headDim, c.localRope.theta, c.localRope.scaling));
    if (c.moe) {
      const Fm = c.moe.intermediateSize;
      this.moe = {
        logits: this.kernels.alloc(N * c.moe.numExperts), xe: this.kernels.alloc(N * D), gu: this.kernels.alloc(N * 2 * Fm),
        h: this.kernels.alloc(N * Fm), ye: this.kernels.alloc(N * D), rows: new Int32Array(N), weights: new Float32Array(N),
      };
    }
    let j = 0;
    this.sparseIndex = Int32Array.from({ length: c.nLayers }, (_, l) => (c.moe?.sparseLayers[l] ? j++ : -1));
  }

  /**
   * Start recording the experts every forwarded token is routed to (verl's rollout routing replay);
   * returns the record [batch, maxLen, sparseLayers, topK], 0 where no token was forwarded.
   */
  recordRouting(): Int32Array {
    const m = this.c.moe;
    if (!m) throw new Error("KvCacheDecoder: the model has no routed experts to record (rollout routing replay needs a MoE model such as qwen3_moe)");
    this.routing = new Int32Array(this.batch * this.maxLen * sparseLayerCount(this.c) * m.topK);
    return this.routing;
  }

  prefill(ids: Int32Array, positions: Int32Array, mask: ArrayLike<number>, P: number): Float32Array {
    const B = this.batch;
    if (P < 1 || P > this.maxLen) throw new Error(`KvCacheDecoder: prompt length ${P} must be in [1, ${this.maxLen}]`);
    this.resetRows(Int32Array.from({ length: B }, (_, b) => b));
    // rows repeating an earlier row's prompt (verl's rollout.n) copy its cache instead of running it
    const source = samePromptSource(ids, Int32Array.from(mask), positions, B, P);
    const rows = Int32Array.from(source.keys()).filter((b) => source[b] === b), k = rows.length;
    let start = P - 1; // columns that are padding in every row need no work
    for (const b of rows) {
      for (let s = 0; s < start; s++) if (mask[b * P + s] !== 0) { start = s; break; }
    }
    const chunk = Math.max(1, Math.floor(this.maxRows / k));
    let out: Float32Array = new Float32Array(0);
    for (let c0 = start; c0 < P; c0 += chunk) {
      const T = Math.min(chunk, P - c0);
      const tok = new Int32Array(k * T), pos = new Int32Array(k * T), valid = new Uint8Array(k * T);
      rows.forEach((b, r) => {
        for (let t = 0; t < T; t++) {
          const i = b * P + c0 + t;
          tok[r * T + t] = ids[i]!; pos[r * T + t] = positions[i]!; valid[r * T + t] = mask[i] !== 0 ? 1 : 0;
        }
      });
      out = this.forwardRows(rows, tok, pos, new Int32Array(k).fill(c0), T, valid);
    }
    if (k === B) return out;
    const V = this.c.vocabSize, logits = new Float32Array(B * V), at = new Int32Array(B);
    rows.forEach((b, r) => { at[b] = r; });
    // the routing record's prompt columns come with the cache: a sibling replays its source's experts
    const rec = this.routing, SK = rec ? rec.length / (B * this.maxLen) : 0;
    for (let b = 0; b < B; b++) {
      if (source[b] !== b) {
        this.cache.copyRow(b, source[b]!);
        if (rec) rec.copyWithin(b * this.maxLen * SK, source[b]! * this.maxLen * SK, (source[b]! * this.maxLen + P) * SK);
      }
      logits.set(out.subarray(at[source[b]!]! * V, (at[source[b]!]! + 1) * V), b * V);
    }
    return logits;
  }

  step(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slot: number | Int32Array): Float32Array {
    const slots = typeof slot === "number" ? new Int32Array(rows.length).fill(slot) : slot;
    return this.forwardRows(rows, tokens, positions, slots, 1);
  }

  /** Forget what `rows` hold, so they can start new sequences. */
  resetRows(rows: Int32Array): void {
    for (const b of rows) this.cache.reset(b);
  }

  /**
   * Keep only cache columns [0, len) of `row`, so a sequence whose prefix it
   * holds (the next turn of a conversation) can continue from column len.
   */
  truncateRow(row: number, len: number): void {
    if (row < 0 || row >= this.batch) throw new Error(`KvCacheDecoder: row ${row} outside [0, ${this.batch})`);
    if (!Number.isInteger(len) || len < 0 || len > this.maxLen) throw new Error(`KvCacheDecoder: cannot keep ${len} columns of a cache of length ${this.maxLen}`);
    this.cache.truncate(row, len);
  }

  /** Whether attention runs in the WebAssembly SIMD kernel. */
  get usesSimd(): boolean {
    return this.cache.usesSimd;
  }

  /**
   * The general step: T new tokens for each of `rows` (cache rows), placed at
   * cache columns slotStart[r] .. slotStart[r]+T-1, each attending to the valid
   * columns up to its own. `valid` (per token, default all 1) marks padding
   * tokens, which are computed but never attended to. A cache row may come more than once
   * (at other columns: a prompt packed token by token, T = 1), as each layer stores every
   * token's k and v before any attends. Returns the logits [rows.length, V] of each row's
   * last new token; the view is valid until the next call.
   */
  forwardRows(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number, valid?: ArrayLike<number>, io: ForwardIo = {}): Float32Array {
    const c = this.c, D = c.dim, F = c.hiddenDim, R = rows.length, N = R * T;
    const W = (c.nHeads + 2 * c.nKvHeads) * c.headDim, Q = c.nHeads * c.headDim;
    if (N > this.maxRows) throw new Error(`KvCacheDecoder: ${R} rows x ${T} tokens exceed the buffers (${this.maxRows} rows)`);
    if (tokens.length !== N || positions.length !== N || slotStart.length !== R) throw new Error("KvCacheDecoder: tokens/positions must hold rows x T entries and slotStart one per row");
    for (let r = 0; r < R; r++) {
      const b = rows[r]!;
      if (b < 0 || b >= this.batch) throw new Error(`KvCacheDecoder: row ${b} outside [0, ${this.batch})`);
      if (slotStart[r]! < 0 || slotStart[r]! + T > this.maxLen) throw new Error(`KvCacheDecoder: columns ${slotStart[r]}..${slotStart[r]! + T - 1} are past the cache length ${this.maxLen}`);
      for (let t = 0; t < T; t++) this.cache.mark(b, slotStart[r]! + t, valid ? valid[r * T + t] !== 0 : true);
    }
    const x = this.x, k = this.kernels;
    const ropes = this.ropes.map((r) => r.forCall(positions));
    // Gemma's queries scale by query_pre_attn_scalar^-0.5; the cache's attention divides by sqrt(head_dim)
    const qScale = c.gemma ? Math.sqrt(c.headDim / c.gemma.queryPreAttnScalar) : 1;
    const softcap = c.gemma?.attnSoftcap ?? null;
    if (io.inputRows) {
      if (io.inputRows.length !== N * D) throw new Error(`KvCacheDecoder: inputRows must hold ${N} x ${D} values`);
      x.set(io.inputRows);
    } else {
      for (let n = 0; n < N; n++) {
        const tkn = tokens[n]!;
        if (tkn < 0 || tkn >= c.vocabSize) throw new Error(`KvCacheDecoder: token id ${tkn} outside the vocabulary [0, ${c.vocabSize})`);
        x.set(this.w.emb.subarray(tkn * D, tkn * D + D), n * D);
      }
    }
    if (c.gemma) { const e = Math.fround(Math.sqrt(D)); for (let i = 0; i < N * D; i++) x[i] = Math.fround(x[i]! * e); }
    for (let l = 0; l < c.nLayers; l++) {
      const L = this.w.layers[l]!, window = layerWindow(c, l);
      rmsNorm(x, this.xn.view(), N, D, L.attnNorm, c.normEps);
      this.qa(this.xn, N, D);
      k.matmul(this.xn, N, L.wqkv, this.qkv);
      const qkv = this.qkv.view();
      if (L.bqkv) for (let n = 0; n < N; n++) for (let j = 0; j < W; j++) qkv[n * W + j]! += L.bqkv[j]!;
      if (L.qNorm) headNorms(qkv, N, W, c.nHeads, c.nKvHeads, c.headDim, L.qNorm, L.kNorm!, c.normEps);
      if (qScale !== 1) for (let n = 0; n < N; n++) for (let j = 0; j < c.nHeads * c.headDim; j++) qkv[n * W + j]! *= qScale;
      const rope = ropes[window !== null && ropes.length > 1 ? 1 : 0]!;
      this.ropeAndStore(l, qkv, rows, positions, slotStart, T, rope);
      this.cache.attend(l, qkv, this.att.view(), rows, slotStart, T, window, softcap);
      this.qa(this.att, N, Q);
      k.matmul(this.att, N, L.wo, this.o);
      if (L.bo) addBias(this.o.view(), L.bo, N, D);
      if (L.postAttnNorm) rmsNorm(this.o.view(), this.o.view(), N, D, L.postAttnNorm, c.normEps);
      addInto(x, this.o.view(), N * D);
      rmsNorm(x, this.xn.view(), N, D, L.ffnNorm, c.normEps);
      if (L.experts) this.experts(L.experts, N, this.routing ? { layer: this.sparseIndex[l]!, rows, slotStart, T } : undefined);
      else {
        this.qa(this.xn, N, D);
        k.matmul(this.xn, N, L.wgu!, this.gu);
        if (L.bgu) addBias(this.gu.view(), L.bgu, N, 2 * F);
        if (c.gemma) geGlu(this.gu.view(), this.h.view(), N, F);
        else this.swiGlu(N, F);
        this.qa(this.h, N, F);
        k.matmul(this.h, N, L.wd!, this.o);
        if (L.bd) addBias(this.o.view(), L.bd, N, D);
      }
      if (L.postFfnNorm) rmsNorm(this.o.view(), this.o.view(), N, D, L.postFfnNorm, c.normEps);
      addInto(x, this.o.view(), N * D);
    }
    if (io.hidden) io.hidden.set(x.subarray(0, N * D));
    // final norm of each row's last token (or of every token), then the output projection
    const pick = io.logitsOf ?? (io.allTokens || T === 1 ? null : Int32Array.from({ length: R }, (_, r) => r * T + T - 1));
    const M = pick ? pick.length : io.allTokens ? N : R, last = pick ? gatherTokens(x, pick, N, D) : x;
    if (M === 0) return new Float32Array(0);
    if (M > this.batch && (!this.allLogits || this.allLogits.view().length < M * c.vocabSize)) this.allLogits = this.kernels.alloc(M * c.vocabSize);
    const logitsBuf = M > this.batch ? this.allLogits! : this.logits;
    rmsNorm(last, this.xn.view(), M, D, this.w.finalNorm, c.normEps);
    k.matmul(this.xn, M, this.w.lmHead, logitsBuf);
    const out = logitsBuf.view().subarray(0, M * c.vocabSize);
    const cap = c.gemma?.finalSoftcap ?? null;
    if (cap !== null) for (let i = 0; i < out.length; i++) out[i] = cap * Math.tanh(out[i]! / cap);
    return out;
  }

  /**
   * Qwen3-MoE's sparse block on the normed rows in xn, into o: softmax of the router logits, each
   * token's top-k experts (weights renormalised with norm_topk_prob), then per expert (in index
   * order, as transformers adds them) its tokens gathered, its SwiGLU run, the weighted output added back.
   */
  private experts(ex: NonNullable<LayerWeights["experts"]>, N: number, rec?: { layer: number; rows: Int32Array; slotStart: Int32Array; T: number }): void {
    const c = this.c, m = c.moe!, E = m.numExperts, D = c.dim, Fm = m.intermediateSize, buf = this.moe!, k = this.kernels;
    k.matmul(this.xn, N, ex.router, buf.logits);
    const probs = buf.logits.view(), sel = new Int32Array(N * m.topK), wsel = new Float32Array(N * m.topK);
    for (let n = 0; n < N; n++) {
      const row = probs.subarray(n * E, (n + 1) * E);
      let max = -Infinity, sum = 0;
      for (let e = 0; e < E; e++) max = Math.max(max, row[e]!);
      for (let e = 0; e < E; e++) { row[e] = Math.exp(row[e]! - max); sum += row[e]!; }
      for (let e = 0; e < E; e++) row[e] = row[e]! / sum;
      let total = 0;
      for (let j = 0; j < m.topK; j++) { // the k largest, ties to the lower index
        let best = -1;
        for (let e = 0; e < E; e++) {
          if (sel.subarray(n * m.topK, n * m.topK + j).includes(e)) continue;
          if (best < 0 || row[e]! > row[best]!) best = e;
        }
        sel[n * m.topK + j] = best; wsel[n * m.topK + j] = row[best]!; total += row[best]!;
      }
      if (m.normTopkProb) for (let j = 0; j < m.topK; j++) wsel[n * m.topK + j] = wsel[n * m.topK + j]! / total;
    }
    if (rec) { // token n = r*T + t sits at cache row rows[r], column slotStart[r] + t
      const S = sparseLayerCount(this.c);
      for (let n = 0; n < N; n++) {
        const r = Math.floor(n / rec.T), col = rec.slotStart[r]! + (n % rec.T);
        this.routing!.set(sel.subarray(n * m.topK, (n + 1) * m.topK), ((rec.rows[r]! * this.maxLen + col) * S + rec.layer) * m.topK);
      }
    }
    this.o.view().fill(0, 0, N * D);
    for (let e = 0; e < E; e++) {
      let cnt = 0;
      for (let n = 0; n < N; n++) {
        for (let j = 0; j < m.topK; j++) if (sel[n * m.topK + j] === e) { buf.rows[cnt] = n; buf.weights[cnt] = wsel[n * m.topK + j]!; cnt++; }
      }
      if (cnt === 0) continue;
      const xn = this.xn.view(), xe = buf.xe.view();
      for (let r = 0; r < cnt; r++) xe.set(xn.subarray(buf.rows[r]! * D, (buf.rows[r]! + 1) * D), r * D);
      this.qa(buf.xe, cnt, D); // the router's input stays unrounded (vLLM builds the router without a quant config)
      k.matmul(buf.xe, cnt, ex.wgu[e]!, buf.gu);
      swiGlu(buf.gu.view(), buf.h.view(), cnt, Fm);
      this.qa(buf.h, cnt, Fm);
      k.matmul(buf.h, cnt, ex.wd[e]!, buf.ye);
      const ye = buf.ye.view(), o = this.o.view();
      for (let r = 0; r < cnt; r++) {
        const at = buf.rows[r]! * D, w = buf.weights[r]!;
        for (let d = 0; d < D; d++) o[at + d]! += ye[r * D + d]! * w;
      }
    }
  }

  /** h = silu(gate) * up, in the SIMD kernel when there is one. */
  /** fp8 / torchao float8 rollout: round the next quantized product's input rows per token (no-op otherwise). */
  private qa(b: HostBuffer, rows: number, cols: number): void {
    const group = activationGroup(this.quant, cols);
    if (group) quantizeActivations(b.view(), rows, cols, group);
  }

  private swiGlu(N: number, F: number): void {
    if (!this.glu) return swiGlu(this.gu.view(), this.h.view(), N, F);
    this.glu.gu.set(this.gu.view().subarray(0, 2 * N * F));
    this.glu.kernel.swiglu(this.glu.guAt, this.glu.hAt, N);
    this.h.view().set(this.glu.h.subarray(0, N * F));
  }

  /** Rotate q and k in place (HF halves convention) and write k, v into the cache. */
  private ropeAndStore(l: number, qkv: Float32Array, rows: Int32Array, positions: Int32Array, slotStart: Int32Array, T: number, rope: RopeRows): void {
    const c = this.c, hd = c.headDim, h = hd / 2, W = (c.nHeads + 2 * c.nKvHeads) * hd;
    const nRot = c.nHeads + c.nKvHeads, K = this.cache.k[l]!, V = this.cache.v[l]!, { cos, sin } = rope;
    for (let r = 0; r < rows.length; r++) {
      const b = rows[r]!;
      for (let t = 0; t < T; t++) {
        const n = r * T + t, base = n * W, tp = (rope.byToken ? n : positions[n]!) * h;
        for (let head = 0; head < nRot; head++) {
          const o = base + head * hd;
          for (let i = 0; i < h; i++) {
            const x1 = qkv[o + i]!, x2 = qkv[o + i + h]!, co = cos[tp + i]!, si = sin[tp + i]!;
            qkv[o + i] = x1 * co - x2 * si;
            qkv[o + i + h] = x2 * co + x1 * si;
          }
        }
        const slot = slotStart[r]! + t;
        for (let j = 0; j < c.nKvHeads; j++) {
          const dst = ((b * c.nKvHeads + j) * this.maxLen + slot) * hd;
          const ks = base + (c.nHeads + j) * hd, vs = base + (c.nHeads + c.nKvHeads + j) * hd;
          for (let d = 0; d < hd; d++) { K[dst + d] = qkv[ks + d]!; V[dst + d] = qkv[vs + d]!; }
        }
      }
    }
  }

  dispose(): void {
    this.kernels.dispose();
  }
}

/** cos/sin rows for one call: indexed by position, or by token when the frequencies are this call's own. */
interface RopeRows { cos: Float32Array; sin: Float32Array; byToken: boolean }

/**
 * A rotary table grown on demand, one row of cos/sin per position. Dynamic (NTK) scaling past
 * max_position_embeddings does what transformers' dynamic_rope_update does: the frequencies of
 * a forward call come from its longest position (max position + 1, over the batch), applied to
 * that call's new tokens; keys already cached keep the rotation they were stored with.
 */
class RopeTable {
  private readonly invFreq: Float32Array;
  private cos = new Float32Array(0);
  private sin = new Float32Array(0);

  constructor(private readonly hd: number, private readonly theta: number, private readonly scaling: RopeScaling | null) {
    this.invFreq = ropeInvFreq(hd, theta, scaling);
  }

  forCall(positions: Int32Array): RopeRows {
    let maxPos = 0;
    for (const p of positions) maxPos = Math.max(maxPos, p);
    const h = this.hd / 2;
    if (this.scaling?.type === "dynamic" && maxPos + 1 > this.scaling.maxPositionEmbeddings) {
      const inv = ropeInvFreq(this.hd, this.theta, this.scaling, maxPos + 1);
      const cos = new Float32Array(positions.length * h), sin = new Float32Array(positions.length * h);
      fillRope(cos, sin, positions, inv, h);
      return { cos, sin, byToken: true };
    }
    if (this.cos.length < (maxPos + 1) * h) {
      const n = Math.max(maxPos + 1, 2 * (this.cos.length / h));
      this.cos = new Float32Array(n * h);
      this.sin = new Float32Array(n * h);
      fillRope(this.cos, this.sin, Int32Array.from({ length: n }, (_, p) => p), this.invFreq, h);
    }
    return { cos: this.cos, sin: this.sin, byToken: false };
  }
}

function fillRope(cos: Float32Array, sin: Float32Array, positions: ArrayLike<number>, inv: Float32Array, h: number): void {
  for (let n = 0; n < positions.length; n++) {
    for (let i = 0; i < h; i++) {
      const a = Math.fround(positions[n]! * inv[i]!); // float32 angle, as the tfjs forward and PyTorch compute it
      cos[n * h + i] = Math.cos(a);
      sin[n * h + i] = Math.sin(a);
    }
  }
}

/** Qwen3 / Gemma 3: RMSNorm of each q head (qn) and k head (kn) over head_dim, in place in the qkv rows. */
function headNorms(qkv: Float32Array, N: number, W: number, nH: number, nKv: number, hd: number, qn: Float32Array, kn: Float32Array, eps: number): void {
  for (let n = 0; n < N; n++) {
    for (let head = 0; head < nH + nKv; head++) {
      const o = n * W + head * hd, w = head < nH ? qn : kn;
      let ss = 0;
      for (let d = 0; d < hd; d++) ss += qkv[o + d]! * qkv[o + d]!;
      const r = 1 / Math.sqrt(ss / hd + eps);
      for (let d = 0; d < hd; d++) qkv[o + d] = qkv[o + d]! * r * w[d]!;
    }
  }
}

function addBias(y: Float32Array, b: Float32Array, N: number, width: number): void {
  for (let n = 0; n < N; n++) for (let j = 0; j < width; j++) y[n * width + j]! += b[j]!;
}

/** h = gelu_tanh(gate) * up (Gemma's GeGLU), from gu rows laid out [gate (F) | up (F)]. */
function geGlu(gu: Float32Array, h: Float32Array, N: number, F: number): void {
  const beta = Math.sqrt(2 / Math.PI);
  for (let n = 0; n < N; n++) {
    const gi = n * 2 * F, ho = n * F;
    for (let j = 0; j < F; j++) {
      const g = gu[gi + j]!;
      h[ho + j] = 0.5 * g * (1 + Math.tanh(beta * (g + 0.044715 * g * g * g))) * gu[gi + F + j]!;
    }
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

/** h = silu(gate) * up, from gu rows laid out [gate (F) | up (F)]. */
function swiGlu(gu: Float32Array, h: Float32Array, N: number, F: number): void {
  for (let n = 0; n < N; n++) {
    const gi = n * 2 * F, ho = n * F;
    for (let j = 0; j < F; j++) {
      const g = gu[gi + j]!;
      h[ho + j] = (g / (1 + Math.exp(-g))) * gu[gi + F + j]!;
    }
  }
}

/** Rows `tokens` of x [N, D]. */
function gatherTokens(x: Float32Array, tokens: ArrayLike<number>, N: number, D: number): Float32Array {
  const out = new Float32Array(tokens.length * D);
  for (let i = 0; i < tokens.length; i++) {
    const n = tokens[i]!;
    if (!(Number.isInteger(n) && n >= 0 && n < N)) throw new Error(`KvCacheDecoder: logitsOf names token ${n}, outside [0, ${N})`);
    out.set(x.subarray(n * D, (n + 1) * D), i * D);
  }
  return out;
}

/** The reference engine: the tfjs forward over the whole prefix at every step. */
export class FullForwardDecoder implements StepDecoder {
  readonly vocabSize: number;
  private readonly ids: Int32Array;
  private readonly pos: Int32Array;
  private readonly mask: Int32Array;
  private out: Float32Array = new Float32Array(0);

  constructor(private readonly model: LlamaModel, readonly batch: number, readonly maxLen: number) {
    this.vocabSize = model.config.vocabSize;
    this.ids = new Int32Array(batch * maxLen);
    this.pos = new Int32Array(batch * maxLen);
    this.mask = new Int32Array(batch * maxLen);
  }

  prefill(ids: Int32Array, positions: Int32Array, mask: ArrayLike<number>, P: number): Float32Array {
    for (let b = 0; b < this.batch; b++) {
      for (let s = 0; s < P; s++) {
        this.ids[b * this.maxLen + s] = ids[b * P + s]!;
        this.pos[b * this.maxLen + s] = positions[b * P + s]!;
        this.mask[b * this.maxLen + s] = mask[b * P + s] !== 0 ? 1 : 0;
      }
    }
    return this.lastLogits(Int32Array.from({ length: this.batch }, (_, b) => b), P);
  }

  step(rows: Int32Array, tokens: Int32Array, positions: Int32Array, slot: number | Int32Array): Float32Array {
    if (typeof slot !== "number") throw new Error("FullForwardDecoder: one column for all rows only");
    rows.forEach((b, r) => {
      this.ids[b * this.maxLen + slot] = tokens[r]!;
      this.pos[b * this.maxLen + slot] = positions[r]!;
      this.mask[b * this.maxLen + slot] = 1;
    });
    return this.lastLogits(rows, slot + 1);
  }

  private lastLogits(rows: Int32Array, len: number): Float32Array {
    const R = rows.length, pick = (src: Int32Array) => {
      const a = new Int32Array(R * len);
      rows.forEach((b, r) => a.set(src.subarray(b * this.maxLen, b * this.maxLen + len), r * len));
      return a;
    };
    const logits = tf.tidy(() => {
      const opts = { attentionMask: tf.tensor2d(pick(this.mask), [R, len], "int32"), positionIds: tf.tensor2d(pick(this.pos), [R, len], "int32") };
      return this.model.forward(tf.tensor2d(pick(this.ids), [R, len], "int32"), opts).slice([0, len - 1, 0], [R, 1, -1]);
    });
    this.out = logits.dataSync() as Float32Array;
    logits.dispose();
    return this.out;
  }

  dispose(): void {}
}
