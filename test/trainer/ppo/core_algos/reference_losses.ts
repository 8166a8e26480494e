// Float64 reference implementations of the policy losses, written from the formulas in
// verl-reference.md §4.2/§4.3 on plain arrays. `frozen` stands for the stop-gradient
// operand: evaluating at frozen = logp gives the loss value; differentiating in logp
// with frozen held fixed gives the gradient the tensor version must produce.
import type { Mat } from "../helpers.js";

export interface LossCase { old: Mat; logp: Mat; adv: Mat; mask: Mat; w?: Mat }
export interface RefOut { loss: number; metrics: Record<string, number> }
export interface AggOpts { dpSize?: number; batchNumTokens?: number; globalBatchSize?: number; lossScaleFactor?: number }

const clip = (x: number, lo: number, hi: number) => Math.min(Math.max(x, lo), hi);
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

export function aggRef(L: Mat, m: Mat, mode: string, o: AggOpts = {}): number {
  const dp = o.dpSize ?? 1;
  const rowTok = m.map((r) => sum(r));
  const rowSum = L.map((r, i) => sum(r.map((x, t) => (m[i]![t] ? x * m[i]![t]! : 0))));
  const nonEmpty = rowTok.filter((n) => n > 0).length;
  if (mode === "token-mean") return (sum(rowSum) / (o.batchNumTokens ?? (sum(rowTok) || 1))) * dp;
  if (mode === "seq-mean-token-sum") return (sum(rowSum.filter((_, i) => rowTok[i]! > 0)) / (o.globalBatchSize ?? (nonEmpty || 1))) * dp;
  if (mode === "seq-mean-token-mean") {
    return (sum(rowSum.map((s, i) => (rowTok[i]! > 0 ? s / (rowTok[i]! + 1e-8) : 0))) / (o.globalBatchSize ?? (nonEmpty || 1))) * dp;
  }
  if (mode === "seq-mean-token-sum-norm") return (sum(rowSum) / (o.lossScaleFactor ?? L[0]!.length)) * dp;
  throw new Error(mode);
}

function maskedMeanRef(x: Mat, m: Mat): number {
  return sum(x.flatMap((r, i) => r.map((v, t) => v * m[i]![t]!))) / (sum(m.flat()) + 1e-8);
}

const zip = (c: LossCase, f: (old: number, lp: number, a: number, i: number, t: number) => number): Mat =>
  c.logp.map((r, i) => r.map((lp, t) => f(c.old[i]![t]!, lp, c.adv[i]![t]!, i, t)));

const weighted = (L: Mat, c: LossCase): Mat => (c.w ? L.map((r, i) => r.map((x, t) => x * c.w![i]![t]!)) : L);

export function vanillaRef(c: LossCase, lo: number, hi: number, clipC: number, mode: string, o?: AggOpts): RefOut {
  const info = zip(c, (old, lp, a) => {
    const r = Math.exp(clip(lp - old, -20, 20));
    const l1 = -a * r, l2 = -a * clip(r, 1 - lo, 1 + hi), c1 = Math.max(l1, l2), l3 = -a * clipC;
    return a < 0 ? Math.min(l3, c1) : c1;
  });
  const clipped = zip(c, (old, lp, a) => { const r = Math.exp(lp - old); return -a * clip(r, 1 - lo, 1 + hi) > -a * r ? 1 : 0; });
  const lower = zip(c, (old, lp, a) => { const r = Math.exp(lp - old); return a < 0 && Math.max(-a * r, -a * clip(r, 1 - lo, 1 + hi)) > -a * clipC ? 1 : 0; });
  return {
    loss: aggRef(weighted(info, c), c.mask, mode, o),
    metrics: {
      "actor/pg_clipfrac": maskedMeanRef(clipped, c.mask),
      "actor/ppo_kl": maskedMeanRef(zip(c, (old, lp) => old - lp), c.mask),
      "actor/pg_clipfrac_lower": maskedMeanRef(lower, c.mask),
    },
  };
}

export function gspoRef(c: LossCase, lo: number, hi: number, frozen: Mat = c.logp): RefOut {
  const seq = frozen.map((r, i) => sum(r.map((lp, t) => (lp - c.old[i]![t]!) * c.mask[i]![t]!)) / Math.max(sum(c.mask[i]!), 1));
  const L = zip(c, (_old, lp, a, i, t) => {
    const s = Math.exp(Math.min(lp - frozen[i]![t]! + seq[i]!, 10));
    return Math.max(-a * s, -a * clip(s, 1 - lo, 1 + hi));
  });
  return { loss: aggRef(weighted(L, c), c.mask, "seq-mean-token-mean"), metrics: {} };
}

