// Fused causal grouped-query attention for training on WebGPU (issue 23), the counterpart of the
// wasm path in fused_attention.ts. The composite (models/attention.ts plus the reshapes and
// transposes of llama.ts's decoderLayer) takes ~11 dispatches forward and ~25 backward a layer;
// these kernels read q and k straight from the rotated token-major [B*T, H+K, hd] tensor and v from
// [B*T, K, hd], and write the output as [B*T, H*hd], so no transpose runs either way:
//   forward   1 dispatch  (online softmax; no [T, T] tensor is ever made)
//   backward  4 dispatches: the rows' max, sum and D = rowsum(dO * O); dQ and each query head's
//             share of dK and dV (one dispatch, three kinds of thread); the shares summed per kv
//             head (two small passes). Head sizes not a multiple of 4 take the scalar kernels: 3
//             dispatches (stats; dV; dQ with dK). Each recomputes the probabilities from the stats.
// Query t of sequence b sees keys keyStart[b]..t (left padding, then real tokens; the contract of
// fused_attention.ts); queries before keyStart get zeros and no gradient. One thread a query row
// (or key row, or (key row, query head) pair), summing over its keys (queries) in a fixed order: no
// atomics, no workgroup memory and no barriers (llvmpipe has lost private values live across
// barriers: docs/gpu.md), and the same inputs give the same bits. Neighbouring threads share a kv
// head and step through the same rows together (query threads over keys s0 up, key threads over
// queries T-1 down), so a load is one row for the whole warp. Float32 throughout.
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
function layout({ H, K, hd }: Dims, vec4 = false): string {
  // vec4: in units of vec4 (the register-held kernels bind their rows as array<vec4<f32>>), named qAt4 ...
  const w = vec4 ? hd / 4 : hd, at = vec4 ? "At4" : "At", QKW = (H + K) * w, VW = K * w, OW = H * w;
  return `
      fn q${at}(n : i32, h : i32) -> i32 { return n * ${QKW} + h * ${w}; }
      fn k${at}(n : i32, kh : i32) -> i32 { return n * ${QKW} + ${H * w} + kh * ${w}; }
      fn v${at}(n : i32, kh : i32) -> i32 { return n * ${VW} + kh * ${w}; }
      fn o${at}(n : i32, h : i32) -> i32 { return n * ${OW} + h * ${w}; }`;
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
  return onlineSoftmax(`var q : array<f32, ${hd}>;
        for (var d = 0; d < ${hd}; d = d + 1) { q[d] = qk[qr + d]; }`, "qAt", "kAt",
  `var x = 0.0;
          for (var d = 0; d < ${hd}; d = d + 1) { x = x + q[d] * qk[kr + d]; }
          x = x * uniforms.scale;`, grow, each);
}

/**
 * keyPass with the row held in vec4 registers (hd / 4 of them, unrolled): q . k as vec4 dot
 * products summed in order, the form AttentionGrads4 recomputes.
 */
function keyPass4(h4: number, grow: string, each: string): string {
  return onlineSoftmax(unroll(h4, (i) => `let q${i} = qk[qr + ${i}];`), "qAt4", "kAt4",
    `let x = (${unroll(h4, (i) => `dot(q${i}, qk[kr + ${i}])`, " + ")}) * uniforms.scale;`, grow, each);
}

