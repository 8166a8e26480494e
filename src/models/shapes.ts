// Every parameter a config implies, by Hugging Face name and [out, in] shape: what
// a checkpoint of that family holds (checked one to one on load) and what the
// export writes back.
import type { ModelConfig } from "./config.js";

export function parameterShapes(c: ModelConfig, opts: { lmHead?: boolean } = {}): Map<string, number[]> {
  const s = new Map<string, number[]>();
  const q = c.nHeads * c.headDim, kv = c.nKvHeads * c.headDim;
  const linear = (name: string, out: number, inp: number, bias: boolean) => {
    s.set(name + ".weight", [out, inp]);
    if (bias) s.set(name + ".bias", [out]);
  };
  const mlp = (p: string, width: number, bias: boolean) => {
    linear(p + "gate_proj", width, c.dim, bias);
    linear(p + "up_proj", width, c.dim, bias);
    linear(p + "down_proj", c.dim, width, bias);
  };
  s.set("model.embed_tokens.weight", [c.vocabSize, c.dim]);
  // MiMo's MTP layers (after the trunk's, as vLLM numbers them): their own norms and input
  // projection around one Qwen2 decoder layer; the embedding and lm_head are the trunk's.
  const mtp = c.mtpLayers ?? 0;
  for (let i = 0; i < c.nLayers + mtp; i++) {
    const p = layerPrefix(c, i);
    if (i >= c.nLayers) {
      for (const n of ["token_layernorm", "hidden_layernorm", "final_layernorm"]) s.set(`${p}${n}.weight`, [c.dim]);
      s.set(p + "input_proj.weight", [c.dim, 2 * c.dim]);
    }
    s.set(p + "input_layernorm.weight", [c.dim]);
    linear(p + "self_attn.q_proj", q, c.dim, c.attentionBias);
    linear(p + "self_attn.k_proj", kv, c.dim, c.attentionBias);
    linear(p + "self_attn.v_proj", kv, c.dim, c.attentionBias);
    linear(p + "self_attn.o_proj", c.dim, q, c.attentionOutBias ?? false);
    if (c.qkNorm) { s.set(p + "self_attn.q_norm.weight", [c.headDim]); s.set(p + "self_attn.k_norm.weight", [c.headDim]); }
    s.set(p + "post_attention_layernorm.weight", [c.dim]);
    if (c.gemma) { s.set(p + "pre_feedforward_layernorm.weight", [c.dim]); s.set(p + "post_feedforward_layernorm.weight", [c.dim]); }
    if (i < c.nLayers && c.moe?.sparseLayers[i]) {
      s.set(p + "mlp.gate.weight", [c.moe.numExperts, c.dim]);
      for (let e = 0; e < c.moe.numExperts; e++) mlp(`${p}mlp.experts.${e}.`, c.moe.intermediateSize, false);
    } else {
      mlp(p + "mlp.", c.hiddenDim, c.mlpBias ?? false);
    }
  }
  s.set("model.norm.weight", [c.dim]);
  if (!c.tieWordEmbeddings && opts.lmHead !== false) s.set("lm_head.weight", [c.vocabSize, c.dim]);
  return s;
}

/** The parameter prefix of layer `i`: a trunk layer, or from nLayers on an MTP layer (model.mtp_layers.{i - nLayers}.). */
export function layerPrefix(c: ModelConfig, i: number): string {
  return i < c.nLayers ? `model.layers.${i}.` : `model.mtp_layers.${i - c.nLayers}.`;
}
