// Speculative decoding on cache slots, with the MTP layer as the draft: the engine of the agent
// loops' continuous-batching server (requests join and leave between steps, a conversation's
// cache is kept across its turns) and of single-turn speculative rollouts (speculative.ts). Each
// slot has a second cache row in a one-layer decoder over the MTP layer. The MTP row lags the
// trunk's: its column t reads (h_t, x_{t+1}), the trunk's hidden state at t and the token after
// it, so it is written only once that token is known. Per slot the drafter keeps the trunk's
// hidden states of the columns the MTP row has not read yet (the carry: one column or more after
// a step). A decode step, per request with pending token a at the trunk's next column n:
//   1. the MTP row reads its carry (the last token read being a) and drafts d1 for column n+1
//      from its distribution q1;
//   2. with k > 1 drafts (vLLM's mtp method with num_speculative_tokens k), the same MTP layer
//      runs again on its own last hidden state and d_j to draft d_{j+1}; those MTP columns are
//      stand-ins, cut back once the step's drafts are made;
//   3. the trunk forwards [a, d1 .. dk] at columns n .. n+k: p_j (at the token before d_j)
//      judges d_j in order (judgeDraft); the first rejected draft is replaced by a draw from
//      max(0, p_j - q_j) and the trunk's row is cut back after it; when all are kept a bonus
//      token is drawn from the trunk after dk.
// A request with one token left, or at the model length, decodes plainly (the trunk alone). Every
// draw is from the request's own stream, so a request's tokens depend on its seed alone.
import { hostKernels, type HostKernels } from "../engine/host_kernels.js";
import type { LlamaModel } from "../models/llama.js";
import type { Rng } from "../utils/rng.js";
import { KvCacheDecoder, type ForwardIo } from "./decoder.js";
import type { TokenSampler } from "./sampling.js";
import { drawFrom, judgeDraft, MtpInput, mtpDraftModel, type SpeculativeStats } from "./mtp_draft.js";

/** One request of a speculative decode step. */
export interface SpeculativeRow {
  slot: number;
  /** The token ids the trunk's cache row holds (its length is the next column); the step appends what it feeds. */
  cached: number[];
  /** The request's pending token (sampled, not yet fed). */
  next: number;
  sampler: TokenSampler;
  rng: Rng;
  /** Drafts this step (0: plain decoding), at most the drafter's draftTokens, the tokens the request has left less one, and the columns left less one. */
  draft: number;
  /** Takes the request's next token and its trunk log-prob; false when the request is done. */
  emit: (token: number, logProb: number) => boolean;
}

/** A prompt for prefillRows: the slot's trunk keeps its first `reuse` columns (as reusable() allows). */
export interface PrefillRow { slot: number; prompt: readonly number[]; reuse: number }

/** A row's share of a feedRows call: row i's columns c0 .. c0+n-1, the call's tokens at .. at+n-1. */
interface FeedPiece { i: number; c0: number; n: number; at: number }

/** The trunk's hidden states of columns col .. col+rows-1 that the MTP row has not read. */
interface Carry { col: number; hidden: Float32Array }

export class SpeculativeSlots {
  private readonly draft: KvCacheDecoder;
  private readonly input: MtpInput;
  private readonly carry: (Carry | null)[];
  private readonly D: number;
  private readonly p1: Float64Array;
  private readonly q: Float64Array;
  private readonly resid: Float64Array;
  /**
   * The drafting rows' draft logits of the current step (row i's j-th draft at row i * K + j), grown
   * on demand: q is recomputed from them on a rejection (bit for bit), at half a float64 q's size.
   */
  private qLogits = new Float32Array(0);

