// ContinuousBatchingServer: an AsyncRolloutServer over a LlamaModel. Requests
// from many agent loops join the running batch between decode steps (after a
// prefill into a free slot) and leave when they stop, so one decode step
// advances every live conversation at once. A finished request's cache is
// parked: a later prompt that extends it (the next turn of the same
// conversation) prefills only the new tokens. The decoding is a rollout engine's
// SlotDecoder (the host KvCacheDecoder by default, the WebGPU decoder's slot entry
// point on a GPU rank): one cache row per slot, each row at its own column. A decoder
// with forwardSample (the WebGPU one) draws each request's token on its device from the
// request's settings and seed stream, and the next step is queued (fed from the device's
// ids) before this one is read back; otherwise the logits come back and are sampled here.
// With an MTP draft (model.mtp.enable_rollout) each step drafts and verifies on the host decoder
// (rollout/speculative_slots.ts): one or two tokens per request, distributed as plain decoding's.
import { hostKernels, JsKernels } from "../engine/host_kernels.js";
import type { LlamaModel } from "../models/llama.js";
import { KvCacheDecoder, type RowSampling, type SampledRows, type SampledStep, type SlotDecoder, type SlotDecoderFactory } from "../rollout/decoder.js";
import { readParamsForDecode } from "../rollout/decode_weights.js";
import { rolloutQuantization } from "../rollout/fp8.js";
import { checkSamplingParams, TokenSampler, type SamplingParams } from "../rollout/sampling.js";
import { mtpDraftModel, type SpeculativeStats } from "../rollout/speculative.js";
import { SpeculativeSlots } from "../rollout/speculative_slots.js";
import { Rng } from "../utils/rng.js";
import { tensor, type TensorData } from "../protocol/tensor.js";
import { checkGenerationParams, RequestAbortedError, type AsyncRolloutServer, type GenerationParams, type TokenOutput } from "./server.js";

export interface ContinuousBatchingServerOptions {
  /** Most sequences decoded together (rollout.max_num_seqs); also the number of cache slots. */
  maxNumSeqs: number;
  /** Longest prompt + generation a request may reach (rollout.prompt_length + response_length). */
  maxModelLen: number;
  /** Default stop ids (the tokenizer's EOS ids). */
  eosTokenIds: number[];
  /** Sampling randomness; each request draws from its own fork. */
  rng: Rng;
  /** Prompt tokens per prefill forward call. */
  prefillChunk?: number;
  /** "js" forces the plain-JS products (tests); default picks XNNPACK on wasm. Host decoder only. */
  kernels?: "auto" | "js";
  /** The decoder of the cache slots (a rollout engine's); default: the host KvCacheDecoder. */
  decoder?: SlotDecoderFactory;
  /**
   * Decoders that sample on their device: queue the next decode step before reading this one back
   * (default true); false reads each step back first (the same tokens, for comparisons).
   */
  pipelineDeviceSteps?: boolean;
  /** MoE (rollout.enable_rollout_routing_replay): every output carries routedExperts (the decoder must record). */
  recordRouting?: boolean;
  /**
   * model.mtp.enable_rollout: decode speculatively with the model's MTP layer as the draft (host
   * decoder only); the draft counts are added here.
   */
  mtpDraft?: SpeculativeStats;
  /** Drafts per step with mtpDraft (model.mtp.num_speculative_tokens; default 1): the one MTP layer chained. */
  mtpDraftTokens?: number;
}

export interface BatchingServerStats {
  requests: number;
  decodeSteps: number;
  /** Tokens produced by decode steps (sum of batch sizes). */
  decodeTokens: number;
  prefillTokens: number;
  /** Prompt tokens whose cache was reused from an earlier turn. */
  reusedTokens: number;
  maxBatch: number;
  enginesBuilt: number;
}

