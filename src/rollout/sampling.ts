// Token sampling on CPU typed arrays: temperature, top-k, top-p (nucleus), or
// greedy. Logits are read once per decode step; each row is sampled here.
import type { Rng } from "../utils/rng.js";

export interface SamplingParams {
  /** 0 means greedy. */
  temperature: number;
  /** <= 0 (verl: -1) disables top-k. */
  topK: number;
  /** 1 disables top-p. */
  topP: number;
  /** false means greedy whatever the temperature (verl's do_sample). */
  doSample: boolean;
  /** Maximum new tokens per sequence (responses are padded to this length). */
  responseLength: number;
  /** Generation stops at any of these ids (the id is kept in the response). */
  eosTokenIds: number[];
  padTokenId: number;
  /** Also return rollout_log_probs [B, R]. */
  calculateLogProbs: boolean;
  /** Samples per prompt: the batch is repeated (interleaved) this many times first. */
  n?: number;
  /** Generate responseLength tokens even past EOS. */
  ignoreEos?: boolean;
}

export function defaultSamplingParams(p: Partial<SamplingParams> & Pick<SamplingParams, "responseLength">): SamplingParams {
  return { temperature: 1, topK: -1, topP: 1, doSample: true, eosTokenIds: [], padTokenId: 0, calculateLogProbs: false, n: 1, ignoreEos: false, ...p };
}

export function isGreedy(p: Pick<SamplingParams, "temperature" | "doSample">): boolean {
  return !p.doSample || p.temperature === 0;
}

export function checkSamplingParams(p: SamplingParams): void {
  if (!(p.temperature >= 0)) throw new Error(`sampling: temperature must be >= 0, got ${p.temperature}`);
  if (!(p.topP > 0 && p.topP <= 1)) throw new Error(`sampling: top_p must be in (0, 1], got ${p.topP}`);
  if (!Number.isInteger(p.topK)) throw new Error(`sampling: top_k must be an integer, got ${p.topK}`);
  if (!Number.isInteger(p.responseLength) || p.responseLength < 1) throw new Error(`sampling: response_length must be a positive integer, got ${p.responseLength}`);
  if (p.n !== undefined && (!Number.isInteger(p.n) || p.n < 1)) throw new Error(`sampling: n must be a positive integer, got ${p.n}`);
}

/**
 * Samples one token per row. The log-prob reported is that of the chosen token
 * under softmax(logits / temperature) (temperature 1 when greedy), i.e. what the
 * actor's compute_log_prob gives for the same temperature, so verl's bypass mode
 * can use it as old_log_probs; top-k/top-p only restrict which tokens can be drawn.
 */
export class TokenSampler {
  private readonly scaled: Float64Array;
  private readonly probs: Float64Array;
  private readonly order: Int32Array;
  private readonly selectScratch: Float64Array;
  private readonly greedy: boolean;
  private readonly invT: number;

  constructor(readonly vocabSize: number, private readonly p: SamplingParams) {
    checkSamplingParams(p);
    this.scaled = new Float64Array(vocabSize);
    this.probs = new Float64Array(vocabSize);
    this.order = new Int32Array(vocabSize);
    this.selectScratch = new Float64Array(vocabSize);
    this.greedy = isGreedy(p);
    this.invT = this.greedy ? 1 : 1 / p.temperature;
  }

  /** Sample from logits[offset, offset + vocabSize). Returns the token and its log-prob. */
  sample(logits: Float32Array, offset: number, rng: Rng): { token: number; logProb: number } {
    const V = this.vocabSize, z = this.scaled;
    let max = -Infinity, arg = 0;
    for (let i = 0; i < V; i++) {
      const v = logits[offset + i]! * this.invT;
      z[i] = v;
      if (v > max) { max = v; arg = i; }
    }
    let sum = 0;
    const e = this.probs;
    for (let i = 0; i < V; i++) { const x = Math.exp(z[i]! - max); e[i] = x; sum += x; }
    const logZ = max + Math.log(sum);
    if (this.greedy) return { token: arg, logProb: z[arg]! - logZ };
    const token = this.draw(e, sum, rng);
    return { token, logProb: z[token]! - logZ };
  }

