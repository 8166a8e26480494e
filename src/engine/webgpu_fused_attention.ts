// Fused causal grouped-query attention for training on WebGPU (issue 23), the counterpart of the
// wasm path in fused_attention.ts. The composite (models/attention.ts plus the reshapes and
// transposes of llama.ts's decoderLayer) takes ~11 dispatches forward and ~25 backward a layer;
// these kernels read q and k straight from the rotated token-major [B*T, H+K, hd] tensor and v from
// [B*T, K, hd], and write the output as [B*T, H*hd], so no transpose runs either way:
//   forward   1 dispatch  (online softmax; no [T, T] tensor is ever made)
//   backward  3 dispatches: the rows' max, sum and D = rowsum(dO * O); dV; dQ with dK (one
//             dispatch, two kinds of thread), each recomputing the probabilities from the stats.
// Query t of sequence b sees keys keyStart[b]..t (left padding, then real tokens; the contract of
// fused_attention.ts); queries before keyStart get zeros and no gradient. One thread a query row
// (or key row), summing over its keys (queries) in a fixed order: no atomics, no workgroup memory
// and no barriers (llvmpipe has lost private values live across barriers: docs/gpu.md), and the
// same inputs give the same bits. Neighbouring threads share a kv head and step through the same
// rows together (query threads over keys s0 up, key threads over queries T-1 down), so a load is
// one row for the whole warp. Float32 throughout.
import * as tf from "@tensorflow/tfjs";
import { FusedProgram, fusedLayersFor, int, registerWebGPUKernels, run, type Kernel } from "./webgpu_fused.js";

/** What the kernels need to know besides the tensors. */
export interface CausalAttentionShape {
  /** sequences (rows of the [batch, seqLen] view) */
  batch: number;
  seqLen: number;
  /** query heads */
  heads: number;
  kvHeads: number;
  /** multiplies q k^T (1/sqrt(hd), or Gemma's query_pre_attn_scalar^-1/2) */
  scale: number;
}

const WG = 64;

/** The constants a program bakes in (heads, kv heads, head size); T, row counts and the scale are uniforms. */
interface Dims { H: number; K: number; hd: number }

/**
 * The index arithmetic every kernel shares: row strides of qk [N, H+K, hd] (QKW), v [N, K, hd] (VW)
 * and the output/dO [N, H*hd] (OW); q(n, h), k(n, kh), v(n, kh) and o(n, h) give a row's first element.
 */
function layout({ H, K, hd }: Dims): string {
  const QKW = (H + K) * hd, VW = K * hd, OW = H * hd;
  return `
      fn qAt(n : i32, h : i32) -> i32 { return n * ${QKW} + h * ${hd}; }
      fn kAt(n : i32, kh : i32) -> i32 { return n * ${QKW} + ${H * hd} + kh * ${hd}; }
      fn vAt(n : i32, kh : i32) -> i32 { return n * ${VW} + kh * ${hd}; }
      fn oAt(n : i32, h : i32) -> i32 { return n * ${OW} + h * ${hd}; }`;
}

/**
 * A query row from a flat index over (b, kh, t, j) in that order, so neighbouring threads share
 * their kv head and read the same keys: n = b T + t, h = kh G + j.
 */
function queryRow(G: number, K: number, i: string): string {
  return `
        let j = ${i} % ${G};
        let t = (${i} / ${G}) % uniforms.T;
        let bk = ${i} / ${G} / uniforms.T;
        let kh = bk % ${K};
        let b = bk / ${K};
        let h = kh * ${G} + j;
        let n = b * uniforms.T + t;
        let s0 = ks[b];`;
}

/** A key row from a flat index over (b, kh, s): n = b T + s. */
function keyRow(K: number, i: string): string {
  return `
        let s = ${i} % uniforms.T;
        let bk = ${i} / uniforms.T;
        let kh = bk % ${K};
        let b = bk / ${K};
        let n = b * uniforms.T + s;
        let s0 = ks[b];`;
}

/**
 * A query row's online softmax over its keys s0..t (ascending): q loaded, x = q . k * scale, the
 * running max m and sum l; `grow` runs when m rises (c: the factor on what was summed), `each` per
 * key after p = exp(x - m). The forward pass and the backward's stats share it, so their m and l
 * are the same bits.
 */