interface Request {
  /** the caller's request id (cancel) */
  id: string;
  prompt: number[];
  maxTokens: number;
  stop: Set<number>;
  sampling: SamplingParams;
  /** The host sampler, made on its first use (its buffers are 4 vocabularies of float64) */
  sampler?: TokenSampler;
  rng: Rng;
  /** Device sampling: the request's stream seed, drawn from `rng` on first use (the host path never draws it) */
  deviceSeed?: number;
  logprobs: boolean;
  out: number[];
  logps: number[];
  slot: number;
  /** The last sampled token, fed at the next decode step. */
  next: number;
  /** Set by abort(): the request was rejected and its slot parked; a step in flight only keeps the cache right. */
  aborted?: boolean;
  /** Set by finish(): a queued step that still holds the request is ignored. */
  finished?: boolean;
  resolve: (o: TokenOutput) => void;
  reject: (e: Error) => void;
}

const yieldToEventLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

/** A device-sampled decode step queued and not yet read back, with its requests in row order. */
interface QueuedStep { step: SampledStep; rows: Request[] }

export class ContinuousBatchingServer implements AsyncRolloutServer {
  private engine: SlotDecoder | undefined;
  /** The MTP draft's cache slots beside the engine's (opts.mtpDraft) */
  private spec: SpeculativeSlots | undefined;
  /** The engine's routing record [slots, maxLen, S*K] when recording. */
  private routing: Int32Array | undefined;
  private readonly waiting: Request[] = [];
  private readonly active: Request[] = [];
  /** Token ids whose K/V each slot holds (its length is the slot's next cache column and position). */
  private readonly cached: number[][] = [];
  /** Slots holding a finished request's cache, least recently parked first. */
  private parked: number[] = [];
  private readonly free: number[] = [];
  private running = false;
  /** Device sampling: the decode step queued last, read back at the next decodeStep. */
  private queued: QueuedStep | undefined;
  private idleWaiters: (() => void)[] = [];
  private readonly counters: BatchingServerStats = { requests: 0, decodeSteps: 0, decodeTokens: 0, prefillTokens: 0, reusedTokens: 0, maxBatch: 0, enginesBuilt: 0 };

  constructor(private readonly model: LlamaModel, private readonly opts: ContinuousBatchingServerOptions) {
    if (!Number.isInteger(opts.maxNumSeqs) || opts.maxNumSeqs < 1) throw new Error(`ContinuousBatchingServer: maxNumSeqs must be a positive integer, got ${opts.maxNumSeqs}`);
    if (opts.prefillChunk !== undefined && (!Number.isInteger(opts.prefillChunk) || opts.prefillChunk < 1)) {
      throw new Error(`ContinuousBatchingServer: prefillChunk must be a positive integer, got ${opts.prefillChunk}`);
    }
    if (opts.maxModelLen > model.config.maxSeqLen && model.config.ropeScaling?.type !== "dynamic") {
      throw new Error(`ContinuousBatchingServer: maxModelLen ${opts.maxModelLen} exceeds the model's max_position_embeddings ${model.config.maxSeqLen}`);
    }
    if (opts.mtpDraft && opts.decoder) throw new Error("ContinuousBatchingServer: speculative decoding with the MTP draft runs on the host KV-cache decoder; this rollout engine's slot decoder cannot draft");
    if (opts.mtpDraft && !model.config.mtpLayers) throw new Error("ContinuousBatchingServer: speculative decoding needs the model's multi-token-prediction layers (num_nextn_predict_layers; MiMo has them)");
  }

