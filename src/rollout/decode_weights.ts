// The decoder's copy of a model's weights, laid out for its products: fused
// q/k/v and gate/up matrices, transposed for XNNPACK. Preparing them reads every
// parameter back from tfjs, which at batch 1 costs more than decoding, so the
// copy is kept per model and rebuilt only when a parameter changes (the trainer's
// optimizer assigns new tensors, so their data ids tell).
import { hostKernels, type HostKernels, type HostWeight } from "../engine/host_kernels.js";
import type { LlamaModel } from "../models/llama.js";
import { forEachMergedWeight, mergedWeightSync, weightIdentity } from "../models/merge.js";
import { quantizationKey, rolloutQuantization, rolloutWeight } from "./fp8.js";
import { vllmFusedRows } from "./torchao.js";

export interface LayerWeights {
  attnNorm: Float32Array; wqkv: HostWeight; bqkv?: Float32Array; wo: HostWeight; bo?: Float32Array;
  /** Qwen3 / Gemma 3: per-head norms of q and k */
  qNorm?: Float32Array; kNorm?: Float32Array;
  /** Gemma: the attention output's norm (post_attention_layernorm) and the feed-forward output's */
  postAttnNorm?: Float32Array; postFfnNorm?: Float32Array;
  /** the norm before the feed-forward (post_attention_layernorm, or Gemma's pre_feedforward_layernorm) */
  ffnNorm: Float32Array;
  /** dense feed-forward (absent on a sparse MoE layer) */
  wgu?: HostWeight; bgu?: Float32Array; wd?: HostWeight; bd?: Float32Array;
  /** MoE: the router [E, D] and each expert's fused gate/up and down */
  experts?: { router: HostWeight; wgu: HostWeight[]; wd: HostWeight[] };
}

export interface DecodeWeights {
  layers: LayerWeights[];
  emb: Float32Array;
  finalNorm: Float32Array;
  lmHead: HostWeight;
}

