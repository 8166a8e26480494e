// Speculative decoding with MiMo's MTP layer as the draft (model.mtp.enable_rollout; vLLM's
// speculative_config {method: mtp, num_speculative_tokens: 1}). Each step, per row:
//   1. the MTP layer reads the trunk's last hidden state and the pending token a (column n)
//      and drafts d for column n+1 from its distribution q;
//   2. the trunk forwards [a, d] in one call: p1 (at a) judges d, p2 (at d) gives a bonus;
//   3. d is kept with probability min(1, p1(d) / q(d)) (greedy: when it is p1's argmax), then the
//      bonus is drawn from p2; otherwise a replacement is drawn from max(0, p1 - q), renormalised.
// That is the standard speculative rejection sampling: every token is distributed exactly as
// plain decoding draws it (temperature, top-k and top-p applied to both p and q), and greedy
// decoding gives plain decoding's tokens. The trunk and the MTP layer each keep a KV cache; the
// MTP layer's lags the trunk's by one column (it needs the token after each position).
import { hostKernels } from "../engine/host_kernels.js";
import type { ModelConfig } from "../models/config.js";
import { LlamaModel } from "../models/llama.js";
import { mergedWeightSync } from "../models/merge.js";
import { layerPrefix } from "../models/shapes.js";
import type { DataProto } from "../protocol/data_proto.js";
import { heartbeat } from "../single_controller/heartbeat.js";
import type { Rng } from "../utils/rng.js";
import { snapshotParam } from "./decode_weights.js";
import { KvCacheDecoder } from "./decoder.js";
import { assembleRollout, promptRows } from "./generate.js";
import { TokenSampler, type SamplingParams } from "./sampling.js";

/** Draft counts of a speculative generation (the acceptance rate is accepted / drafted). */
export interface SpeculativeStats { drafted: number; accepted: number }

const draftViews = new WeakMap<LlamaModel, LlamaModel>();

/**
 * The MTP layer's decoder layer seen as a one-layer model: its own weights under model.layers.0,
 * final_layernorm as the final norm, the trunk's lm_head. It shares the trunk's variables (so it
 * sees every weight update; never dispose it), one per trunk: an engine reads its weights with
 * readParamsForDecode before generating, as it reads the trunk's.
 */
export function mtpDraftModel(model: LlamaModel): LlamaModel {
  const hit = draftViews.get(model);
  if (hit && hit.params.get("model.embed_tokens.weight") === model.p("model.embed_tokens.weight")) return hit;
  const view = mtpLayerAsModel(model);
  draftViews.set(model, view);
  return view;
}

function mtpLayerAsModel(model: LlamaModel): LlamaModel {
  const c = model.config, P = layerPrefix(c, c.nLayers);
  const config: ModelConfig = { ...c, nLayers: 1, mtpLayers: 0, slidingLayers: undefined, slidingWindow: undefined, moe: undefined };
  const params = new Map([["model.embed_tokens.weight", model.p("model.embed_tokens.weight")], ["model.norm.weight", model.p(P + "final_layernorm.weight")]]);
  if (!c.tieWordEmbeddings) params.set("lm_head.weight", model.p("lm_head.weight"));
  for (const [name, v] of model.params) {
    if (!name.startsWith(P) || /(token|hidden|final)_layernorm|input_proj/.test(name)) continue;
    params.set("model.layers.0." + name.slice(P.length), v);
  }
  return new LlamaModel(config, params);
}

/** The MTP layer's input rows: input_proj([hidden_layernorm(h); token_layernorm(embed(token))]) on the host. */
export class MtpInput {
  private readonly emb: Float32Array; private readonly hn: Float32Array; private readonly tn: Float32Array; private readonly proj: Float32Array;

  constructor(model: LlamaModel, private readonly c: ModelConfig) {
    // the engine's asynchronous read when there is one (a GPU backend has no synchronous read)
    const P = layerPrefix(c, c.nLayers), read = (n: string) => snapshotParam(model, n) ?? mergedWeightSync(model, n);
    this.emb = read("model.embed_tokens.weight");
    this.hn = read(P + "hidden_layernorm.weight");
    this.tn = read(P + "token_layernorm.weight");
    this.proj = read(P + "input_proj.weight");
  }

