// The MTP layer as a draft model, shared by the speculative decoders (speculative_slots.ts, and
// through it speculative.ts): the layer seen as a one-layer model over the trunk's variables, its
// input rows (input_proj of the normed hidden state and token embedding), and the acceptance rule.
import type { ModelConfig } from "../models/config.js";
import { LlamaModel } from "../models/llama.js";
import { mergedWeightSync } from "../models/merge.js";
import { layerPrefix } from "../models/shapes.js";
import type { Rng } from "../utils/rng.js";
import { snapshotParam } from "./decode_weights.js";

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
 * The acceptance test of a draft `d` drawn from q, with qd = q(d), against the target `p` ([V],
 * normalised): null when d is kept (probability min(1, p(d) / q(d))), else the replacement drawn
 * from max(0, p - q) (into `resid`), q [V] coming from `q()` only then. One uniform, and a second
 * on rejection. Greedy p and q are one-hot: d is kept exactly when it is p's argmax, and the
 * replacement is that argmax.
 */
export function judgeDraft(p: Float64Array, qd: number, d: number, rng: Rng, resid: Float64Array, q: () => Float64Array): number | null {
  if (rng.random() * qd < p[d]!) return null;
  const qs = q();
  for (let i = 0; i < p.length; i++) resid[i] = Math.max(0, p[i]! - qs[i]!);
  return drawFrom(resid, rng);
}