  async generate(requestId: string, promptIds: readonly number[], params: GenerationParams): Promise<TokenOutput> {
    checkGenerationParams(params);
    const V = this.model.config.vocabSize, L = this.opts.maxModelLen;
    if (promptIds.length === 0) throw new Error("generate: empty prompt");
    if (promptIds.length >= L) throw new Error(`generate: prompt of ${promptIds.length} tokens leaves no room under the model length ${L}`);
    for (const id of promptIds) if (!Number.isInteger(id) || id < 0 || id >= V) throw new Error(`generate: token id ${id} outside the vocabulary [0, ${V})`);
    const maxTokens = Math.min(params.maxTokens ?? L - promptIds.length, L - promptIds.length);
    this.counters.requests++;
    // nothing is forwarded, so nothing is recorded (a loop keeps its earlier turn's routing)
    if (maxTokens === 0) return { tokenIds: [], logProbs: params.logprobs ? [] : undefined, numPreempted: 0, finishReason: "length" };
    const sampling: SamplingParams = {
      temperature: params.temperature, topK: params.topK, topP: params.topP, doSample: params.doSample ?? true,
      responseLength: maxTokens, eosTokenIds: [], padTokenId: 0, calculateLogProbs: params.logprobs ?? false,
    };
    checkSamplingParams(sampling);
    return new Promise<TokenOutput>((resolve, reject) => {
      this.waiting.push({
        id: requestId,
        prompt: [...promptIds],
        maxTokens,
        stop: new Set(params.stopTokenIds ?? this.opts.eosTokenIds),
        sampling,
        rng: params.seed !== undefined ? new Rng(params.seed) : this.opts.rng.fork(),
        logprobs: params.logprobs ?? false,
        out: [], logps: [], slot: -1, next: -1, resolve, reject,
      });
      this.kick();
    });
  }

  stats(): BatchingServerStats {
    return { ...this.counters };
  }

  /** Reject every waiting and running request; running ones park their slots (the cache stays valid). */
  abort(): void {
    const err = new RequestAbortedError();
    for (const r of this.waiting.splice(0)) { r.aborted = true; r.reject(err); }
    for (const r of this.active.splice(0)) { r.aborted = true; this.parked.push(r.slot); r.reject(err); }
  }

  /** Reject one request by id (waiting or running; a running one parks its slot, as abort() does); unknown ids are ignored. */
  cancel(requestId: string): void {
    const err = new RequestAbortedError();
    const w = this.waiting.findIndex((r) => r.id === requestId);
    if (w >= 0) {
      const [r] = this.waiting.splice(w, 1);
      r!.aborted = true;
      r!.reject(err);
    }
    const a = this.active.findIndex((r) => r.id === requestId);
    if (a >= 0) {
      const [r] = this.active.splice(a, 1);
      r!.aborted = true;
      this.parked.push(r!.slot);
      r!.reject(err);
    }
  }

  /** The host decoder copies the weights: read them asynchronously first (WebGPU has no sync read). */
  async wakeUp(): Promise<void> {
    // (the fp8 rollout quantizes on the host for every decoder, so it reads them too)
    if (!this.opts.decoder || rolloutQuantization(this.model)) await readParamsForDecode(this.model);
    if (this.opts.mtpDraft) await readParamsForDecode(mtpDraftModel(this.model));
  }

  /** Wait for every request to finish, then drop the engine and caches; the next request re-reads the weights. */
  async sleep(): Promise<void> {
    if (this.running) await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    this.spec?.dispose();
    this.spec = undefined;
    this.engine?.dispose();
    this.engine = undefined;
    this.routing = undefined;
    this.cached.length = 0;
    this.parked = [];
    this.free.length = 0;
  }

  private kick(): void {
    if (this.running) return;
    this.running = true;
    void this.loop();
  }

  private async loop(): Promise<void> {
    while (this.waiting.length > 0 || this.active.length > 0 || this.queued) {
      try {
        await this.admit();
        if (this.active.length > 0 || this.queued) await this.decodeStep();
      } catch (e) {
        this.failAll(e instanceof Error ? e : new Error(String(e)));
      }
      await yieldToEventLoop();
    }
    this.running = false;
    this.idleWaiters.splice(0).forEach((w) => w());
  }