function keyPass(hd: number, grow: string, each: string): string {
  return `
        let qr = qAt(n, h);
        var q : array<f32, ${hd}>;
        for (var d = 0; d < ${hd}; d = d + 1) { q[d] = qk[qr + d]; }
        var m = -3.0e38;
        var l = 0.0;
        for (var s = s0; s <= t; s = s + 1) {
          let kr = kAt(b * uniforms.T + s, kh);
          var x = 0.0;
          for (var d = 0; d < ${hd}; d = d + 1) { x = x + q[d] * qk[kr + d]; }
          x = x * uniforms.scale;
          if (x > m) {
            let c = exp(m - x);
            l = l * c;
            ${grow}
            m = x;
          }
          let p = exp(x - m);
          l = l + p;
          ${each}
        }`;
}

/** The softmax weight of score x (before scaling) under a row's stats at st[r * 3]: exp(x scale - max) / sum. */
const prob = (x: string, r: string) => `exp(${x} * uniforms.scale - st[${r} * 3]) / st[${r} * 3 + 1]`;

abstract class AttentionProgram extends FusedProgram {
  uniforms = "T : i32, nRows : i32, scale : f32,";
  protected readonly G: number;
  constructor(outputShape: number[], name: string, protected readonly d: Dims, rows: number) {
    super(outputShape, `verlFusedAttention${name}_${d.H}_${d.K}_${d.hd}`, WG, Math.ceil(rows / WG));
    this.G = d.H / d.K;
  }
}

/** Forward: o(n, h) = sum_s softmax(q k^T scale) v over keys s0..t, one thread a query row, online softmax. */
class AttentionForward extends AttentionProgram {
  variableNames = ["qk", "v", "ks"];
  constructor(N: number, d: Dims) { super([N, d.H * d.hd], "Fwd", d, N * d.H); }
  getUserCode(): string {
    const { K, hd } = this.d;
    return `${layout(this.d)}
      fn main(index : i32) {
        if (index >= uniforms.nRows) { return; }${queryRow(this.G, K, "index")}
        let o = oAt(n, h);
        if (t < s0) {
          for (var d = 0; d < ${hd}; d = d + 1) { result[o + d] = 0.0; }
          return;
        }
        var acc : array<f32, ${hd}>;${keyPass(hd,
          `for (var d = 0; d < ${hd}; d = d + 1) { acc[d] = acc[d] * c; }`,
          `let vr = vAt(b * uniforms.T + s, kh);
          for (var d = 0; d < ${hd}; d = d + 1) { acc[d] = acc[d] + p * v[vr + d]; }`)}
        for (var d = 0; d < ${hd}; d = d + 1) { result[o + d] = acc[d] / l; }
      }`;
  }
}

/**
 * The backward pass's row stats [N, H, 3]: the max and sum of the row's scaled scores (the
 * forward's, recomputed) and D = rowsum(dO * O). Rows before keyStart get (0, 1, 0), never read.
 */
class AttentionStats extends AttentionProgram {
  variableNames = ["qk", "ks", "o", "dy"];
  constructor(N: number, d: Dims) { super([N, d.H, 3], "Stats", d, N * d.H); }
  getUserCode(): string {
    const { H, K, hd } = this.d;
    return `${layout(this.d)}
      fn main(index : i32) {
        if (index >= uniforms.nRows) { return; }${queryRow(this.G, K, "index")}
        let r = (n * ${H} + h) * 3;
        if (t < s0) {
          result[r] = 0.0;
          result[r + 1] = 1.0;
          result[r + 2] = 0.0;
          return;
        }
${keyPass(hd, "", "")}
        let orow = oAt(n, h);
        var D = 0.0;
        for (var d = 0; d < ${hd}; d = d + 1) { D = D + dy[orow + d] * o[orow + d]; }
        result[r] = m;
        result[r + 1] = l;
        result[r + 2] = D;
      }`;
  }
}

