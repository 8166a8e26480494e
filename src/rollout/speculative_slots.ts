// Speculative decoding on cache slots: the continuous-batching server's form of speculative.ts
// (agent loops: requests join and leave between steps, a conversation's cache is kept across its
// turns). Each slot has a second cache row in a one-layer decoder over the MTP layer. The MTP row
// lags the trunk's: its column t reads (h_t, x_{t+1}), the trunk's hidden state at t and the token
// after it, so it is written only once that token is known. Per slot the drafter keeps the
// trunk's hidden states of the columns the MTP row has not read yet (the carry: one or two
// columns after a step, three after a request's last plain step). A decode step, per request:
//   1. the MTP row reads its carry (the last token read being the request's pending token a, at
//      the trunk's next column n) and drafts d for column n+1 from its distribution q;
//   2. the trunk forwards [a, d] at columns n, n+1: p1 (at a) judges d, p2 (at d) gives a bonus;
//   3. judgeDraft keeps d (then the bonus is drawn from p2) or draws a replacement; on rejection the
//      trunk's column n+1 is dropped (its cache row is rolled back to n+1 columns).
// A request with one token left, or at the model length, decodes plainly (the trunk alone). Every
// draw is from the request's own stream, so a request's tokens depend on its seed alone.
import { hostKernels, type HostKernels } from "../engine/host_kernels.js";
import type { LlamaModel } from "../models/llama.js";
import type { Rng } from "../utils/rng.js";
import { KvCacheDecoder } from "./decoder.js";
import type { TokenSampler } from "./sampling.js";
import { drawFrom, judgeDraft, MtpInput, mtpDraftModel, type SpeculativeStats } from "./speculative.js";

/** One request of a speculative decode step. */
export interface SpeculativeRow {
  slot: number;
  /** The token ids the trunk's cache row holds (its length is the next column); the step appends what it feeds. */
  cached: number[];
  /** The request's pending token (sampled, not yet fed). */
  next: number;
  sampler: TokenSampler;
  rng: Rng;
  /** Whether the request may take two tokens this step (at least two left, room for two columns). */
  draft: boolean;
  /** Takes the request's next token and its trunk log-prob; false when the request is done. */
  emit: (token: number, logProb: number) => boolean;
}

/** The trunk's hidden states of columns col .. col+rows-1 that the MTP row has not read. */
interface Carry { col: number; hidden: Float32Array }

export class SpeculativeSlots {
  private readonly draft: KvCacheDecoder;
  private readonly input: MtpInput;
  private readonly carry: (Carry | null)[];
  private readonly D: number;
  private readonly p1: Float64Array;
  private readonly resid: Float64Array;
  /** The drafting rows' q of the current step, reused across steps */
  private readonly qs: Float64Array[] = [];

  /**
   * `trunk` is the server's decoder of `slots` rows (it must have been built with `maxRowsPerCall`
   * at least twice the slots); the MTP decoder gets the same shape. Read the weights first
   * (readParamsForDecode of the model and of mtpDraftModel(model)).
   */
  constructor(model: LlamaModel, private readonly trunk: KvCacheDecoder, slots: number, maxLen: number, private readonly maxRowsPerCall: number,
    private readonly stats: SpeculativeStats, kernels: HostKernels = hostKernels()) {
    const c = model.config;
    if (!c.mtpLayers) throw new Error("speculative decoding: the model has no multi-token-prediction layers (num_nextn_predict_layers; MiMo has them)");
    if (maxRowsPerCall < 2 * slots) throw new Error(`SpeculativeSlots: maxRowsPerCall ${maxRowsPerCall} is below two tokens per slot (${2 * slots})`);
    this.D = c.dim;
    this.draft = new KvCacheDecoder(mtpDraftModel(model), slots, maxLen, { kernels, maxRowsPerCall });
    this.input = new MtpInput(model, c);
    this.carry = new Array<Carry | null>(slots).fill(null);
    this.p1 = new Float64Array(c.vocabSize);
    this.resid = new Float64Array(c.vocabSize);
  }