function concatRows(parts: Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

/** The identity of a model's current weights and LoRA adapters (the optimizer assigns new tensors, so their data ids change); the decoder runs on the merged W + scale B A. */
export const paramIds = (model: LlamaModel): object[] => weightIdentity(model);
export const sameIds = (a: object[], b: object[]): boolean => a.length === b.length && a.every((id, i) => id === b[i]);

// Parameters read back asynchronously, per model, valid while no parameter changed:
// a GPU backend under Node cannot read synchronously, so the worker reads them with
// `readParamsForDecode` before generating and the preparation below takes them from here.
const snapshots = new WeakMap<LlamaModel, { ids: object[]; arrays: Map<string, Float32Array> }>();

/**
 * Read every parameter of `model` asynchronously for the decoder's next weight
 * preparation (one read per parameter change; a no-op while the cached decode
 * weights are current). Call before `generate` on a backend without synchronous reads.
 */
export async function readParamsForDecode(model: LlamaModel): Promise<void> {
  const ids = paramIds(model);
  const hit = cache.get(model), snap = snapshots.get(model);
  if ((hit && sameIds(hit.ids, ids) && hit.quant === quantizationKey(model)) || (snap && sameIds(snap.ids, ids))) return;
  const arrays = new Map<string, Float32Array>();
  await forEachMergedWeight(model, async (name, t) => { arrays.set(name, Float32Array.from((await t.data()) as Float32Array)); });
  // a parameter may have changed while we awaited: keep only a consistent snapshot
  if (sameIds(paramIds(model), ids)) snapshots.set(model, { ids, arrays });
}

/** The parameter `name` from the last `readParamsForDecode` snapshot, when it is still current. */
export function snapshotParam(model: LlamaModel, name: string): Float32Array | undefined {
  const snap = snapshots.get(model);
  return snap && sameIds(snap.ids, paramIds(model)) ? snap.arrays.get(name) : undefined;
}

/** Prepare the weights with `kernels` (which then owns them). */
export function prepareDecodeWeights(model: LlamaModel, kernels: HostKernels): DecodeWeights {
  const snap = snapshots.get(model);
  const host = snap && sameIds(snap.ids, paramIds(model)) ? snap.arrays : undefined;
  // fp8 rollout: each linear weight quantized as its own HF matrix (vLLM's blocks start at each matrix, before q/k/v are fused)
  const quant = rolloutQuantization(model);
  const c = model.config, read = (n: string) => {
    const shape = model.p(n).shape;
    return rolloutWeight(n, host?.get(n) ?? mergedWeightSync(model, n), shape, quant, vllmFusedRows(n, shape, c));
  };
  const Q = c.nHeads * c.headDim, KV = c.nKvHeads * c.headDim, D = c.dim, F = c.hiddenDim;
  // Gemma's norms multiply by (1 + w): folded into the weights once, in float32 as transformers adds them
  const norm = (n: string) => (c.gemma ? read(n).map((v) => Math.fround(1 + v)) : read(n));
  const layers: LayerWeights[] = [];
  for (let i = 0; i < c.nLayers; i++) {
    const L = `model.layers.${i}.`, p = (n: string) => read(L + n);
    const gateUp = (pre: string, width: number) => kernels.weight(concatRows([p(pre + "gate_proj.weight"), p(pre + "up_proj.weight")]), 2 * width, D);
    const moe = c.moe?.sparseLayers[i] ? c.moe : undefined;
    layers.push({
      attnNorm: norm(L + "input_layernorm.weight"),
      wqkv: kernels.weight(concatRows([p("self_attn.q_proj.weight"), p("self_attn.k_proj.weight"), p("self_attn.v_proj.weight")]), Q + 2 * KV, D),
      bqkv: c.attentionBias ? concatRows([p("self_attn.q_proj.bias"), p("self_attn.k_proj.bias"), p("self_attn.v_proj.bias")]) : undefined,
      wo: kernels.weight(p("self_attn.o_proj.weight"), D, Q),
      bo: c.attentionOutBias ? p("self_attn.o_proj.bias") : undefined,
      ...(c.qkNorm ? { qNorm: norm(L + "self_attn.q_norm.weight"), kNorm: norm(L + "self_attn.k_norm.weight") } : {}),
      ...(c.gemma ? { postAttnNorm: norm(L + "post_attention_layernorm.weight"), postFfnNorm: norm(L + "post_feedforward_layernorm.weight") } : {}),
      ffnNorm: norm(L + (c.gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")),
      ...(moe ? {
        experts: {
          router: kernels.weight(p("mlp.gate.weight"), moe.numExperts, D),
          wgu: Array.from({ length: moe.numExperts }, (_, e) => gateUp(`mlp.experts.${e}.`, moe.intermediateSize)),
          wd: Array.from({ length: moe.numExperts }, (_, e) => kernels.weight(p(`mlp.experts.${e}.down_proj.weight`), D, moe.intermediateSize)),
        },
      } : {
        wgu: gateUp("mlp.", F),
        wd: kernels.weight(p("mlp.down_proj.weight"), D, F),
        ...(c.mlpBias ? { bgu: concatRows([p("mlp.gate_proj.bias"), p("mlp.up_proj.bias")]), bd: p("mlp.down_proj.bias") } : {}),
      }),
    });
  }
  const emb = read("model.embed_tokens.weight");
  return { layers, emb, finalNorm: norm("model.norm.weight"), lmHead: kernels.weight(c.tieWordEmbeddings ? emb : read("lm_head.weight"), c.vocabSize, D) };
}

interface Cached { ids: object[]; backend: string; quant: string; kernels: HostKernels; weights: DecodeWeights }
const cache = new WeakMap<LlamaModel, Cached>();

/** The model's decode weights, prepared on the current backend's kernels; reused while no parameter changed. */
export function cachedDecodeWeights(model: LlamaModel, backend: string): DecodeWeights {
  const ids = paramIds(model);
  const hit = cache.get(model), quant = quantizationKey(model);
  if (hit && hit.backend === backend && hit.quant === quant && sameIds(hit.ids, ids)) return hit.weights;
  if (hit) hit.kernels.dispose();
  else model.onDispose(() => { cache.get(model)?.kernels.dispose(); cache.delete(model); });
  const kernels = hostKernels();
  const entry = { ids, backend, quant, kernels, weights: prepareDecodeWeights(model, kernels) };
  cache.set(model, entry);
  return entry.weights;
}