  /**
   * The distribution `sample` draws from, into `out` [V]: softmax(logits / temperature) restricted by
   * top-k then top-p and renormalised (one-hot at the argmax when greedy). Speculative decoding's
   * acceptance test needs it for the target and the draft alike.
   */
  probabilities(logits: Float32Array, offset: number, out: Float64Array): Float64Array {
    const V = this.vocabSize, z = this.scaled, e = this.probs;
    let max = -Infinity, arg = 0;
    for (let i = 0; i < V; i++) {
      const v = logits[offset + i]! * this.invT;
      z[i] = v;
      if (v > max) { max = v; arg = i; }
    }
    out.fill(0, 0, V);
    if (this.greedy) { out[arg] = 1; return out; }
    let sum = 0;
    for (let i = 0; i < V; i++) { const x = Math.exp(z[i]! - max); e[i] = x; sum += x; }
    const kept = this.restricted(e, sum);
    if (!kept) { for (let i = 0; i < V; i++) out[i] = e[i]! / sum; return out; }
    let mass = 0;
    for (let j = 0; j < kept.keep; j++) mass += e[kept.cand[j]!]!;
    for (let j = 0; j < kept.keep; j++) out[kept.cand[j]!] = e[kept.cand[j]!]! / mass;
    return out;
  }

  /** log softmax(logits / temperature)[token] (temperature 1 when greedy): the log-prob `sample` reports. */
  logProb(logits: Float32Array, offset: number, token: number): number {
    const V = this.vocabSize;
    let max = -Infinity;
    for (let i = 0; i < V; i++) max = Math.max(max, logits[offset + i]! * this.invT);
    let sum = 0;
    for (let i = 0; i < V; i++) sum += Math.exp(logits[offset + i]! * this.invT - max);
    return logits[offset + token]! * this.invT - max - Math.log(sum);
  }

  /** Draw from unnormalised weights e (sum `total`), restricted by top-k then top-p. */
  private draw(e: Float64Array, total: number, rng: Rng): number {
    const V = this.vocabSize;
    const kept = this.restricted(e, total);
    if (!kept) return inverseCdf(e, V, total, rng.random());
    const { cand, keep } = kept;
    let mass = 0;
    for (let j = 0; j < keep; j++) mass += e[cand[j]!]!;
    let u = rng.random() * mass;
    for (let j = 0; j < keep; j++) {
      u -= e[cand[j]!]!;
      if (u < 0) return cand[j]!;
    }
    return cand[keep - 1]!;
  }

  /** The tokens top-k then top-p leave drawable: the first `keep` of `cand` (heaviest first); null when neither restricts. */
  private restricted(e: Float64Array, total: number): { cand: number[]; keep: number } | null {
    const V = this.vocabSize, k = this.p.topK, topP = this.p.topP, idx = this.order;
    if ((k <= 0 || k >= V) && topP >= 1) return null;
    let n = 0;
    if (k > 0 && k < V) {
      // the k largest (ties at the k-th value all kept)
      const thr = kthLargest(this.scaled, V, k, this.selectScratch);
      for (let i = 0; i < V; i++) if (this.scaled[i]! >= thr) idx[n++] = i;
    } else {
      // Only tokens that can belong to the nucleus need sorting: take the heaviest
      // (weights are relative to the maximum, 1) and widen until they hold top_p.
      for (let cut = Math.exp(-4); ; cut = cut < 1e-30 ? 0 : cut * cut) {
        let mass = 0;
        n = 0;
        for (let i = 0; i < V; i++) if (e[i]! >= cut) { idx[n++] = i; mass += e[i]!; }
        if (mass >= topP * total || cut === 0) break;
      }
    }
    const cand = Array.from(idx.subarray(0, n)).sort((a, b) => e[b]! - e[a]! || a - b);
    // top-p over the top-k renormalised distribution: the shortest prefix reaching top_p
    let candMass = 0;
    for (const i of cand) candMass += e[i]!;
    let keep = cand.length, acc = 0;
    if (topP < 1) {
      for (let j = 0; j < cand.length; j++) {
        if (acc >= topP * candMass) { keep = j; break; }
        acc += e[cand[j]!]!;
      }
    }
    return { cand, keep };
  }
}

function inverseCdf(e: Float64Array, V: number, total: number, r: number): number {
  let u = r * total, last = 0;
  for (let i = 0; i < V; i++) {
    if (e[i]! > 0) last = i;
    u -= e[i]!;
    if (u < 0) return i;
  }
  return last; // rounding left u >= 0: the last token with weight
}

/** The k-th largest of a[0:n) (quickselect on a copy). */
function kthLargest(a: Float64Array, n: number, k: number, scratch: Float64Array): number {
  const s = scratch.subarray(0, n);
  s.set(a.subarray(0, n));
  let lo = 0, hi = n - 1;
  const target = k - 1;
  while (lo < hi) {
    const pivot = s[(lo + hi) >> 1]!;
    let i = lo, j = hi;
    while (i <= j) {
      while (s[i]! > pivot) i++;
      while (s[j]! < pivot) j--;
      if (i <= j) { const t = s[i]!; s[i] = s[j]!; s[j] = t; i++; j--; }
    }
    if (target <= j) hi = j;
    else if (target >= i) lo = i;
    else break;
  }
  return s[target]!;
}