  /**
   * How many of `slot`'s trunk columns a prompt sharing its first `match` tokens with them keeps:
   * `match` when the carry holds the hidden states the MTP row still needs, else one column less
   * (refed, so its hidden state comes back), and nothing for a slot never prefilled here.
   */
  reusable(slot: number, match: number): number {
    const k = this.carry[slot];
    if (!k || match === 0) return 0;
    return k.col <= match - 1 ? match : match - 1;
  }

  /**
   * Feed prompt[reuse..] to the trunk's row `slot` (its first `reuse` columns kept, as reusable()
   * allows) and catch the MTP row up to the prompt's last column; returns the logits [V] of the
   * prompt's last token (a copy).
   */
  prefill(slot: number, prompt: readonly number[], reuse: number): Float32Array {
    const D = this.D, L = prompt.length, rows = Int32Array.of(slot), chunk = this.maxRowsPerCall;
    const k = this.carry[slot];
    // the MTP row keeps the columns whose next token is unchanged and whose hidden state is at hand
    const from = k && k.col <= reuse - 1 ? k.col : reuse;
    const hidden = new Float32Array((L - from) * D);
    if (from < reuse) hidden.set(k!.hidden.subarray(0, (reuse - from) * D));
    this.trunk.truncateRow(slot, reuse);
    this.draft.truncateRow(slot, from);
    this.carry[slot] = null;
    const span = (c0: number, T: number) => Int32Array.from({ length: T }, (_, i) => c0 + i);
    let logits: Float32Array = new Float32Array(0);
    for (let c0 = reuse; c0 < L; c0 += chunk) {
      const T = Math.min(chunk, L - c0), pos = span(c0, T);
      logits = this.trunk.forwardRows(rows, Int32Array.from(prompt.slice(c0, c0 + T)), pos, Int32Array.of(c0), T, undefined, { hidden: hidden.subarray((c0 - from) * D, (c0 - from + T) * D) });
    }
    logits = logits.slice();
    for (let c0 = from; c0 < L - 1; c0 += chunk) {
      const T = Math.min(chunk, L - 1 - c0), next = Int32Array.from(prompt.slice(c0 + 1, c0 + 1 + T));
      const inputRows = this.input.rows(hidden.subarray((c0 - from) * D, (c0 - from + T) * D), next);
      this.draft.forwardRows(rows, next, span(c0, T), Int32Array.of(c0), T, undefined, { inputRows });
    }
    this.carry[slot] = { col: L - 1, hidden: hidden.slice((L - 1 - from) * D) };
    return logits;
  }