export function sapoRef(c: LossCase, tauPos: number, tauNeg: number): RefOut {
  const L = zip(c, (old, lp, a) => {
    const r = Math.exp(clip(lp - old, -20, 20)), tau = a > 0 ? tauPos : tauNeg;
    return -(1 / (1 + Math.exp(-tau * (r - 1)))) * (4 / tau) * a;
  });
  return { loss: aggRef(weighted(L, c), c.mask, "seq-mean-token-mean"), metrics: {} };
}

export function gpgRef(c: LossCase, mode: string): RefOut {
  return { loss: aggRef(weighted(zip(c, (_o, lp, a) => -lp * a), c), c.mask, mode), metrics: {} };
}

export function cispoRef(c: LossCase, lo: number, hi: number, mode: string, frozen: Mat = c.logp): RefOut {
  const L = zip(c, (old, lp, a, i, t) => -clip(Math.exp(clip(frozen[i]![t]! - old, -20, 20)), 1 - lo, 1 + hi) * a * lp);
  const clipped = zip(c, (old, lp) => { const r = Math.exp(lp - old); return r !== clip(r, 1 - lo, 1 + hi) ? 1 : 0; });
  return { loss: aggRef(weighted(L, c), c.mask, mode), metrics: { "actor/pg_clipfrac": maskedMeanRef(clipped, c.mask) } };
}

export function geoMeanRef(c: LossCase, lo: number, hi: number): RefOut {
  const rows = c.logp.map((r, i) => {
    const n = sum(c.mask[i]!) + 1e-8;
    const logRatio = sum(r.map((lp, t) => {
      const d = lp - c.old[i]![t]!, a = c.adv[i]![t]!, s = Math.sign(a);
      return s * Math.min(s * d, s * clip(d, -lo, hi)) * c.mask[i]![t]!;
    })) / n;
    const advSeq = sum(c.adv[i]!.map((a, t) => a * c.mask[i]![t]!)) / n;
    return -advSeq * Math.exp(logRatio);
  });
  const up = zip(c, (old, lp, a) => (lp - old !== clip(lp - old, -lo, hi) && a > 0 ? 1 : 0));
  const down = zip(c, (old, lp, a) => (lp - old !== clip(lp - old, -lo, hi) && a < 0 ? 1 : 0));
  return { loss: sum(rows) / rows.length, metrics: { "actor/pg_clipfrac": maskedMeanRef(up, c.mask), "actor/pg_clipfrac_lower": maskedMeanRef(down, c.mask) } };
}

/** Positions (row-major) of the k valid tokens with the largest covariance (A − Ā)(logp − mean logp). */
export function topCovPositions(c: LossCase, ratio: number, frozen: Mat = c.logp): Set<number> {
  const cols = c.logp[0]!.length;
  const valid: number[] = [];
  c.mask.forEach((r, i) => r.forEach((m, t) => { if (m > 0) valid.push(i * cols + t); }));
  const A = valid.map((k) => c.adv[Math.floor(k / cols)]![k % cols]!);
  const L = valid.map((k) => frozen[Math.floor(k / cols)]![k % cols]!);
  const ma = sum(A) / A.length, ml = sum(L) / L.length;
  const cov = valid.map((k, j) => ({ k, v: (A[j]! - ma) * (L[j]! - ml) })).sort((x, y) => y.v - x.v || x.k - y.k);
  const k = Math.max(1, Math.floor(valid.length * ratio));
  return new Set(cov.slice(0, k).map((e) => e.k));
}

export function klCovRef(c: LossCase, ratio: number, coef: number, mode: string, frozen: Mat = c.logp): RefOut {
  const cols = c.logp[0]!.length;
  const top = topCovPositions(c, ratio, frozen);
  const L = zip(c, (old, lp, a, i, t) => -a * Math.exp(lp - old) + (top.has(i * cols + t) ? coef * Math.abs(lp - old) : 0));
  return { loss: aggRef(weighted(L, c), c.mask, mode), metrics: { "actor/ppo_kl": maskedMeanRef(zip(c, (old, lp) => Math.abs(lp - old)), c.mask) } };
}