  /**
   * `trunk` is the server's decoder of `slots` rows (it must have been built with `maxRowsPerCall`
   * at least twice the slots); the MTP decoder gets the same shape. Read the weights first
   * (readParamsForDecode of the model and of mtpDraftModel(model)).
   */
  constructor(model: LlamaModel, private readonly trunk: KvCacheDecoder, slots: number, maxLen: number, private readonly maxRowsPerCall: number,
    private readonly stats: SpeculativeStats, kernels: HostKernels = hostKernels(), private readonly draftTokens = 1) {
    const c = model.config;
    if (!c.mtpLayers) throw new Error("speculative decoding: the model has no multi-token-prediction layers (num_nextn_predict_layers; MiMo has them)");
    if (!Number.isInteger(draftTokens) || draftTokens < 1) throw new Error(`SpeculativeSlots: draftTokens must be a positive integer, got ${draftTokens}`);
    if (maxRowsPerCall < (draftTokens + 1) * slots) throw new Error(`SpeculativeSlots: maxRowsPerCall ${maxRowsPerCall} is below ${draftTokens + 1} tokens per slot (${(draftTokens + 1) * slots})`);
    this.D = c.dim;
    this.draft = new KvCacheDecoder(mtpDraftModel(model), slots, maxLen, { kernels, maxRowsPerCall });
    this.input = new MtpInput(model, c);
    this.carry = new Array<Carry | null>(slots).fill(null);
    this.p1 = new Float64Array(c.vocabSize);
    this.q = new Float64Array(c.vocabSize);
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
    return this.prefillRows([{ slot, prompt, reuse }]);
  }

  /**
   * prefill() of several slots (distinct), their tokens packed into as few forwards as the
   * buffers allow (single-turn rollouts); returns the logits [rows.length, V] of each prompt's last
   * token. A row's logits, and the caches, are those prefill() gives it alone.
   */
  prefillRows(rows: readonly PrefillRow[]): Float32Array {
    const D = this.D, V = this.p1.length, logits = new Float32Array(rows.length * V);
    const spans = rows.map(({ slot, prompt, reuse }) => {
      const k = this.carry[slot], L = prompt.length;
      // the MTP row keeps the columns whose next token is unchanged and whose hidden state is at hand
      const from = k && k.col <= reuse - 1 ? k.col : reuse;
      const hidden = new Float32Array((L - from) * D);
      if (from < reuse) hidden.set(k!.hidden.subarray(0, (reuse - from) * D));
      this.trunk.truncateRow(slot, reuse);
      this.draft.truncateRow(slot, from);
      this.carry[slot] = null;
      return { slot, prompt, from, hidden };
    });
    this.feedRows(this.trunk, rows.map((r) => ({ slot: r.slot, start: r.reuse, end: r.prompt.length })), (i, col) => rows[i]!.prompt[col]!, true, (pieces, N) => {
      const h = new Float32Array(N * D);
      return {
        io: { hidden: h },
        after: (lg) => pieces.filter((p) => {
          const s = spans[p.i]!;
          s.hidden.set(h.subarray(p.at * D, (p.at + p.n) * D), (p.c0 - s.from) * D);
          return p.c0 + p.n === s.prompt.length;
        }).forEach((p, j) => logits.set(lg.subarray(j * V, (j + 1) * V), p.i * V)),
      };
    });
    // the MTP row's column t reads (h_t, prompt[t + 1])
    const next = (i: number, col: number) => spans[i]!.prompt[col + 1]!;
    this.feedRows(this.draft, spans.map((s) => ({ slot: s.slot, start: s.from, end: s.prompt.length - 1 })), next, false, (pieces, N) => {
      const inputRows = new Float32Array(N * D);
      for (const p of pieces) {
        const s = spans[p.i]!, at = (p.c0 - s.from) * D;
        inputRows.set(this.input.rows(s.hidden.subarray(at, at + p.n * D), Int32Array.from({ length: p.n }, (_, t) => next(p.i, p.c0 + t))), p.at * D);
      }
      return { io: { inputRows } };
    });
    for (const s of spans) this.carry[s.slot] = { col: s.prompt.length - 1, hidden: s.hidden.slice((s.prompt.length - 1 - s.from) * D) };
    return logits;
  }

