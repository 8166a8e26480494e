// The table of config.json flags that change the math: each one is read into the model config,
// or refused naming the flag (never run as something else); which engines serve which family;
// dynamic RoPE decoding past max_position_embeddings.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { fromHfConfig, makeConfig, type ModelConfig } from "../../src/models/config.js";
import { llamaGraphGap } from "../../src/models/families.js";
import { writeGguf } from "../../src/models/gguf.js";
import { initModel } from "../../src/models/init.js";
import { KvCacheDecoder } from "../../src/rollout/index.js";
import { Rng } from "../../src/utils/rng.js";
import { maxDiff } from "./families_fixtures.js";

const BASE = { vocab_size: 64, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64 };
const cfg = (model_type: string, extra: Record<string, unknown> = {}) => fromHfConfig({ ...BASE, model_type, ...extra }, "m/config.json");

/** [model_type, config.json flags, what the model config must then say] */
const READ: [string, Record<string, unknown>, Partial<ModelConfig>][] = [
  ["llama", {}, { attentionBias: false, attentionOutBias: false, mlpBias: false, qkNorm: false, tieWordEmbeddings: false }],
  ["llama", { attention_bias: true }, { attentionBias: true, attentionOutBias: true }],
  ["llama", { mlp_bias: true }, { mlpBias: true }],
  ["qwen2", {}, { attentionBias: true, attentionOutBias: false, slidingLayers: undefined }],
  ["qwen2", { use_sliding_window: false, sliding_window: 4096, max_window_layers: 2 }, { slidingLayers: undefined }],
  ["qwen2", { use_sliding_window: true, sliding_window: 16, max_window_layers: 1 }, { slidingWindow: 16, slidingLayers: [false, true, true, true] }],
  ["qwen2", { use_sliding_window: true, sliding_window: 16, layer_types: ["sliding_attention", "full_attention", "full_attention", "sliding_attention"] }, { slidingLayers: [true, false, false, true] }],
  ["mimo", { num_nextn_predict_layers: 1, attention_bias: true }, { attentionBias: true, attentionOutBias: false, mtpLayers: 1 }],
  ["mimo", {}, { attentionBias: true, mtpLayers: undefined }],
  ["mistral", { sliding_window: 8 }, { slidingWindow: 8, slidingLayers: [true, true, true, true] }],
  ["mistral", { sliding_window: null }, { slidingLayers: undefined }],
  ["qwen3", { head_dim: 24 }, { qkNorm: true, headDim: 24, attentionBias: false }],
  ["qwen3", { attention_bias: true }, { attentionBias: true, attentionOutBias: true }],
  ["gemma2", { sliding_window: 8 }, { tieWordEmbeddings: true, slidingLayers: [true, false, true, false], gemma: { attnSoftcap: null, finalSoftcap: null, queryPreAttnScalar: 256 } }],
  ["gemma2", { sliding_window: 8, attn_logit_softcapping: 50, final_logit_softcapping: 30, query_pre_attn_scalar: 16 }, { gemma: { attnSoftcap: 50, finalSoftcap: 30, queryPreAttnScalar: 16 } }],
  ["gemma3_text", { sliding_window: 8, sliding_window_pattern: 2, rope_theta: 1e6, rope_local_base_freq: 1e4 }, { slidingLayers: [true, false, true, false], ropeTheta: 1e6, localRope: { theta: 1e4, scaling: null }, qkNorm: true }],
  ["gemma3_text", { sliding_window: 8, layer_types: ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters: { full_attention: { rope_type: "linear", factor: 8, rope_theta: 1e6 }, sliding_attention: { rope_type: "default", rope_theta: 1e4 } } },
  { slidingLayers: [true, true, true, false], ropeTheta: 1e6, ropeScaling: { type: "linear", factor: 8 }, localRope: { theta: 1e4, scaling: null } }],
  ["qwen3_moe", { num_experts: 8, num_experts_per_tok: 2, moe_intermediate_size: 16, decoder_sparse_step: 2, mlp_only_layers: [3], norm_topk_prob: true, router_aux_loss_coef: 0.02 },
    { moe: { numExperts: 8, topK: 2, intermediateSize: 16, normTopkProb: true, sparseLayers: [false, true, false, false], routerAuxLossCoef: 0.02, outputRouterLogits: false } }],
  ["qwen3_moe", { num_local_experts: 4, num_experts_per_tok: 1, moe_intermediate_size: 16 }, { moe: { numExperts: 4, topK: 1, intermediateSize: 16, normTopkProb: false, sparseLayers: [true, true, true, true], routerAuxLossCoef: 0.001, outputRouterLogits: false } }],
];