/** The loop both share: q loaded at qr, for each key s0..t its row kr, the scaled score x, then the running max and sum. */
function onlineSoftmax(loadQ: string, qAt: string, kAt: string, score: string, grow: string, each: string): string {
  return `
        let qr = ${qAt}(n, h);
        ${loadQ}
        var m = -3.0e38;
        var l = 0.0;
        for (var s = s0; s <= t; s = s + 1) {
          let kr = ${kAt}(b * uniforms.T + s, kh);
          ${score}
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

/**
 * Forward: o(n, h) = sum_s softmax(q k^T scale) v over keys s0..t, one thread a query row, online
 * softmax. `vec4`: the row in vec4 registers (head size a multiple of 4), else scalar arrays.
 */
class AttentionForward extends AttentionProgram {
  variableNames = ["qk", "v", "ks"];
  variableComponents?: number[];
  outputComponent?: number;
  constructor(N: number, d: Dims, private readonly vec4 = false) {
    super([N, d.H * d.hd], vec4 ? "Fwd4" : "Fwd", d, N * d.H);
    if (vec4) { this.variableComponents = [4, 4, 1]; this.outputComponent = 4; }
  }
  getUserCode(): string {
    const { K, hd } = this.d, h4 = hd / 4;
    if (this.vec4) {
      return `${layout(this.d, true)}
      fn main(index : i32) {
        if (index >= uniforms.nRows) { return; }${queryRow(this.G, K, "index")}
        let o = oAt4(n, h);
        if (t < s0) {
          ${unroll(h4, (i) => `result[o + ${i}] = vec4<f32>(0.0);`)}
          return;
        }
        ${unroll(h4, (i) => `var a${i} = vec4<f32>(0.0);`)}${keyPass4(h4,
          unroll(h4, (i) => `a${i} = a${i} * c;`, "\n            "),
          `let vr = vAt4(b * uniforms.T + s, kh);
          ${unroll(h4, (i) => `a${i} = a${i} + p * v[vr + ${i}];`)}`)}
        ${unroll(h4, (i) => `result[o + ${i}] = a${i} / l;`)}
      }`;
    }
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
  variableComponents?: number[];
  /**
   * vec4: the max and sum from keyPass4 (the forward's Fwd4 bits) and D formed as AttentionGrads4
   * forms dO . v (vec4 dot products summed in order), so that where o is v itself (a query seeing
   * one key) dO . v - D is exactly 0, as the composite's gradient is.
   */
  constructor(N: number, d: Dims, private readonly vec4 = false) {
    super([N, d.H, 3], vec4 ? "Stats4" : "Stats", d, N * d.H);
    if (vec4) this.variableComponents = [4, 1, 4, 4];
  }
  getUserCode(): string {
    const { H, K, hd } = this.d, h4 = hd / 4;
    const pass = this.vec4 ? keyPass4(h4, "", "") : keyPass(hd, "", "");
    const D = this.vec4
      ? `let orow = oAt4(n, h);
        let D = ${unroll(h4, (i) => `dot(dy[orow + ${i}], o[orow + ${i}])`, " + ")};`
      : `let orow = oAt(n, h);
        var D = 0.0;
        for (var d = 0; d < ${hd}; d = d + 1) { D = D + dy[orow + d] * o[orow + d]; }`;
    return `${layout(this.d, this.vec4)}
      fn main(index : i32) {
        if (index >= uniforms.nRows) { return; }${queryRow(this.G, K, "index")}
        let r = (n * ${H} + h) * 3;
        if (t < s0) {
          result[r] = 0.0;
          result[r + 1] = 1.0;
          result[r + 2] = 0.0;
          return;
        }
${pass}
        ${D}
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

// ---- the backward pass held in registers (head size a multiple of 4) ---------------------------
//
// Measured on an H100 at the 0.5B shape (64 rows x 96 tokens, 14 query / 2 kv heads, hd 64) the
// scalar kernels above took 69 of a forward + backward pass's 413 ms of kernel time in dV and dQ/dK:
// a key row's thread walks every query of its group (N x K threads: 12,288, three warps an SM), and
// its row arrays (acc[hd], k[hd], indexed in loops) live in local memory. Here each thread owns one
// (row, query head) pair for all three gradients (dQ of a query row; the head's share of dK and dV of
// a key row), 3 N H threads in one dispatch; rows are vec4 registers in straight-line code (the
// generator unrolls over hd / 4), and the heads' shares of dK and dV are summed per kv head by two
// small gather passes (fixed order: the same bits every time). Four dispatches a backward pass
// instead of three.

/** `n` unrolled lines (or terms joined by `sep`) of f(i), i < n. */
const unroll = (n: number, f: (i: number) => string, sep = "\n          "): string => Array.from({ length: n }, (_, i) => f(i)).join(sep);

/**
 * dQ, and each query head's share of dK and dV, as [N, H, 3, hd]: threads [0, NH) are query rows
 * (dq = scale sum_s dS k_s over keys s0..t), [NH, 2NH) and [2NH, 3NH) are (key row, query head)
 * pairs (dk_h = scale sum_t dS q_t and dv_h = sum_t p dO_t over the queries t >= s that see key s,
 * from T-1 down); dS = p (dO . v - D), p recomputed from the row stats. Rows before keyStart: zeros.
 */
class AttentionGrads4 extends AttentionProgram {
  variableNames = ["qk", "v", "ks", "st", "dy"];
  variableComponents = [4, 4, 1, 1, 4];
  outputComponent = 4;
  constructor(N: number, d: Dims) {
    super([N, d.H, 3, d.hd], "Grads4", d, 3 * N * d.H);
  }
  getUserCode(): string {
    const { H, K, hd } = this.d, G = this.G, h4 = hd / 4;
    const dotWith = (a: string, row: string, arr: string) => unroll(h4, (i) => `dot(${a}${i}, ${arr}[${row} + ${i}])`, " + ");
    const zero = (p: string) => unroll(h4, (i) => `var ${p}${i} = vec4<f32>(0.0);`);
    const write = (p: string, at: string, mul = "") => unroll(h4, (i) => `result[${at} + ${i}] = ${p}${i}${mul};`);
    /** The queries t >= s that see key s, T-1 down: their rows qr (q), g (dO), r (stats) and the score x = k . q, then `body`. */
    const queries = (body: string) => `
            for (var t = uniforms.T - 1; t >= s; t = t - 1) {
              let nq = b * uniforms.T + t;
              let qr = qAt4(nq, h);
              let g = oAt4(nq, h);
              let r = nq * ${H} + h;
              let x = ${dotWith("k", "qr", "qk")};
              ${body}
            }`;
    return `${layout(this.d, true)}
      fn gradQ(index : i32) {${queryRow(G, K, "index")}
        let w0 = (n * ${H} + h) * ${3 * h4};
        ${zero("a")}
        if (t >= s0) {
          let qr = qAt4(n, h);
          let orow = oAt4(n, h);
          ${unroll(h4, (i) => `let q${i} = qk[qr + ${i}]; let g${i} = dy[orow + ${i}];`)}
          let r = n * ${H} + h;
          let D = st[r * 3 + 2];
          for (var s = s0; s <= t; s = s + 1) {
            let kr = kAt4(b * uniforms.T + s, kh);
            let vr = vAt4(b * uniforms.T + s, kh);
            let x = ${dotWith("q", "kr", "qk")};
            let dp = ${dotWith("g", "vr", "v")};
            let ds = ${prob("x", "r")} * (dp - D);
            ${unroll(h4, (i) => `a${i} = a${i} + ds * qk[kr + ${i}];`)}
          }
        }
        ${write("a", "w0", " * uniforms.scale")}
      }
      fn gradKV(index : i32, part : i32) {
        let j = index % ${G};
        let s = (index / ${G}) % uniforms.T;
        let bk = index / ${G} / uniforms.T;
        let kh = bk % ${K};
        let b = bk / ${K};
        let h = kh * ${G} + j;
        let n = b * uniforms.T + s;
        let s0 = ks[b];
        let w0 = (n * ${H} + h) * ${3 * h4} + part * ${h4};
        ${zero("a")}
        if (s >= s0) {
          let kr = kAt4(n, kh);
          let vr = vAt4(n, kh);
          ${unroll(h4, (i) => `let k${i} = qk[kr + ${i}];`)}
          if (part == 1) {
            ${unroll(h4, (i) => `let v${i} = v[vr + ${i}];`, "\n            ")}${queries(`let dp = ${dotWith("v", "g", "dy")};
              let ds = ${prob("x", "r")} * (dp - st[r * 3 + 2]);
              ${unroll(h4, (i) => `a${i} = a${i} + ds * qk[qr + ${i}];`, "\n              ")}`)}
            ${unroll(h4, (i) => `a${i} = a${i} * uniforms.scale;`, "\n            ")}
          } else {${queries(`let pr = ${prob("x", "r")};
              ${unroll(h4, (i) => `a${i} = a${i} + pr * dy[g + ${i}];`, "\n              ")}`)}
          }
        }
        ${write("a", "w0")}
      }
      fn main(index : i32) {
        let rows = uniforms.nRows;
        if (index < rows) { gradQ(index); }
        else if (index < 2 * rows) { gradKV(index - rows, 1); }
        else if (index < 3 * rows) { gradKV(index - 2 * rows, 2); }
      }`;
  }
}

/**
 * From AttentionGrads4's [N, H, 3, hd]: `qk` gives d(qk) [N, H+K, hd] (dq copied, dk summed over each
 * kv head's query heads in order), `v` gives dV [N, K, hd] (the dv shares summed alike). One thread a vec4.
 */
class AttentionGather4 extends FusedProgram {
  variableNames = ["part"];
  variableComponents = [4];
  outputComponent = 4;
  uniforms = "total : i32,";
  constructor(N: number, private readonly d: Dims, private readonly which: "qk" | "v") {
    const slots = which === "qk" ? d.H + d.K : d.K;
    super([N, slots, d.hd], `verlFusedAttentionGather4_${which}_${d.H}_${d.K}_${d.hd}`, WG, Math.ceil((N * slots * d.hd) / 4 / WG));
  }
  getUserCode(): string {
    const { H, K, hd } = this.d, G = H / K, h4 = hd / 4, slots = this.which === "qk" ? H + K : K;
    const sum = (part: number, kh: string) => unroll(G, (j) => `part[((n * ${H} + ${kh} * ${G} + ${j}) * 3 + ${part}) * ${h4} + i]`, " + ");
    const body = this.which === "qk"
      ? `if (c < ${H}) { result[index] = part[((n * ${H} + c) * 3) * ${h4} + i]; }
          else { let kh = c - ${H}; result[index] = ${sum(1, "kh")}; }`
      : `result[index] = ${sum(2, "c")};`;
    return `
      fn main(index : i32) {
        if (index >= uniforms.total) { return; }
        let i = index % ${h4};
        let c = (index / ${h4}) % ${slots};
        let n = index / ${h4} / ${slots};
        ${body}
      }`;
  }
}

/** vec4: the register-held kernels (Fwd4, Stats4, Grads4), chosen once per call so forward and backward agree. */
type Attrs = { T: number; scale: number; H: number; K: number; vec4: boolean };
const dimsOf = (qk: { shape: number[] }, a: Attrs): Dims => ({ H: a.H, K: a.K, hd: qk.shape[2]! });
const uniformsOf = (a: Attrs, rows: number) => [int(a.T), int(rows), { type: "float32" as const, data: [a.scale] }];

const KERNELS: Record<string, Kernel> = {
  VerlAttention: ({ inputs: { qk, v, ks }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionForward(N, d, a.vec4), [qk!, v!, ks!], "float32", uniformsOf(a, N * d.H));
  },
  VerlAttentionStats: ({ inputs: { qk, ks, o, dy }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionStats(N, d, a.vec4), [qk!, ks!, o!, dy!], "float32", uniformsOf(a, N * d.H));
  },
  VerlAttentionGradV: ({ inputs: { qk, ks, st, dy }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionGradV(N, d), [qk!, ks!, st!, dy!], "float32", uniformsOf(a, N * d.K));
  },
  VerlAttentionGrads4: (({ inputs: { qk, v, ks, st, dy }, backend, attrs }: Parameters<Kernel>[0]) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    const part = backend.runWebGPUProgram(new AttentionGrads4(N, d), [qk!, v!, ks!, st!, dy!], "float32", uniformsOf(a, N * d.H));
    const gather = (which: "qk" | "v") => {
      const g = new AttentionGather4(N, d, which);
      return backend.runWebGPUProgram(g, [part], "float32", [int(N * (which === "qk" ? d.H + d.K : d.K) * d.hd / 4)]);
    };
    const dqk = gather("qk"), dv = gather("v");
    backend.disposeData(part.dataId);
    return [dqk, dv];
  }) as unknown as Kernel,
  VerlAttentionGradQK: ({ inputs: { qk, v, ks, st, dy }, backend, attrs }) => {
    const a = attrs as Attrs, d = dimsOf(qk!, a), N = qk!.shape[0]!;
    return backend.runWebGPUProgram(new AttentionGradQK(N, d), [qk!, v!, ks!, st!, dy!], "float32", uniformsOf(a, N * (d.H + d.K)));
  },
};

let registered = false;
/**
 * The register-held kernels (Fwd4, Stats4, Grads4) where the head size is a multiple of 4, else the
 * scalar ones; setAttentionRegisters(false) (or VERL_WEBGPU_ATTENTION=scalar) keeps the scalar
 * kernels everywhere (tests and the bench compare the two). Returns the previous setting.
 */
let useRegisters = process.env.VERL_WEBGPU_ATTENTION !== "scalar";
export function setAttentionRegisters(on: boolean): boolean {
  const before = useRegisters;
  useRegisters = on;
  return before;
}

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
  const attrs: Attrs = { T, scale: s.scale, H, K, vec4: hd % 4 === 0 && useRegisters };
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
        let dqk: tf.Tensor, dv: tf.Tensor;
        if (attrs.vec4) {
          [dqk, dv] = tf.engine().runKernel("VerlAttentionGrads4", { qk: qs, v: vs, ks: ks2, st, dy: g }, attrs as unknown as tf.NamedAttrMap) as unknown as [tf.Tensor, tf.Tensor];
        } else {
          dv = run("VerlAttentionGradV", { qk: qs, ks: ks2, st, dy: g }, attrs);
          dqk = run("VerlAttentionGradQK", { qk: qs, v: vs, ks: ks2, st, dy: g }, attrs);
        }
        tf.dispose([ks2, st]);
        return [dqk, dv];
      },
    };
  });
  return attend(qk, v) as tf.Tensor2D;
}