  /** One decode step of `rows` (distinct slots): one or two tokens each, emitted in order. */
  step(rows: readonly SpeculativeRow[]): void {
    const D = this.D, V = this.p1.length;
    const drafting = rows.filter((r) => r.draft), plain = rows.filter((r) => !r.draft);
    const drafts = new Int32Array(drafting.length), index = new Map(drafting.map((r, i) => [r, i]));
    // 1. the MTP rows read their carries (grouped by length) and draft
    const byLength = new Map<number, SpeculativeRow[]>();
    for (const r of drafting) {
      const T = this.carry[r.slot]!.hidden.length / D;
      byLength.set(T, [...(byLength.get(T) ?? []), r]);
    }
    for (const [T, group] of byLength) {
      const hs = new Float32Array(group.length * T * D), toks = new Int32Array(group.length * T), pos = new Int32Array(group.length * T);
      group.forEach((r, g) => {
        const k = this.carry[r.slot]!;
        hs.set(k.hidden, g * T * D);
        for (let t = 0; t < T; t++) {
          // the token after column k.col + t: cached, or the pending one after the last column
          const at = k.col + t + 1;
          toks[g * T + t] = at < r.cached.length ? r.cached[at]! : r.next;
          pos[g * T + t] = k.col + t;
        }
      });
      const ql = this.draft.forwardRows(Int32Array.from(group, (r) => r.slot), toks, pos, Int32Array.from(group, (r) => this.carry[r.slot]!.col), T, undefined, { inputRows: this.input.rows(hs, toks) });
      group.forEach((r, g) => {
        const i = index.get(r)!;
        r.sampler.probabilities(ql, g * V, (this.qs[i] ??= new Float64Array(V)));
        drafts[i] = drawFrom(this.qs[i]!, r.rng);
        const k = this.carry[r.slot]!;
        this.carry[r.slot] = { col: k.col + T, hidden: new Float32Array(0) };
      });
    }
    // 2. the trunk: [a, d] for drafting rows, [a] for the others
    for (const T of [2, 1]) {
      const group = T === 2 ? drafting : plain;
      if (group.length === 0) continue;
      const toks = new Int32Array(group.length * T), pos = new Int32Array(group.length * T);
      group.forEach((r, g) => {
        const n = r.cached.length;
        toks[g * T] = r.next; pos[g * T] = n;
        if (T === 2) { toks[g * T + 1] = drafts[g]!; pos[g * T + 1] = n + 1; }
      });
      const h = new Float32Array(group.length * T * D);
      const lg = this.trunk.forwardRows(Int32Array.from(group, (r) => r.slot), toks, pos, Int32Array.from(group, (r) => r.cached.length), T, undefined, { hidden: h, allTokens: true });
      group.forEach((r, g) => {
        const n = r.cached.length, a = r.next, hAt = (t: number) => h.subarray((g * T + t) * D, (g * T + t + 1) * D);
        r.cached.push(a);
        if (T === 1) { // plain: the carry gains column n
          this.extendCarry(r.slot, n, hAt(0));
          const { token, logProb } = r.sampler.sample(lg, g * V, r.rng);
          r.emit(token, logProb);
          return;
        }
        const d = drafts[g]!, q = this.qs[g]!;
        r.sampler.probabilities(lg, 2 * g * V, this.p1);
        this.stats.drafted++;
        const replacement = judgeDraft(this.p1, q, d, r.rng, this.resid);
        this.extendCarry(r.slot, n, hAt(0));
        if (replacement !== null) { // rejected: column n+1 (d) leaves the trunk's row
          this.trunk.truncateRow(r.slot, n + 1);
          r.emit(replacement, r.sampler.logProb(lg, 2 * g * V, replacement));
          return;
        }
        this.stats.accepted++;
        if (!r.emit(d, r.sampler.logProb(lg, 2 * g * V, d))) { // done at d: d stays unfed, as plain decoding leaves a last token
          this.trunk.truncateRow(r.slot, n + 1);
          return;
        }
        r.cached.push(d);
        this.extendCarry(r.slot, n + 1, hAt(1));
        const { token, logProb } = r.sampler.sample(lg, (2 * g + 1) * V, r.rng);
        r.emit(token, logProb);
      });
    }
  }

  /** Append the trunk's hidden state of column `col` to the slot's carry (which must end just before it). */
  private extendCarry(slot: number, col: number, h: Float32Array): void {
    const k = this.carry[slot];
    if (!k) throw new Error(`SpeculativeSlots: slot ${slot} was not prefilled here`);
    if (k.col + k.hidden.length / this.D !== col) throw new Error(`SpeculativeSlots: slot ${slot}'s carry ends at column ${k.col + k.hidden.length / this.D}, not ${col} (internal error)`);
    const hidden = new Float32Array(k.hidden.length + this.D);
    hidden.set(k.hidden);
    hidden.set(h, k.hidden.length);
    this.carry[slot] = { col: k.col, hidden };
  }

  dispose(): void {
    this.draft.dispose();
    this.carry.fill(null);
  }
}