  /** Rows for (hidden[i], tokens[i]) pairs; hidden is [n, dim]. */
  rows(hidden: Float32Array, tokens: ArrayLike<number>): Float32Array {
    const D = this.c.dim, n = tokens.length, out = new Float32Array(n * D), joined = new Float32Array(2 * D);
    for (let i = 0; i < n; i++) {
      norm(hidden.subarray(i * D, (i + 1) * D), this.hn, joined, 0, this.c.normEps);
      const t = tokens[i]!;
      norm(this.emb.subarray(t * D, (t + 1) * D), this.tn, joined, D, this.c.normEps);
      for (let o = 0; o < D; o++) {
        let s = 0;
        for (let j = 0; j < 2 * D; j++) s += this.proj[o * 2 * D + j]! * joined[j]!;
        out[i * D + o] = s;
      }
    }
    return out;
  }
}

function norm(x: Float32Array, w: Float32Array, out: Float32Array, at: number, eps: number): void {
  let ss = 0;
  for (let d = 0; d < x.length; d++) ss += x[d]! * x[d]!;
  const r = 1 / Math.sqrt(ss / x.length + eps);
  for (let d = 0; d < x.length; d++) out[at + d] = x[d]! * r * w[d]!;
}

/** A draw from weights `w` [V] (not necessarily normalised). */
export function drawFrom(w: Float64Array, rng: Rng): number {
  let total = 0, last = 0;
  for (let i = 0; i < w.length; i++) { total += w[i]!; if (w[i]! > 0) last = i; }
  let u = rng.random() * total;
  for (let i = 0; i < w.length; i++) { u -= w[i]!; if (u < 0 && w[i]! > 0) return i; }
  return last;
}

/**
 * The acceptance test of a draft `d` drawn from `q`, against the target `p` (both [V], normalised): null
 * when d is kept (probability min(1, p(d) / q(d))), else the replacement drawn from max(0, p - q)
 * (into `resid`). One uniform, and a second on rejection. Greedy p and q are one-hot: d is kept
 * exactly when it is p's argmax, and the replacement is that argmax.
 */
export function judgeDraft(p: Float64Array, q: Float64Array, d: number, rng: Rng, resid: Float64Array): number | null {
  if (rng.random() * q[d]! < p[d]!) return null;
  for (let i = 0; i < p.length; i++) resid[i] = Math.max(0, p[i]! - q[i]!);
  return drawFrom(resid, rng);
}

/** Per row: what the next MTP call reads (hidden states and the tokens after them), from column `col`. */
interface Pending { col: number; hidden: Float32Array; tokens: number[] }

/**
 * `generate` with speculative decoding: the same output layout and distribution, fewer trunk calls
 * when drafts are accepted. The KV-cache engine; no routing record (MiMo has no experts).
 */