  private ensureEngine(): SlotDecoder {
    if (!this.engine) {
      const { maxNumSeqs, maxModelLen, decoder, mtpDraft } = this.opts;
      // Own kernels, so the host decoder owns its weight copy (read now) and sleep() releases every tensor.
      const kernels = () => (this.opts.kernels === "js" ? new JsKernels() : hostKernels());
      // a speculative step forwards k + 1 tokens per request
      const k = this.opts.mtpDraftTokens ?? 1, maxRowsPerCall = mtpDraft ? Math.max(this.prefillChunk(), (k + 1) * maxNumSeqs) : this.prefillChunk();
      const host = decoder ? undefined : new KvCacheDecoder(this.model, maxNumSeqs, maxModelLen, { kernels: kernels(), maxRowsPerCall });
      this.engine = host ?? decoder!(this.model, maxNumSeqs, maxModelLen, this.prefillChunk());
      if (mtpDraft) this.spec = new SpeculativeSlots(this.model, host!, maxNumSeqs, maxModelLen, maxRowsPerCall, mtpDraft, kernels(), k);
      this.counters.enginesBuilt++;
      if (this.opts.recordRouting) {
        if (!this.engine.recordRouting) throw new Error("ContinuousBatchingServer: this rollout engine's decoder cannot record the routing (rollout.enable_rollout_routing_replay)");
        this.routing = this.engine.recordRouting();
      }
      this.free.length = 0;
      for (let s = this.opts.maxNumSeqs - 1; s >= 0; s--) this.free.push(s);
      this.cached.length = 0;
      for (let s = 0; s < this.opts.maxNumSeqs; s++) this.cached.push([]);
      this.parked = [];
    }
    return this.engine;
  }

  /** Prefill waiting requests into slots while any is free or parked. */
  private async admit(): Promise<void> {
    while (this.waiting.length > 0 && this.active.length < this.opts.maxNumSeqs) {
      const engine = this.ensureEngine();
      const req = this.waiting.shift()!;
      const picked = this.pickSlot(req.prompt), slot = picked.slot;
      // the draft may need one more column refed (its hidden state is gone), or none kept for a slot it never filled
      const reuse = this.spec ? this.spec.reusable(slot, picked.reuse) : picked.reuse;
      req.slot = slot;
      engine.truncateRow(slot, reuse);
      const cache = this.cached[slot]!;
      cache.length = reuse;
      const suffix = req.prompt.slice(reuse);
      this.counters.reusedTokens += reuse;
      this.counters.prefillTokens += suffix.length;
      this.active.push(req);
      if (this.spec) {
        const logits = this.spec.prefill(slot, req.prompt, reuse);
        cache.push(...suffix);
        this.acceptLogits(req, logits, 0);
      } else if (engine.forwardSample) {
        const s = await this.prefillSampled(engine, req, reuse, suffix);
        cache.push(...suffix);
        if (!req.aborted) this.accept(req, s.ids[0]!, s.logProbs[0]!);
      } else {
        const logits = await this.prefill(engine, slot, reuse, suffix);
        cache.push(...suffix);
        if (!req.aborted) this.acceptLogits(req, logits, 0);
      }
    }
  }

  private prefillChunk(): number {
    return this.opts.prefillChunk ?? 256;
  }

  /** Feed `tokens` to `slot` from column `start` on, in chunks; returns the last token's logits [V]. */
  private async prefill(engine: SlotDecoder, slot: number, start: number, tokens: number[]): Promise<Float32Array> {
    const rows = Int32Array.of(slot), chunk = this.prefillChunk();
    let logits: Float32Array = new Float32Array(0);
    for (let c0 = 0; c0 < tokens.length; c0 += chunk) {
      const T = Math.min(chunk, tokens.length - c0), col = start + c0;
      const pos = Int32Array.from({ length: T }, (_, i) => col + i);
      logits = await engine.forwardRows(rows, Int32Array.from(tokens.slice(c0, c0 + T)), pos, Int32Array.of(col), T);
    }
    return logits;
  }

  /** prefill on a decoder that samples on its device: no logits for the chunks before the last, the first token drawn there. */
  private async prefillSampled(engine: SlotDecoder, req: Request, start: number, tokens: number[]): Promise<SampledRows> {
    const rows = Int32Array.of(req.slot), chunk = this.prefillChunk();
    for (let c0 = 0; ; c0 += chunk) {
      const T = Math.min(chunk, tokens.length - c0), col = start + c0, last = c0 + T >= tokens.length;
      const pos = Int32Array.from({ length: T }, (_, i) => col + i);
      const s = engine.forwardSample!(rows, Int32Array.from(tokens.slice(c0, c0 + T)), pos, Int32Array.of(col), T, last ? [this.rowSampling(req)] : null);
      if (!last) continue;
      try {
        return await s!.result;
      } finally {
        s!.dispose();
      }
    }
  }