/** dV [N, K, hd]: dv(s) = sum over the queries that see key s (t from T-1 down to s, every head of the group) of p dO. */
class AttentionGradV extends AttentionProgram {
  variableNames = ["qk", "ks", "st", "dy"];
  constructor(N: number, d: Dims) { super([N, d.K, d.hd], "GradV", d, N * d.K); }
  getUserCode(): string {
    const { H, K, hd } = this.d, G = this.G;
    return `${layout(this.d)}
      fn main(index : i32) {
        if (index >= uniforms.nRows) { return; }${keyRow(K, "index")}
        let w0 = vAt(n, kh);
        var acc : array<f32, ${hd}>;
        if (s >= s0) {
          let kr = kAt(n, kh);
          var k : array<f32, ${hd}>;
          for (var d = 0; d < ${hd}; d = d + 1) { k[d] = qk[kr + d]; }
          for (var t = uniforms.T - 1; t >= s; t = t - 1) {
            let nq = b * uniforms.T + t;
            for (var j = 0; j < ${G}; j = j + 1) {
              let h = kh * ${G} + j;
              let qr = qAt(nq, h);
              var x = 0.0;
              for (var d = 0; d < ${hd}; d = d + 1) { x = x + qk[qr + d] * k[d]; }
              let p = ${prob("x", `(nq * ${H} + h)`)};
              let g = oAt(nq, h);
              for (var d = 0; d < ${hd}; d = d + 1) { acc[d] = acc[d] + p * dy[g + d]; }
            }
          }
        }
        for (var d = 0; d < ${hd}; d = d + 1) { result[w0 + d] = acc[d]; }
      }`;
  }
}

/**
 * d(qk) [N, H+K, hd] in one dispatch: the first N*H threads are query rows, dq = scale sum_s dS k_s
 * over keys s0..t; the next N*K key rows, dk = scale sum dS q over the queries that see the key;
 * dS = p (dO . v - D).
 */
class AttentionGradQK extends AttentionProgram {
  variableNames = ["qk", "v", "ks", "st", "dy"];
  constructor(N: number, d: Dims) { super([N, d.H + d.K, d.hd], "GradQK", d, N * (d.H + d.K)); }
  getUserCode(): string {
    const { H, K, hd } = this.d, G = this.G;
    return `${layout(this.d)}
      fn gradQ(index : i32) {${queryRow(G, K, "index")}
        let w0 = qAt(n, h);
        var acc : array<f32, ${hd}>;
        if (t >= s0) {
          var q : array<f32, ${hd}>;
          var g : array<f32, ${hd}>;
          let orow = oAt(n, h);
          for (var d = 0; d < ${hd}; d = d + 1) { q[d] = qk[w0 + d]; g[d] = dy[orow + d]; }
          let r = n * ${H} + h;
          let D = st[r * 3 + 2];
          for (var s = s0; s <= t; s = s + 1) {
            let kr = kAt(b * uniforms.T + s, kh);
            let vr = vAt(b * uniforms.T + s, kh);
            var x = 0.0;
            var dp = 0.0;
            for (var d = 0; d < ${hd}; d = d + 1) { x = x + q[d] * qk[kr + d]; dp = dp + g[d] * v[vr + d]; }
            let ds = ${prob("x", "r")} * (dp - D);
            for (var d = 0; d < ${hd}; d = d + 1) { acc[d] = acc[d] + ds * qk[kr + d]; }
          }
        }
        for (var d = 0; d < ${hd}; d = d + 1) { result[w0 + d] = acc[d] * uniforms.scale; }
      }
      fn gradK(index : i32) {${keyRow(K, "index")}
        let w0 = kAt(n, kh);
        var acc : array<f32, ${hd}>;
        if (s >= s0) {
          var k : array<f32, ${hd}>;
          var vs : array<f32, ${hd}>;
          let vr = vAt(n, kh);
          for (var d = 0; d < ${hd}; d = d + 1) { k[d] = qk[w0 + d]; vs[d] = v[vr + d]; }
          for (var t = uniforms.T - 1; t >= s; t = t - 1) {
            let nq = b * uniforms.T + t;
            for (var j = 0; j < ${G}; j = j + 1) {
              let h = kh * ${G} + j;
              let qr = qAt(nq, h);
              let g = oAt(nq, h);
              let r = nq * ${H} + h;
              var x = 0.0;
              var dp = 0.0;
              for (var d = 0; d < ${hd}; d = d + 1) { x = x + qk[qr + d] * k[d]; dp = dp + dy[g + d] * vs[d]; }
              let ds = ${prob("x", "r")} * (dp - st[r * 3 + 2]);
              for (var d = 0; d < ${hd}; d = d + 1) { acc[d] = acc[d] + ds * qk[qr + d]; }
            }
          }
        }
        for (var d = 0; d < ${hd}; d = d + 1) { result[w0 + d] = acc[d] * uniforms.scale; }
      }
      fn main(index : i32) {
        let nQ = uniforms.nRows / ${H + K} * ${H};
        if (index < nQ) { gradQ(index); } else if (index < uniforms.nRows) { gradK(index - nQ); }
      }`;
  }
}