/** [model_type, config.json flags, the error must name] */
const REFUSED: [string, Record<string, unknown>, RegExp][] = [
  ["llama", { attention_dropout: 0.1 }, /attention_dropout=0\.1 is not supported/],
  ["llama", { hidden_act: "gelu" }, /hidden_act="gelu" is not supported for llama/],
  ["llama", { pretraining_tp: 2 }, /pretraining_tp=2 is not supported/],
  ["llama", { attn_logit_softcapping: 50 }, /attn_logit_softcapping=50 is not supported \(llama has no attention soft-capping\)/],
  ["llama", { final_logit_softcapping: 30 }, /final_logit_softcapping=30/],
  ["qwen2", { mlp_bias: true }, /mlp_bias=true is not supported/],
  ["mistral", { attention_bias: true }, /attention_bias=true is not supported/],
  ["qwen3", { query_pre_attn_scalar: 16 }, /query_pre_attn_scalar=16 is not supported/],
  ["gemma2", { hidden_activation: "gelu" }, /hidden_activation="gelu" is not supported for gemma2/],
  ["gemma3_text", { use_bidirectional_attention: true }, /use_bidirectional_attention=true is not supported/],
  ["qwen2", { layer_types: ["full_attention", "chunked_attention", "full_attention", "full_attention"], sliding_window: 8, use_sliding_window: true }, /layer_types\[1\]="chunked_attention" is not supported/],
  ["mistral", { sliding_window: null, layer_types: ["sliding_attention", "full_attention", "full_attention", "full_attention"] }, /layer_types\[0\] is sliding_attention but sliding_window is null/],
  ["qwen3", { rope_parameters: { rope_type: "yarn", factor: 4, rope_theta: 1e6 } }, /rope_type "yarn" is not supported/],
  ["qwen3", { partial_rotary_factor: 0.5 }, /partial_rotary_factor 0\.5 is not supported/],
  ["qwen3_moe", { num_experts: 4, num_experts_per_tok: 8, moe_intermediate_size: 16 }, /num_experts_per_tok must be an integer in \[1, 4\]/],
  ["qwen3_moe", { num_experts: 4, moe_intermediate_size: 16, num_experts_per_tok: 2, shared_expert_intermediate_size: 32 }, /shared_expert_intermediate_size=32 is not supported/],
  ["qwen2", { num_nextn_predict_layers: 1 }, /num_nextn_predict_layers=1 is not supported \(multi-token-prediction layers are built for MiMo only/],
  ["mimo", { num_nextn_predict_layers: 1.5 }, /num_nextn_predict_layers must be a non-negative integer/],
  ["deepseek_v3", {}, /unsupported model .*model_type deepseek_v3.*supported: llama, qwen2, mimo, mistral, qwen3, qwen3_moe, gemma2, gemma3_text/],
  ["gemma3", {}, /Gemma 3 multimodal folder: only its text model/],
];

test("config.json flags that change the math are read into the model config", () => {
  for (const [mt, flags, want] of READ) {
    const c = cfg(mt, flags) as unknown as Record<string, unknown>;
    for (const [k, v] of Object.entries(want)) assert.deepEqual(c[k], v, `${mt} ${JSON.stringify(flags)}: ${k}`);
  }
});

test("config.json flags that would change the math in a way not built are refused by name", () => {
  for (const [mt, flags, re] of REFUSED) assert.throws(() => cfg(mt, flags), (e: Error) => re.test(e.message) && e.message.startsWith("m/config.json"), `${mt} ${JSON.stringify(flags)}`);
});

test("families and flags the WebGPU decoder and the GGUF export cannot serve are named, the rest pass", async () => {
  assert.equal(llamaGraphGap(cfg("llama")), null);
  assert.equal(llamaGraphGap(cfg("qwen2")), null);
  assert.equal(llamaGraphGap(cfg("mistral", { sliding_window: null })), null);
  assert.match(llamaGraphGap(cfg("qwen3"))!, /qwen3 \(per-head q\/k RMSNorm\)/);
  assert.match(llamaGraphGap(cfg("qwen3_moe", { num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 8 }))!, /routed experts/);
  assert.match(llamaGraphGap(cfg("gemma2"))!, /gemma2/);
  assert.match(llamaGraphGap(cfg("mistral", { sliding_window: 8 }))!, /sliding_window 8/);
  assert.match(llamaGraphGap(cfg("llama", { attention_bias: true }))!, /attention_bias/);
  assert.match(llamaGraphGap(cfg("llama", { mlp_bias: true }))!, /mlp_bias/);
  const dir = mkdtempSync(join(tmpdir(), "gguf-refuse-"));
  try {
    const vocab = { model: "llama", tokens: Array.from({ length: 64 }, (_, i) => `t${i}`), scores: new Array(64).fill(0), types: new Array(64).fill(1), bosId: 0, eosId: 0 };
    await assert.rejects(writeGguf(join(dir, "m.gguf"), cfg("qwen3"), vocab as never, () => new Float32Array(0)), /gguf: llama\.cpp's llama architecture .* does not run qwen3/);
    await assert.rejects(writeGguf(join(dir, "m.gguf"), cfg("llama", { rope_scaling: { rope_type: "linear", factor: 2 } }), vocab as never, () => new Float32Array(0)), /rope scaling 'linear'/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("dynamic RoPE decodes past max_position_embeddings as transformers does: a one-call prefill past it equals the forward", async () => {
  await initBackend("wasm");
  const c = makeConfig({ vocabSize: 64, dim: 32, hiddenDim: 48, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 8, ropeScaling: { type: "dynamic", factor: 2, maxPositionEmbeddings: 8 } });
  const model = initModel(c, new Rng(5));
  try {
    const ids = Int32Array.from({ length: 13 }, (_, i) => (i * 7 + 3) % 64), T = ids.length, V = c.vocabSize;
    const full = tf.tidy(() => model.forward(tf.tensor2d(ids, [1, T], "int32")).dataSync() as Float32Array);
    const dec = new KvCacheDecoder(model, 1, T + 8);
    try {
      const last = dec.prefill(ids, Int32Array.from({ length: T }, (_, i) => i), new Int32Array(T).fill(1), T);
      assert.ok(maxDiff(last, full.subarray((T - 1) * V, T * V)) < 1e-4, `prefill past the limit: ${maxDiff(last, full.subarray((T - 1) * V, T * V))}`);
      // and it keeps going (the error it used to raise is gone); each step's new token gets its own length's base
      for (let s = 0; s < 8; s++) {
        const l = dec.step(Int32Array.of(0), Int32Array.of(s + 1), Int32Array.of(T + s), T + s);
        assert.ok(l.every(Number.isFinite));
      }
    } finally {
      dec.dispose();
    }
  } finally {
    model.dispose();
  }
});

test("a fresh model initialises each family's norms as transformers does: 1, and 0 for Gemma's (1 + w)", async () => {
  await initBackend("wasm");
  for (const [mt, want] of [["qwen3", 1], ["gemma2", 0], ["gemma3_text", 0]] as const) {
    const m = initModel(cfg(mt, mt === "qwen3" ? {} : { sliding_window: 8 }), new Rng(1));
    try {
      for (const n of ["model.norm.weight", "model.layers.0.input_layernorm.weight", ...(m.config.qkNorm ? ["model.layers.0.self_attn.q_norm.weight"] : [])]) {
        assert.ok(Array.from(m.p(n).dataSync()).every((v) => v === want), `${mt} ${n}`);
      }
    } finally {
      m.dispose();
    }
  }
});