  /** The request's draw number `step` for device sampling: its settings, its stream and the index of the token. */
  private rowSampling(req: Request, step = req.out.length): RowSampling {
    const { temperature, topK, topP, doSample } = req.sampling;
    req.deviceSeed ??= Math.floor(req.rng.random() * 2 ** 32) >>> 0;
    return { temperature, topK, topP, doSample, seed: req.deviceSeed, step };
  }

  /** The parked slot sharing the longest prefix with the prompt, else a free slot, else the oldest parked one. */
  private pickSlot(prompt: number[]): { slot: number; reuse: number } {
    let best = -1, bestLen = 0;
    for (const s of this.parked) {
      const c = this.cached[s]!;
      const n = Math.min(c.length, prompt.length - 1); // keep one prompt token to compute logits from
      let j = 0;
      while (j < n && c[j] === prompt[j]) j++;
      if (j > bestLen) { best = s; bestLen = j; }
    }
    if (best >= 0) {
      this.parked = this.parked.filter((s) => s !== best);
      return { slot: best, reuse: bestLen };
    }
    const slot = this.free.pop() ?? this.parked.shift();
    if (slot === undefined) throw new Error("ContinuousBatchingServer: no slot available (internal error)");
    return { slot, reuse: 0 };
  }

  /** One token for every active request. */
  private async decodeStep(): Promise<void> {
    const engine = this.engine!;
    if (engine.forwardSample) return this.decodeStepOnDevice(engine);
    if (this.spec) return this.decodeStepSpeculative(this.spec);
    const rows = this.active.slice();
    // no padding: each row's next cache column is also its position
    const cols = Int32Array.from(rows, (r) => this.cached[r.slot]!.length);
    const logits = await engine.forwardRows(Int32Array.from(rows, (r) => r.slot), Int32Array.from(rows, (r) => r.next), cols, cols, 1);
    for (const r of rows) this.cached[r.slot]!.push(r.next);
    this.countStep(rows.length);
    rows.forEach((r, i) => { if (!r.aborted) this.acceptLogits(r, logits, i * engine.vocabSize); });
  }

  /** A speculative step (synchronous, so no abort lands inside it): one to k + 1 tokens for every active request. */
  private decodeStepSpeculative(spec: SpeculativeSlots): void {
    const rows = this.active.slice(), before = rows.reduce((n, r) => n + r.out.length, 0), L = this.opts.maxModelLen;
    spec.step(rows.map((r) => {
      const cached = this.cached[r.slot]!;
      return {
        slot: r.slot, cached, next: r.next, rng: r.rng,
        sampler: (r.sampler ??= new TokenSampler(this.model.config.vocabSize, r.sampling)),
        draft: Math.max(0, Math.min(this.opts.mtpDraftTokens ?? 1, r.maxTokens - r.out.length - 1, L - cached.length - 1)),
        emit: (token: number, logProb: number) => { this.accept(r, token, logProb); return !r.finished; },
      };
    }));
    this.countStep(rows.length, rows.reduce((n, r) => n + r.out.length, 0) - before);
  }

  private countStep(rows: number, tokens = rows): void {
    this.counters.decodeSteps++;
    this.counters.decodeTokens += tokens;
    this.counters.maxBatch = Math.max(this.counters.maxBatch, rows);
  }

