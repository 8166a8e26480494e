// Grouped-query attention whose gradient recomputes the attention probabilities
// instead of keeping them. Left to tfjs's autograd, every layer's [B, heads, T, T]
// scores and probabilities stay alive until the backward pass ends (at 64 x 256
// tokens: ~400 MB a layer, past the wasm heap's limit). Here only q, k and v are
// saved; the backward pass redoes one product and one softmax.
import * as tf from "@tensorflow/tfjs";
import { fusedAttentionAvailable, fusedGroupedAttention } from "../engine/fused_attention.js";
import { fusedAttentionFor, fusedCausalAttention } from "../engine/webgpu_fused_attention.js";

export interface AttentionShape {
  batch: number;
  kvHeads: number;
  /** query heads per kv head */
  group: number;
  seqLen: number;
  /** Gemma 2's attn_logit_softcapping: scores become cap * tanh(scores / cap) before the mask */
  softcap?: number | null;
}

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/**
 * softmax(q k^T + bias) v for q [B*kvHeads, T*group, d] (rows are (t, j) pairs,
 * already scaled by 1/sqrt(d)), k and v [B*kvHeads, T, d]; bias broadcasts to
 * [B, kvHeads, T, group, T] (0 where a query may look, -1e9 elsewhere).
 * `keyStart[b]`, when given, says the bias is plain causal from that column on
 * (padding only before it, or after the last real token), which the fused path needs.
 */
export function groupedAttention(q: tf.Tensor3D, k: tf.Tensor3D, v: tf.Tensor3D, bias: tf.Tensor, s: AttentionShape, keyStart?: Int32Array): tf.Tensor3D {
  const T = s.seqLen, TG = T * s.group, K = s.kvHeads, hd = q.shape[2];
  // On wasm, when every sequence sees a contiguous run of keys, the fused SIMD kernels do it all.
  const cap = s.softcap ?? null;
  if (keyStart && cap === null && fusedAttentionAvailable(hd)) return fusedGroupedAttention(q, k, v, keyStart, { ...s, headDim: hd });
  // Work on a few sequences at a time so the [rows, T*group, T] temporaries stay
  // near 32 MB whatever the batch (the wasm heap cannot shrink once grown).
  const per = Math.max(1, Math.floor(8_000_000 / (K * TG * T)));
  const chunks: [number, number][] = [];
  for (let b0 = 0; b0 < s.batch; b0 += per) chunks.push([b0, Math.min(s.batch, b0 + per)]);
  const rows = (t: tf.Tensor3D, [b0, b1]: [number, number]) => (chunks.length === 1 ? t : t.slice([b0 * K, 0, 0], [(b1 - b0) * K, -1, -1]));
  const biasRows = (b: tf.Tensor, [b0, b1]: [number, number]) => (chunks.length === 1 || b.shape[0] === 1 ? b : b.slice([b0, 0, 0, 0, 0], [b1 - b0, -1, -1, -1, -1]));
  // scores q k^T, soft-capped when the model says so (tanh kept for the backward pass)
  const scores = (qs: tf.Tensor3D, ks: tf.Tensor3D): { s: tf.Tensor; t?: tf.Tensor } => {
    const raw = tf.matMul(qs, ks, false, true);
    if (cap === null) return { s: raw };
    const t = tf.tanh(raw.div(cap));
    return { s: t.mul(cap), t };
  };
  const softmaxOf = (sc: tf.Tensor, bs: tf.Tensor) => tf.softmax(sc.reshape([-1, K, T, s.group, T]).add(bs)).reshape([-1, TG, T]) as tf.Tensor3D;
  const probs = (qs: tf.Tensor3D, ks: tf.Tensor3D, bs: tf.Tensor) => softmaxOf(scores(qs, ks).s, bs);
  const concat = (parts: tf.Tensor[]) => (parts.length === 1 ? parts[0]! : tf.concat(parts, 0));
  // the bias is an input (with a zero gradient) so that the tape keeps it alive for the backward pass
  const attend = tf.customGrad((...args: GradArgs) => {
    const [qs, ks, vs, bs, save] = args as [tf.Tensor3D, tf.Tensor3D, tf.Tensor3D, tf.Tensor, tf.GradSaveFunc];
    save([qs, ks, vs, bs]);
    return {
      value: concat(chunks.map((c) => tf.tidy(() => tf.matMul(probs(rows(qs, c), rows(ks, c), biasRows(bs, c)), rows(vs, c))))),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
        const [q0, k0, v0, b0] = saved as [tf.Tensor3D, tf.Tensor3D, tf.Tensor3D, tf.Tensor];
        const parts = chunks.map((c) => tf.tidy(() => {
          const dO = rows(dy as tf.Tensor3D, c), qc = rows(q0, c), kc = rows(k0, c);
          const sc = scores(qc, kc), p = softmaxOf(sc.s, biasRows(b0, c));
          const dV = tf.matMul(p, dO, true, false);
          const dP = tf.matMul(dO, rows(v0, c), false, true);
          let dS = p.mul(dP.sub(dP.mul(p).sum(-1, true))); // softmax backward
          if (sc.t) dS = dS.mul(tf.sub(1, tf.square(sc.t))); // through cap * tanh(s / cap)
          return [tf.matMul(dS, kc), tf.matMul(dS, qc, true, false), dV];
        }));
        const grads = [0, 1, 2].map((i) => concat(parts.map((p) => p[i]!)));
        if (parts.length > 1) tf.dispose(parts);
        return [...grads, tf.zerosLike(b0)];
      },
    };
  });
  return attend(q, k, v, bias) as tf.Tensor3D;
}

/**
 * A decoder layer's attention on token rows: qk [B*T, H+K, hd] (rotated queries, then keys) and
 * v [B*T, K, hd] give [B*T, H*hd]; q k^T is scaled by s.scale. On WebGPU with the fused kernels on
 * (and a plain causal mask from keyStart, no softcap) one kernel reads them where they are
 * (engine/webgpu_fused_attention.ts); otherwise the g query heads that share a kv head are grouped
 * (rows of q are (t, j) pairs) for groupedAttention and the output transposed back.
 */
export function tokenAttention(qk: tf.Tensor3D, v: tf.Tensor3D, bias: tf.Tensor, s: AttentionShape & { scale: number }, keyStart?: Int32Array): tf.Tensor2D {
  const { batch: B, seqLen: T, kvHeads: K, group: g } = s, H = K * g, hd = qk.shape[2];
  if (keyStart && (s.softcap ?? null) === null && fusedAttentionFor(qk, v)) return fusedCausalAttention(qk, v, keyStart, { ...s, heads: H });
  const [q0, k0] = tf.split(qk, [H, K], 1);
  const q = q0!.mul(s.scale).reshape([B, T, K, g * hd]).transpose([0, 2, 1, 3]).reshape([B * K, T * g, hd]) as tf.Tensor3D;
  const k = k0!.reshape([B, T, K, hd]).transpose([0, 2, 1, 3]).reshape([B * K, T, hd]) as tf.Tensor3D;
  const vg = v.reshape([B, T, K, hd]).transpose([0, 2, 1, 3]).reshape([B * K, T, hd]) as tf.Tensor3D;
  const o = groupedAttention(q, k, vg, bias, s, keyStart);
  return o.reshape([B, K, T, g * hd]).transpose([0, 2, 1, 3]).reshape([B * T, H * hd]) as tf.Tensor2D;
}