type Attrs = { T: number; scale: number; H: number; K: number };
const dimsOf = (qk: { shape: number[] }, a: Attrs): Dims => ({ H: a.H, K: a.K, hd: qk.shape[2]! });
const uniformsOf = (a: Attrs, rows: number) => [int(a.T), int(rows), { type: "float32" as const, data: [a.scale] }];

const KERNELS: Record<string, Kernel> = {
  VerlAttention: ({ inputs: { qk, v, ks }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionForward(N, d), [qk!, v!, ks!], "float32", uniformsOf(a, N * d.H));
  },
  VerlAttentionStats: ({ inputs: { qk, ks, o, dy }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionStats(N, d), [qk!, ks!, o!, dy!], "float32", uniformsOf(a, N * d.H));
  },
  VerlAttentionGradV: ({ inputs: { qk, ks, st, dy }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionGradV(N, d), [qk!, ks!, st!, dy!], "float32", uniformsOf(a, N * d.K));
  },
  VerlAttentionGradQK: ({ inputs: { qk, v, ks, st, dy }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionGradQK(N, d), [qk!, v!, ks!, st!, dy!], "float32", uniformsOf(a, N * (d.H + d.K)));
  },
};

let registered = false;

/**
 * Whether llama.ts should take the fused attention for these float32 inputs: on the webgpu backend
 * while the fused kernels are on (webgpu_fused.ts's switch: setFusedLayers; VERL_WEBGPU_FUSED=0 starts off).
 */
export function fusedAttentionFor(...xs: tf.Tensor[]): boolean {
  return fusedLayersFor(...xs);
}

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/**
 * softmax(q k^T scale) v for the rotated qk [B*T, H+K, hd] (query heads, then key heads; query head
 * h uses kv head floor(h / (H / K))) and v [B*T, K, hd], token-major; query t of sequence b sees keys
 * keyStart[b]..t, queries before keyStart[b] get zeros. Output [B*T, H*hd]; gradients for qk and v.
 */
export function fusedCausalAttention(qk: tf.Tensor3D, v: tf.Tensor3D, keyStart: Int32Array, s: CausalAttentionShape): tf.Tensor2D {
  const { batch: B, seqLen: T, heads: H, kvHeads: K } = s, N = B * T, hd = qk.shape[2];
  if (qk.shape[0] !== N || qk.shape[1] !== H + K) throw new Error(`fusedCausalAttention: qk is [${qk.shape}], expected [${N}, ${H + K}, head_dim] for ${B} x ${T} tokens, ${H} + ${K} heads`);
  if (v.shape.join() !== [N, K, hd].join()) throw new Error(`fusedCausalAttention: v is [${v.shape}], expected [${N}, ${K}, ${hd}]`);
  if (H % K !== 0) throw new Error(`fusedCausalAttention: ${H} query heads are not a multiple of ${K} kv heads`);
  if (keyStart.length !== B) throw new Error(`fusedCausalAttention: keyStart holds ${keyStart.length} values for ${B} sequences`);
  if (!registered) {
    registerWebGPUKernels(KERNELS);
    registered = true;
  }
  const attrs: Attrs = { T, scale: s.scale, H, K };
  const starts = () => tf.tensor1d(keyStart, "int32"); // uploaded, not a dispatch
  const attend = tf.customGrad((...args: GradArgs) => {
    const [q0, v0, save] = args as [tf.Tensor3D, tf.Tensor3D, tf.GradSaveFunc];
    const ks = starts();
    const out = run("VerlAttention", { qk: q0, v: v0, ks }, attrs);
    ks.dispose();
    save([q0, v0, out]);
    return {
      value: out,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
        const [qs, vs, o] = saved as [tf.Tensor, tf.Tensor, tf.Tensor];
        const ks2 = starts(), g = dy as tf.Tensor;
        const st = run("VerlAttentionStats", { qk: qs, ks: ks2, o, dy: g }, attrs);
        const dv = run("VerlAttentionGradV", { qk: qs, ks: ks2, st, dy: g }, attrs);
        const dqk = run("VerlAttentionGradQK", { qk: qs, v: vs, ks: ks2, st, dy: g }, attrs);
        tf.dispose([ks2, st]);
        return [dqk, dv];
      },
    };
  });
  return attend(qk, v) as tf.Tensor2D;
}