  /**
   * Columns [start, end) of each row into `dec`, packed token by token (each token a row of the
   * call at its own column, T = 1: no padding) into calls of at most maxRowsPerCall tokens; with
   * `logits`, a call's logits are those of the rows ending in it, in order.
   */
  private feedRows(dec: KvCacheDecoder, rows: readonly { slot: number; start: number; end: number }[], tokenAt: (i: number, col: number) => number, logits: boolean,
    call: (pieces: FeedPiece[], N: number) => { io: ForwardIo; after?: (logits: Float32Array) => void }): void {
    let i = 0, col = rows[0]?.start ?? 0;
    while (i < rows.length) {
      const pieces: FeedPiece[] = [];
      let N = 0;
      while (i < rows.length && N < this.maxRowsPerCall) {
        const n = Math.min(rows[i]!.end - col, this.maxRowsPerCall - N);
        if (n > 0) { pieces.push({ i, c0: col, n, at: N }); N += n; col += n; }
        if (col >= rows[i]!.end) col = rows[++i]?.start ?? 0;
      }
      if (N === 0) return;
      const slot = new Int32Array(N), toks = new Int32Array(N), cols = new Int32Array(N), ends: number[] = [];
      for (const p of pieces) {
        for (let t = 0; t < p.n; t++) { slot[p.at + t] = rows[p.i]!.slot; toks[p.at + t] = tokenAt(p.i, p.c0 + t); cols[p.at + t] = p.c0 + t; }
        if (logits && p.c0 + p.n === rows[p.i]!.end) ends.push(p.at + p.n - 1);
      }
      const { io, after } = call(pieces, N);
      const lg = dec.forwardRows(slot, toks, cols, cols, 1, undefined, { ...io, logitsOf: ends });
      after?.(lg);
    }
  }