export function generateSpeculative(model: LlamaModel, batch: DataProto, params: SamplingParams, rng: Rng, opts: { stats?: SpeculativeStats; onStep?: (step: number, responseLength: number) => void } = {}): DataProto {
  const c = model.config;
  if (!c.mtpLayers) throw new Error("speculative decoding: the model has no multi-token-prediction layers (num_nextn_predict_layers; MiMo has them)");
  const { data, ids, mask, pos, B, P } = promptRows(batch, params, c.vocabSize);
  const R = params.responseLength, V = c.vocabSize, D = c.dim;
  const responses = new Int32Array(B * R).fill(params.padTokenId), responseMask = new Int32Array(B * R), logProbs = new Float32Array(B * R);
  const eos = new Set(params.ignoreEos ? [] : params.eosTokenIds);
  const sampler = new TokenSampler(V, params);
  const draftModel = mtpDraftModel(model), input = new MtpInput(model, c);
  const stats = opts.stats ?? { drafted: 0, accepted: 0 };
  const bytesPerRow = 2 * (c.nLayers + 1) * c.nKvHeads * c.headDim * (P + R + 1) * 4;
  const sub = Math.max(1, Math.min(B, Math.floor((512 * 2 ** 20) / bytesPerRow)));
  const p1 = new Float64Array(V), q = new Float64Array(V), resid = new Float64Array(V);
  for (let b0 = 0; b0 < B; b0 += sub) {
    // rows per call: a speculative step forwards two tokens per row
    const nb = Math.min(sub, B - b0), maxLen = P + R + 1, maxRowsPerCall = Math.max(2 * nb, Math.min(2048, 64 * nb));
    const trunk = new KvCacheDecoder(model, nb, maxLen, { maxRowsPerCall });
    const draft = new KvCacheDecoder(draftModel, nb, maxLen, { kernels: hostKernels(), maxRowsPerCall });
    try {
      const posOf = (b: number, col: number) => (col < P ? pos[(b0 + b) * P + col]! : pos[(b0 + b) * P + P - 1]! + 1 + col - P);
      // --- prompts: the trunk over every column (hidden states kept), then the MTP layer over (h_t, x_{t+1})
      let start = P - 1;
      for (let b = 0; b < nb; b++) for (let s = 0; s < start; s++) if (mask[(b0 + b) * P + s]) { start = s; break; }
      const all = Int32Array.from({ length: nb }, (_, b) => b), hidden = new Float32Array(nb * P * D);
      const chunk = Math.max(1, Math.floor(maxRowsPerCall / nb));
      let logits = new Float32Array(0);
      const columns = (from: number, T: number, f: (b: number, col: number) => number) => Int32Array.from({ length: nb * T }, (_, i) => f(Math.floor(i / T), from + (i % T)));
      for (let c0 = start; c0 < P; c0 += chunk) {
        const T = Math.min(chunk, P - c0), h = new Float32Array(nb * T * D);
        logits = trunk.forwardRows(all, columns(c0, T, (b, col) => ids[(b0 + b) * P + col]!), columns(c0, T, posOf), new Int32Array(nb).fill(c0), T,
          columns(c0, T, (b, col) => mask[(b0 + b) * P + col]!), { hidden: h }).slice();
        for (let b = 0; b < nb; b++) for (let t = 0; t < T; t++) hidden.set(h.subarray((b * T + t) * D, (b * T + t + 1) * D), (b * P + c0 + t) * D);
      }
      for (let c0 = start; c0 < P - 1; c0 += chunk) {
        const T = Math.min(chunk, P - 1 - c0), hs = new Float32Array(nb * T * D), next = columns(c0, T, (b, col) => ids[(b0 + b) * P + col + 1]!);
        for (let b = 0; b < nb; b++) hs.set(hidden.subarray((b * P + c0) * D, (b * P + c0 + T) * D), b * T * D);
        draft.forwardRows(all, next, columns(c0, T, posOf), new Int32Array(nb).fill(c0), T, columns(c0, T, (b, col) => mask[(b0 + b) * P + col]!), { inputRows: input.rows(hs, next) });
      }
      // --- the first response token, from the prompt's last logits
      const emitted = new Int32Array(nb), pending: (Pending | null)[] = new Array(nb).fill(null), nextCol = new Int32Array(nb).fill(P);
      const emit = (b: number, token: number, lp: number): boolean => { // false when the row is done
        const k = emitted[b]!++, row = (b0 + b) * R + k;
        responses[row] = token; responseMask[row] = 1; logProbs[row] = lp;
        return !eos.has(token) && k + 1 < R;
      };
      for (let b = 0; b < nb; b++) {
        const { token, logProb } = sampler.sample(logits, b * V, rng);
        if (emit(b, token, logProb)) pending[b] = { col: P - 1, hidden: hidden.slice((b * P + P - 1) * D, (b * P + P) * D), tokens: [token] };
      }
      let step = 1;
      opts.onStep?.(step, R);
      for (;;) {
        heartbeat();
        const active = Int32Array.from(pending.keys()).filter((b) => pending[b] !== null);
        if (active.length === 0) break;
        // rows with one response slot left decode plainly; the rest draft first
        const last = active.filter((b) => emitted[b] === R - 1), spec = active.filter((b) => emitted[b]! < R - 1);
        const drafts = new Int32Array(nb), qs = new Map<number, Float64Array>();
        for (const T of [1, 2]) { // MTP calls grouped by how many inputs a row has pending
          const rows = spec.filter((b) => pending[b]!.tokens.length === T);
          if (rows.length === 0) continue;
          const hs = new Float32Array(rows.length * T * D), toks: number[] = [], posn: number[] = [];
          rows.forEach((b, r) => { hs.set(pending[b]!.hidden, r * T * D); for (let t = 0; t < T; t++) { toks.push(pending[b]!.tokens[t]!); posn.push(posOf(b, pending[b]!.col + t)); } });
          const ql = draft.forwardRows(rows, Int32Array.from(toks), Int32Array.from(posn), Int32Array.from(rows, (b) => pending[b]!.col), T, undefined, { inputRows: input.rows(hs, toks) });
          rows.forEach((b, r) => {
            const qb = sampler.probabilities(ql, r * V, new Float64Array(V));
            qs.set(b, qb);
            drafts[b] = drawFrom(qb, rng);
          });
        }
        // the trunk: [a, d] for drafting rows, [a] for the last slot
        for (const T of [2, 1]) {
          const rows = T === 2 ? spec : last;
          if (rows.length === 0) continue;
          const tokens: number[] = [], posn: number[] = [];
          for (const b of rows) {
            const a = pending[b]!.tokens[pending[b]!.tokens.length - 1]!;
            tokens.push(a); posn.push(posOf(b, nextCol[b]!));
            if (T === 2) { tokens.push(drafts[b]!); posn.push(posOf(b, nextCol[b]! + 1)); }
          }
          const h = new Float32Array(rows.length * T * D);
          const lg = trunk.forwardRows(rows, Int32Array.from(tokens), Int32Array.from(posn), Int32Array.from(rows, (b) => nextCol[b]!), T, undefined, { hidden: h, allTokens: true });
          rows.forEach((b, r) => {
            const n = nextCol[b]!;
            if (T === 1) { // the last slot: plain decoding
              const { token, logProb } = sampler.sample(lg, r * V, rng);
              emit(b, token, logProb);
              pending[b] = null;
              return;
            }
            const d = drafts[b]!, qb = qs.get(b)!;
            sampler.probabilities(lg, 2 * r * V, p1);
            stats.drafted++;
            const hAt = (t: number) => h.slice((r * 2 + t) * D, (r * 2 + t + 1) * D);
            const replacement = judgeDraft(p1, qb, d, rng, resid);
            if (replacement === null) { // accepted: d, then the bonus from p2
              stats.accepted++;
              if (!emit(b, d, sampler.logProb(lg, 2 * r * V, d))) { pending[b] = null; return; }
              const { token, logProb } = sampler.sample(lg, (2 * r + 1) * V, rng);
              const hs = new Float32Array(2 * D);
              hs.set(hAt(0), 0); hs.set(hAt(1), D);
              pending[b] = emit(b, token, logProb) ? { col: n, hidden: hs, tokens: [d, token] } : null;
              nextCol[b] = n + 2;
            } else { // rejected: the replacement, from the residual max(0, p1 - q)
              const token = replacement;
              trunk.truncateRow(b, n + 1);
              pending[b] = emit(b, token, sampler.logProb(lg, 2 * r * V, token)) ? { col: n, hidden: hAt(0), tokens: [token] } : null;
              nextCol[b] = n + 1;
            }
          });
        }
        opts.onStep?.(++step, R);
      }
    } finally {
      trunk.dispose();
      draft.dispose();
    }
  }
  return assembleRollout(data, { ids, mask, pos, B, P, R, responses, responseMask, logProbs: params.calculateLogProbs ? logProbs : undefined });
}