  /**
   * Device sampling, pipelined: queue the next step, then read back the one queued before (rows x
   * 8 bytes) while the device runs the new one. A request in the queued step continues from the
   * id that step draws (fed on the device), unless that step is surely its last (its token limit
   * or the context); the others (just admitted, or past such a step) feed their known token. A
   * request that draws a stop id was queued one token too far: that step's row is ignored, and
   * its cache column, past the slot's recorded tokens, is written again before anything reads it.
   */
  private async decodeStepOnDevice(engine: SlotDecoder): Promise<void> {
    let prev = this.queued;
    const inPrev = new Map(prev?.rows.map((r, i) => [r, i]));
    const rows: Request[] = [], tokens: number[] = [], cols: number[] = [], sampling: RowSampling[] = [];
    for (const r of this.active) {
      const len = this.cached[r.slot]!.length, j = inPrev.get(r);
      if (j === undefined) {
        rows.push(r); tokens.push(r.next); cols.push(len); sampling.push(this.rowSampling(r));
      } else if (r.out.length + 1 < r.maxTokens && len + 1 < this.opts.maxModelLen) {
        rows.push(r); tokens.push(-1 - j); cols.push(len + 1); sampling.push(this.rowSampling(r, r.out.length + 1));
      }
    }
    // no padding: each row's next cache column is also its position
    const c = Int32Array.from(cols);
    const step = rows.length > 0 ? engine.forwardSample!(Int32Array.from(rows, (r) => r.slot), Int32Array.from(tokens), c, c, 1, sampling, prev?.step) : null;
    this.queued = step ? { step, rows } : undefined;
    if (this.opts.pipelineDeviceSteps === false) [prev, this.queued] = [this.queued, undefined];
    if (!prev) return;
    let got: SampledRows;
    try {
      got = await prev.step.result;
    } finally {
      prev.step.dispose();
    }
    this.countStep(prev.rows.length);
    prev.rows.forEach((r, i) => {
      // an aborted request's slot may already serve another: its cache record stays as abort() left it
      if (r.aborted || r.finished) return;
      this.cached[r.slot]!.push(r.next);
      this.accept(r, got.ids[i]!, got.logProbs[i]!);
    });
  }

  /** Sample the request's next token on the host from its logits row. */
  private acceptLogits(req: Request, logits: Float32Array, offset: number): void {
    req.sampler ??= new TokenSampler(this.model.config.vocabSize, req.sampling);
    const { token, logProb } = req.sampler.sample(logits, offset, req.rng);
    this.accept(req, token, logProb);
  }

  /** Take the request's next token; finish it or keep it for the next step. */
  private accept(req: Request, token: number, logProb: number): void {
    req.out.push(token);
    if (req.logprobs) req.logps.push(logProb);
    const full = this.cached[req.slot]!.length >= this.opts.maxModelLen;
    if (req.stop.has(token)) this.finish(req, "stop");
    else if (req.out.length >= req.maxTokens || full) this.finish(req, "length");
    else req.next = token;
  }

  private finish(req: Request, reason: "stop" | "length"): void {
    req.finished = true;
    this.active.splice(this.active.indexOf(req), 1);
    this.parked.push(req.slot);
    req.resolve({ tokenIds: req.out, logProbs: req.logprobs ? req.logps : undefined, numPreempted: 0, finishReason: reason, ...this.routedOf(req) });
  }

  /**
   * The recorded experts of the slot's columns (prompt, then output but its last token, which was never
   * fed): a reused prefix was recorded when an earlier request fed the same tokens with the same weights.
   */
  private routedOf(req: Request): { routedExperts?: TensorData } {
    const moe = this.model.config.moe;
    if (!this.routing || !moe) return {};
    const { maxNumSeqs, maxModelLen } = this.opts, SK = this.routing.length / (maxNumSeqs * maxModelLen), n = req.prompt.length + req.out.length;
    const out = new Int32Array(n * SK), fed = this.cached[req.slot]!.length;
    out.set(this.routing.subarray(req.slot * maxModelLen * SK, (req.slot * maxModelLen + fed) * SK));
    return { routedExperts: tensor(out, [n, SK / moe.topK, moe.topK], "int32") };
  }

  private failAll(err: Error): void {
    this.queued?.step.dispose();
    this.queued = undefined;
    for (const r of [...this.active, ...this.waiting]) r.reject(new Error(`rollout server: ${err.message}`, { cause: err }));
    this.active.length = 0;
    this.waiting.length = 0;
    this.spec?.dispose();
    this.spec = undefined;
    this.engine?.dispose();
    this.engine = undefined;
  }
}