  /** One decode step of `rows` (distinct slots): between one and draft + 1 tokens each, emitted in order. */
  step(rows: readonly SpeculativeRow[]): void {
    const D = this.D, V = this.p1.length;
    const drafting = rows.filter((r) => r.draft > 0), plain = rows.filter((r) => r.draft === 0);
    const K = Math.max(0, ...drafting.map((r) => r.draft));
    if (K > this.draftTokens) throw new Error(`SpeculativeSlots: a row asks for ${K} drafts, more than the ${this.draftTokens} the buffers hold`);
    // per drafting row: its drafts, each one's q(d) (qd[i * K + j]) and logits, and the MTP layer's last hidden state (the next draft's stand-in for the trunk's)
    const drafts = drafting.map(() => [] as number[]), last = new Float32Array(drafting.length * D), index = new Map(drafting.map((r, i) => [r, i]));
    const qd = new Float64Array(drafting.length * K);
    if (this.qLogits.length < drafting.length * K * V) this.qLogits = new Float32Array(drafting.length * K * V);
    const draw = (i: number, logits: Float32Array, at: number, r: SpeculativeRow) => {
      const j = i * K + drafts[i]!.length, d = drawFrom(r.sampler.probabilities(logits, at, this.q), r.rng);
      this.qLogits.set(logits.subarray(at, at + V), j * V);
      qd[j] = this.q[d]!;
      drafts[i]!.push(d);
    };
    // 1. the MTP rows read their carries (grouped by length) and draft d1 for column n+1
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
      const h = new Float32Array(group.length * T * D);
      const ql = this.draft.forwardRows(Int32Array.from(group, (r) => r.slot), toks, pos, Int32Array.from(group, (r) => this.carry[r.slot]!.col), T, undefined, { inputRows: this.input.rows(hs, toks), hidden: h });
      group.forEach((r, g) => {
        const i = index.get(r)!;
        draw(i, ql, g * V, r);
        last.set(h.subarray(((g + 1) * T - 1) * D, (g + 1) * T * D), i * D);
        this.carry[r.slot] = { col: this.carry[r.slot]!.col + T, hidden: new Float32Array(0) };
      });
    }
    // 2. chained drafts (vLLM's mtp method with num_speculative_tokens > 1): the one MTP layer again, at column
    //    n+j-1 on (its own last hidden state, d_j), drafts d_{j+1}; those MTP columns are cut back afterwards
    for (let j = 1; j < K; j++) {
      const group = drafting.filter((r) => r.draft > j), n = (r: SpeculativeRow) => r.cached.length;
      if (group.length === 0) break;
      const toks = Int32Array.from(group, (r) => drafts[index.get(r)!]![j - 1]!), hs = new Float32Array(group.length * D), h = new Float32Array(group.length * D);
      group.forEach((r, g) => hs.set(last.subarray(index.get(r)! * D, (index.get(r)! + 1) * D), g * D));
      const cols = Int32Array.from(group, (r) => n(r) + j - 1);
      const ql = this.draft.forwardRows(Int32Array.from(group, (r) => r.slot), toks, cols, cols, 1, undefined, { inputRows: this.input.rows(hs, toks), hidden: h });
      group.forEach((r, g) => {
        const i = index.get(r)!;
        draw(i, ql, g * V, r);
        last.set(h.subarray(g * D, (g + 1) * D), i * D);
      });
    }
    for (const r of drafting) if (r.draft > 1) this.draft.truncateRow(r.slot, r.cached.length);
    // 3. the trunk: [a, d1 .. dk] for drafting rows (grouped by k), [a] for the others
    const byDrafts = new Map<number, SpeculativeRow[]>([[0, plain]]);
    for (const r of drafting) byDrafts.set(r.draft, [...(byDrafts.get(r.draft) ?? []), r]);
    for (const [k, group] of byDrafts) {
      if (group.length === 0) continue;
      const T = k + 1, toks = new Int32Array(group.length * T), pos = new Int32Array(group.length * T);
      group.forEach((r, g) => {
        const n = r.cached.length;
        toks[g * T] = r.next;
        for (let t = 1; t < T; t++) toks[g * T + t] = drafts[index.get(r)!]![t - 1]!;
        for (let t = 0; t < T; t++) pos[g * T + t] = n + t;
      });
      const h = new Float32Array(group.length * T * D);
      const lg = this.trunk.forwardRows(Int32Array.from(group, (r) => r.slot), toks, pos, Int32Array.from(group, (r) => r.cached.length), T, undefined, { hidden: h, allTokens: true });
      group.forEach((r, g) => (k > 0 ? this.judge(r, k, index.get(r)!, K, drafts[index.get(r)!]!, qd, lg, h, g * T) : this.judge(r, 0, -1, K, [], qd, lg, h, g * T)));
    }
  }

  /**
   * One row's verdicts: the trunk forwarded [a, d1 .. dk] at columns n .. n+k, its logits and hidden
   * states from row `at` of `lg` and `h` on. Drafts are judged in order; the first rejected one is
   * replaced and ends the step, and when all are kept the bonus is drawn after dk. Trunk columns past
   * the last token kept (or past the request's end) are cut from its row.
   */
  private judge(r: SpeculativeRow, k: number, i: number, K: number, drafts: number[], qd: Float64Array, lg: Float32Array, h: Float32Array, at: number): void {
    const D = this.D, V = this.p1.length, n = r.cached.length;
    r.cached.push(r.next);
    this.stats.drafted += k;
    let fed = 1, bonus = true; // trunk columns kept (a, then each kept draft fed)
    for (let j = 1; j <= k && bonus; j++) {
      const d = drafts[j - 1]!, row = (at + j - 1) * V, q = i * K + j - 1;
      r.sampler.probabilities(lg, row, this.p1);
      const replacement = judgeDraft(this.p1, qd[q]!, d, r.rng, this.resid, () => r.sampler.probabilities(this.qLogits, q * V, this.q));
      if (replacement !== null) { // rejected: columns from n+j (d_j on) leave the trunk's row
        this.trunk.truncateRow(r.slot, n + j);
        r.emit(replacement, r.sampler.logProb(lg, row, replacement));
        bonus = false;
      } else {
        this.stats.accepted++;
        if (r.emit(d, r.sampler.logProb(lg, row, d))) {
          r.cached.push(d);
          fed++;
        } else { // done at d_j: it stays unfed, as plain decoding leaves a last token
          this.trunk.truncateRow(r.slot, n + j);
          bonus = false;
        }
      }
    }
    this.extendCarry(r.slot, n, h.subarray(at * D, (at + fed) * D));
    if (!bonus) return;
    const { token, logProb } = r.sampler.sample(lg, (at + k) * V, r.rng);
    r.emit(token, logProb);
  }

  /** Append the trunk's hidden states of columns col, col+1, .. to the slot's carry (which must end just before col): one copy. */
  private extendCarry(slot: number, col: number, h: Float32Array): void {
    const k = this.carry[slot];
    if (!k) throw new Error(`SpeculativeSlots: slot ${slot} was not prefilled here`);
    if (k.col + k.hidden.length / this.D !== col) throw new Error(`SpeculativeSlots: slot ${slot}'s carry ends at column ${k.col + k.hidden.length / this.D}, not ${col} (internal error)`);
    const hidden = new Float32Array(k.hidden.length + h.length);
    hidden.set(k.hidden);
    hidden.set(h, k.hidden.length);
    this.carry[slot] = { col: k.col, hidden };
  }

  dispose(): void {
    this.draft.dispose();
    this.carry.fill(null);
  }
}
