// WGSL programs of the WebGPU decode engine (webgpu_decoder.ts), in tfjs-backend-webgpu's
// program shape: `backend.runWebGPUProgram(program, inputs, dtype, uniforms, output?)` wraps
// getUserCode() with the bindings (`result` read_write, one read-only array per variable
// name, `uniforms`), and compiles once per shaderKey. Only the ranks of the shapes reach the
// cache key, so every size baked into the code is in shaderKey; per-call sizes are uniforms.
// With `output` given the program writes into an existing tensor: that is how the KV cache
// is updated in place.

import { halfPairFn, type Rounding } from "../engine/webgpu_gemm.js";
import { advancing, type SteppedUniform } from "../engine/webgpu_replay.js";

/**
 * A producer that writes its result as the next product's left operand: padded f16 words [rowsP,
 * colsP / 2] (int32), zero past the real rows and columns, so the product needs no pack dispatch.
 */
export interface PackedOut { rowsP: number; colsP: number; rounding: Rounding }

export interface DecodeShape {
  dim: number; hiddenDim: number; nHeads: number; nKvHeads: number; headDim: number; vocabSize: number; normEps: number;
}

/** What runWebGPUProgram needs of a program (tfjs-backend-webgpu's WebGPUProgram). */
export interface GpuProgram {
  variableNames: string[];
  outputShape: number[];
  shaderKey: string;
  dispatchLayout: { x: number[] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number];
  uniforms?: string;
  getUserCode(): string;
}

/** A uniform as tfjs takes it; `perStep` (webgpu_replay.ts) marks one a replayed decode step advances. */
export type UniformValue = SteppedUniform;

/** Workgroups laid out under the per-dimension limit: x up to 32768, then y. */
export function grid(groups: number): [number, number, number] {
  const x = Math.max(1, Math.min(groups, 32768));
  return [x, Math.max(1, Math.ceil(groups / x)), 1];
}

/** A WGSL f32 literal. */
const f32 = (x: number): string => (Number.isInteger(x) ? x.toFixed(1) : x.toExponential());

/** A program whose invocations are a flat range of `total` elements, 256 a workgroup. */
abstract class FlatProgram implements GpuProgram {
  abstract variableNames: string[];
  abstract shaderKey: string;
  dispatchLayout = { x: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number] = [256, 1, 1];
  abstract uniforms: string;
  constructor(public outputShape: number[], total: number) {
    this.dispatch = grid(Math.ceil(total / 256));
  }
  abstract getUserCode(): string;
}

/** result[n, d] = emb[tok[n], d] for n < nTok (tok: the first nTok int32 values). */
export class EmbedProgram extends FlatProgram {
  variableNames = ["emb", "tok"];
  uniforms = "nTok : i32,";
  shaderKey: string;
  constructor(private readonly D: number, N: number) {
    super([N, D], N * D);
    this.shaderKey = `verlEmbed_${D}`;
  }
  getUserCode(): string {
    const D = this.D;
    return `
      fn main(index : i32) {
        if (index < uniforms.nTok * ${D}) {
          let n = index / ${D};
          result[index] = emb[tok[n] * ${D} + index - n * ${D}];
        }
      }`;
  }
}

/**
 * One workgroup of 256 per row: result = x / sqrt(mean(x^2) + eps) * w; with `packed`, written as
 * the next product's padded f16 operand (rows up to rowsP, the extra ones zero).
 */
export class RmsNormProgram implements GpuProgram {
  variableNames = ["x", "w"];
  uniforms = "nRows : i32,";
  dispatchLayout = { x: [0] };
  workgroupSize: [number, number, number] = [256, 1, 1];
  dispatch: [number, number, number];
  outputShape: number[];
  shaderKey: string;
  constructor(private readonly D: number, private readonly eps: number, N: number, private readonly packed?: PackedOut) {
    this.outputShape = packed ? [(packed.rowsP * packed.colsP) / 2] : [N, D];
    this.dispatch = grid(packed ? packed.rowsP : N);
    this.shaderKey = `verlRmsNorm_${D}_${eps}${packed ? `_packed${packed.colsP}_${packed.rounding}` : ""}`;
  }
  getUserCode(): string {
    const D = this.D, pk = this.packed;
    const write = pk
      ? `
        let W = ${pk.colsP / 2};
        for (var j = tid; j < W; j = j + 256) {
          var a = 0.0;
          var b = 0.0;
          if (live && 2 * j < ${D}) { a = x[row * ${D} + 2 * j] * r * w[2 * j]; }
          if (live && 2 * j + 1 < ${D}) { b = x[row * ${D} + 2 * j + 1] * r * w[2 * j + 1]; }
          result[row * W + j] = verlHalfPair(a, b);
        }`
      : `
        if (live) {
          for (var d = tid; d < ${D}; d = d + 256) { result[row * ${D} + d] = x[row * ${D} + d] * r * w[d]; }
        }`;
    return `${pk ? halfPairFn(pk.rounding) : ""}
      var<workgroup> partial : array<f32, 256>;
      fn main(index : i32) {
        let row = index / 256;
        let tid = i32(localIndex);
        let live = row < uniforms.nRows;
        var ss = 0.0;
        if (live) {
          for (var d = tid; d < ${D}; d = d + 256) { let v = x[row * ${D} + d]; ss = ss + v * v; }
        }
        partial[tid] = ss;
        workgroupBarrier();
        for (var s = 128; s > 0; s = s >> 1u) {
          if (tid < s) { partial[tid] = partial[tid] + partial[tid + s]; }
          workgroupBarrier();
        }
        let r = 1.0 / sqrt(partial[0] / ${f32(D)} + ${f32(this.eps)});${write}
      }`;
  }
}

/**
 * fp8 rollout: each row's groups of G columns rounded to e4m3 as vLLM's per-token-group quantization
 * does (scale = max(amax, 1e-10) / 448, e4m3(clamp(x / scale, ±448)) * scale), one invocation a group.
 * The e4m3 rounding works on the float32 bits as rollout/fp8.ts's; WGSL's division may differ from
 * the host's correctly rounded one by an ulp, which can move a value sitting on a rounding tie.
 */
export class Fp8ActivationProgram extends FlatProgram {
  variableNames = ["x"];
  uniforms = "nRows : i32,";
  shaderKey: string;
  constructor(private readonly K: number, private readonly G: number, N: number) {
    super([N, K], N * Math.ceil(K / G));
    this.shaderKey = `verlFp8Act_${K}_${G}`;
  }
  getUserCode(): string {
    const K = this.K, G = this.G, groups = Math.ceil(K / G);
    return `
      fn e4m3(y : f32) -> f32 {
        let a = abs(y);
        var r : f32;
        if (a < 0.015625) {
          r = round(a * 512.0) / 512.0;
        } else {
          let b = bitcast<u32>(a);
          r = bitcast<f32>((b + 0x7ffffu + ((b >> 20u) & 1u)) & 0xfff00000u);
        }
        return select(r, -r, y < 0.0);
      }
      fn main(index : i32) {
        if (index < uniforms.nRows * ${groups}) {
          let row = index / ${groups};
          let c0 = (index - row * ${groups}) * ${G};
          let c1 = min(c0 + ${G}, ${K});
          var amax = 0.0;
          for (var c = c0; c < c1; c = c + 1) { amax = max(amax, abs(x[row * ${K} + c])); }
          let s = max(amax, 1e-10) / 448.0;
          for (var c = c0; c < c1; c = c + 1) {
            result[row * ${K} + c] = e4m3(clamp(x[row * ${K} + c] / s, -448.0, 448.0)) * s;
          }
        }
      }`;
  }
}

/** h = silu(gate) * up for rows [gate (F) | up (F)]. */
export class SwiGluProgram extends FlatProgram {
  variableNames = ["gu"];
  uniforms: string;
  shaderKey: string;
  /**
   * With `packed`: written as the down product's padded f16 operand. Its word count is a uniform
   * (uniformValues), not baked in: the key holds no row count, so a baked bound would be the first
   * call's for every later call, leaving the rows past it unwritten (non-finite slot-decoder
   * log-probs on the H200, where the first call was a short prefill).
   */
  constructor(private readonly F: number, private readonly N: number, private readonly packed?: PackedOut) {
    super(packed ? [(packed.rowsP * packed.colsP) / 2] : [N, F], packed ? (packed.rowsP * packed.colsP) / 2 : N * F);
    this.uniforms = packed ? "nRows : i32, nWords : i32," : "nRows : i32,";
    this.shaderKey = `verlSwiGlu_${F}${packed ? `_packed${packed.colsP}_${packed.rounding}` : ""}`;
  }
  uniformValues(): UniformValue[] {
    const u: UniformValue[] = [{ type: "int32", data: [this.N] }];
    if (this.packed) u.push({ type: "int32", data: [(this.packed.rowsP * this.packed.colsP) / 2] });
    return u;
  }
  getUserCode(): string {
    const F = this.F, pk = this.packed;
    if (pk) {
      const W = pk.colsP / 2;
      return `${halfPairFn(pk.rounding)}
      fn verlAct(n : i32, f : i32) -> f32 {
        if (n >= uniforms.nRows || f >= ${F}) { return 0.0; }
        let g = gu[n * ${2 * F} + f];
        return g / (1.0 + exp(-g)) * gu[n * ${2 * F} + ${F} + f];
      }
      fn main(index : i32) {
        if (index < uniforms.nWords) {
          let n = index / ${W};
          let j = index - n * ${W};
          result[index] = verlHalfPair(verlAct(n, 2 * j), verlAct(n, 2 * j + 1));
        }
      }`;
    }
    return `
      fn main(index : i32) {
        if (index < uniforms.nRows * ${F}) {
          let n = index / ${F};
          let f = index - n * ${F};
          let g = gu[n * ${2 * F} + f];
          result[index] = g / (1.0 + exp(-g)) * gu[n * ${2 * F} + ${F} + f];
        }
      }`;
  }
}

/**
 * Qwen3's q_norm / k_norm: each q head and each k head of the fused qkv rows RMS-normed over
 * head_dim and scaled by its weight, v copied; one invocation a (token, head). One dispatch where
 * the tfjs ops took about fifteen a layer.
 */
export class QkNormProgram extends FlatProgram {
  variableNames = ["qkv", "qn", "kn"];
  uniforms = "nRows : i32,";
  shaderKey: string;
  constructor(private readonly s: Pick<DecodeShape, "nHeads" | "nKvHeads" | "headDim" | "normEps">, N: number) {
    const heads = s.nHeads + 2 * s.nKvHeads;
    super([N, heads * s.headDim], N * heads);
    this.shaderKey = `verlQkNorm_${s.nHeads}_${s.nKvHeads}_${s.headDim}_${s.normEps}`;
  }
  getUserCode(): string {
    const { nHeads: H, nKvHeads: KV, headDim: HD, normEps } = this.s, heads = H + 2 * KV;
    return `
      fn main(index : i32) {
        if (index < uniforms.nRows * ${heads}) {
          let n = index / ${heads};
          let h = index - n * ${heads};
          let base = n * ${heads * HD} + h * ${HD};
          if (h >= ${H + KV}) {
            for (var d = 0; d < ${HD}; d = d + 1) { result[base + d] = qkv[base + d]; }
            return;
          }
          var ss = 0.0;
          for (var d = 0; d < ${HD}; d = d + 1) { let v = qkv[base + d]; ss = ss + v * v; }
          let r = inverseSqrt(ss / ${f32(HD)} + ${f32(normEps)});
          for (var d = 0; d < ${HD}; d = d + 1) {
            var w = kn[d];
            if (h < ${H}) { w = qn[d]; }
            result[base + d] = qkv[base + d] * r * w;
          }
        }
      }`;
  }
}

// Uniforms shared by the two programs that place tokens in the cache: token n belongs to
// cache row n / tPer at column slot0 + n % tPer, rotary position pos[n] + posAdd; the KV
// cache of a layer is [2 (k, v), rows, kvHeads, maxLen, headDim], v at vOff; rope is
// [2 (cos, sin), positions, headDim / 2], sin at ropeOff.
const PLACE_UNIFORMS = "nTok : i32, tPer : i32, slot0 : i32, posAdd : i32, maxLen : i32, vOff : i32, ropeOff : i32,";

export interface Placement {
  nTok: number; tPer: number; slot0: number; posAdd: number; maxLen: number; vOff: number; ropeOff: number;
  /** a decode step: slot0 and posAdd advance by one a step when the step is replayed (webgpu_replay.ts) */
  advancing?: boolean;
}

export function placementUniforms(p: Placement): UniformValue[] {
  const u = [p.nTok, p.tPer, p.slot0, p.posAdd, p.maxLen, p.vOff, p.ropeOff].map((v): UniformValue => ({ type: "int32", data: [v] }));
  if (p.advancing) for (const i of [2, 3]) u[i] = advancing(u[i]!);
  return u;
}

/** The rotary rotation (HF halves) of element d of a head whose first half starts at `lo`, in WGSL. */
function ropeSnippet(half: number): string {
  return `
      fn verlRope(lo : i32, bo : i32, d : i32, p : i32) -> f32 {
        let i = d % ${half};
        let x1 = qkv[lo + i] + bias[bo + i];
        let x2 = qkv[lo + i + ${half}] + bias[bo + i + ${half}];
        let c = rope[p * ${half} + i];
        let s = rope[uniforms.ropeOff + p * ${half} + i];
        if (d < ${half}) { return x1 * c - x2 * s; }
        return x2 * c + x1 * s;
      }`;
}

/**
 * Writes the new tokens' k (bias, rotary) and v (bias) into one layer's KV cache, in place
 * (the cache tensor is passed as the output). Invocations: nTok x kvHeads x headDim.
 */
export class CacheWriteProgram extends FlatProgram {
  variableNames = ["qkv", "bias", "rope", "pos"];
  uniforms = PLACE_UNIFORMS;
  shaderKey: string;
  /** half: the cache holds f16 pairs in 32-bit words (an int32 tensor of half the elements; vOff still counts elements) */
  constructor(private readonly s: DecodeShape, N: number, cacheSize: number, private readonly half = false) {
    super([cacheSize], (N * s.nKvHeads * s.headDim) / (half ? 2 : 1));
    this.shaderKey = `verlCacheWrite_${s.nHeads}_${s.nKvHeads}_${s.headDim}${half ? "_f16" : ""}`;
  }
  getUserCode(): string {
    const { nHeads: NH, nKvHeads: KVH, headDim: HD } = this.s, W = (NH + 2 * KVH) * HD;
    if (this.half) {
      // one invocation per pair of elements (2e, 2e + 1), written as one word
      const H2 = HD / 2;
      return `${ropeSnippet(HD / 2)}
      fn main(index : i32) {
        if (index < uniforms.nTok * ${KVH * H2}) {
          let e = index % ${H2};
          let j = (index / ${H2}) % ${KVH};
          let n = index / ${KVH * H2};
          let b = n / uniforms.tPer;
          let slot = uniforms.slot0 + n % uniforms.tPer;
          let p = pos[n] + uniforms.posAdd;
          let dst = ((b * ${KVH} + j) * uniforms.maxLen + slot) * ${H2} + e;
          let kLo = n * ${W} + ${NH * HD} + j * ${HD};
          let kb = ${NH * HD} + j * ${HD};
          let k2 = vec2<f32>(verlRope(kLo, kb, 2 * e, p), verlRope(kLo, kb, 2 * e + 1, p));
          let vi = n * ${W} + ${(NH + KVH) * HD} + j * ${HD} + 2 * e;
          let vb = ${(NH + KVH) * HD} + j * ${HD} + 2 * e;
          let v2 = vec2<f32>(qkv[vi] + bias[vb], qkv[vi + 1] + bias[vb + 1]);
          result[dst] = bitcast<i32>(pack2x16float(k2));
          result[uniforms.vOff / 2 + dst] = bitcast<i32>(pack2x16float(v2));
        }
      }`;
    }
    return `${ropeSnippet(HD / 2)}
      fn main(index : i32) {
        if (index < uniforms.nTok * ${KVH * HD}) {
          let d = index % ${HD};
          let j = (index / ${HD}) % ${KVH};
          let n = index / ${KVH * HD};
          let b = n / uniforms.tPer;
          let slot = uniforms.slot0 + n % uniforms.tPer;
          let p = pos[n] + uniforms.posAdd;
          let dst = ((b * ${KVH} + j) * uniforms.maxLen + slot) * ${HD} + d;
          result[dst] = verlRope(n * ${W} + ${NH * HD} + j * ${HD}, ${NH * HD} + j * ${HD}, d, p);
          result[uniforms.vOff + dst] = qkv[n * ${W} + ${(NH + KVH) * HD} + j * ${HD} + d] + bias[${(NH + KVH) * HD} + j * ${HD} + d];
        }
      }`;
  }
}

/**
 * Copies the first `cols` columns of whole cache rows in place (the cache tensor is the output
 * and is read through `result`): row pairs[2i] gets row pairs[2i + 1]'s k and v. Prefix sharing
 * (rollout.n): the siblings of a prompt get the cache of the one row that was prefilled. No
 * source row is a destination, so the order of the copies does not matter.
 * Invocations: pairs x kvHeads x cols x headDim.
 */
export class CacheCopyProgram extends FlatProgram {
  variableNames = ["pairs"];
  uniforms = "nPairs : i32, cols : i32, maxLen : i32, vOff : i32,";
  shaderKey: string;
  /** half: an f16 cache (words of two halves); the copy moves words, and vOff is given in words */
  constructor(private readonly s: DecodeShape, nPairs: number, cols: number, cacheSize: number, private readonly half = false) {
    super([cacheSize], (nPairs * s.nKvHeads * cols * s.headDim) / (half ? 2 : 1));
    this.shaderKey = `verlCacheCopy_${s.nKvHeads}_${s.headDim}${half ? "_f16" : ""}`;
  }
  static uniforms(nPairs: number, cols: number, maxLen: number, vOff: number): UniformValue[] {
    return [nPairs, cols, maxLen, vOff].map((v) => ({ type: "int32", data: [v] }));
  }
  getUserCode(): string {
    const KVH = this.s.nKvHeads, HD = this.s.headDim / (this.half ? 2 : 1);
    return `
      fn main(index : i32) {
        if (index < uniforms.nPairs * uniforms.cols * ${KVH * HD}) {
          let d = index % ${HD};
          let c = (index / ${HD}) % uniforms.cols;
          let j = (index / (${HD} * uniforms.cols)) % ${KVH};
          let i = index / (${HD * KVH} * uniforms.cols);
          let dst = ((pairs[2 * i] * ${KVH} + j) * uniforms.maxLen + c) * ${HD} + d;
          let src = ((pairs[2 * i + 1] * ${KVH} + j) * uniforms.maxLen + c) * ${HD} + d;
          result[dst] = result[src];
          result[uniforms.vOff + dst] = result[uniforms.vOff + src];
        }
      }`;
  }
}

/** Invocations of a decode attention workgroup, and the cache columns it takes a tile. */
const ATT_WG = 128;
/** The widest head the decode attention takes: a value row's pairs must fit in one workgroup's invocations. */
export const MAX_DECODE_HEAD_DIM = 2 * ATT_WG;
/** Workgroup memory WebGPU guarantees (maxComputeWorkgroupStorageSize's default). */
const ATT_SHARED_BYTES = 16384;

/**
 * Cache elements one load of the decode attention takes: a vec4 word (8 halves of the f16
 * cache, 4 floats of the float32 one) where the head is that wide, else a pair. One
 * invocation scoring a key column with vec4 loads issues 8 loads at head_dim 64 instead of
 * 32, and a value row is read by 8 invocations, four rows to a subgroup's load.
 */
export function attentionLoadElements(hd: number, half: boolean): number {
  const wide = half ? 8 : 4;
  return hd % wide === 0 ? wide : 2;
}

/** Floats of workgroup memory an AttentionProgram serving `hg` query heads uses (see its layout). */
function attentionSharedFloats(hd: number, hg: number, half: boolean): number {
  const phases = Math.floor(ATT_WG / (hd / attentionLoadElements(hd, half)));
  return hg * hd + 2 * hg * ATT_WG + phases * hg;
}

/**
 * Query heads one decode attention workgroup serves: a kv head's whole group (grouped-query
 * attention: the cache of a kv head is read once for all of them) where the workgroup memory
 * fits in WebGPU's guaranteed 16 KiB, else the largest divisor of the group that fits;
 * `perHead` gives 1 (each query head reads its kv head's cache on its own, as before
 * 2026-12-06: the benchmark compares the two). `half`: the cache holds f16.
 */
export function attentionHeadsPerGroup(s: Pick<DecodeShape, "nHeads" | "nKvHeads" | "headDim">, perHead = false, half = false): number {
  const G = s.nHeads / s.nKvHeads;
  for (let hg = perHead ? 1 : G; hg >= 1; hg--) {
    if (G % hg === 0 && attentionSharedFloats(s.headDim, hg, half) * 4 <= ATT_SHARED_BYTES) return hg;
  }
  throw new Error(`decode attention: head_dim ${s.headDim} needs more than ${ATT_SHARED_BYTES} bytes of workgroup memory even for one head`);
}

/**
 * Attention of each new token over its cache row: one workgroup of 128 per (token, group of
 * HG query heads sharing a kv head); q gets its bias, rotary and 1/sqrt(d) here. Keys are the
 * columns up to the token's own whose mask is set (masked columns are never read: their cache
 * may hold anything), taken in tiles of 128 with a running max and sum per head (flash-decoding
 * in one pass). The cache is read in loads of EU elements (attentionLoadElements: a vec4 word
 * where the head allows), UR = headDim / EU of them a row:
 * - scores: invocation c reads key column t0 + c once (UR loads) and scores it for all HG heads;
 * - each head's tile maximum by a tree over workgroup memory, then the column's weights;
 * - values: invocation (unit du, phase ph) reads value unit du of the columns c = ph (mod P),
 *   P = 128 / UR phases (16 at head_dim 64 with an f16 cache: a subgroup's load is four whole
 *   rows), and accumulates every head.
 * The phases' sums are added at the end, R phases a round through workgroup memory.
 * Output [nTok, heads * headDim], or with `packed` o_proj's padded f16 operand (the padding rows'
 * workgroups and the last head group write the zeros), so o_proj needs no pack dispatch.
 * Workgroup memory: qs [HG, HD] (rotated queries), then sh: the weights [HG, T] and the
 * reduction [HG, T], at the end a round's sums [R, HG, HD] over the same floats; the phases'
 * weight sums [P, HG] after them.
 */
export class AttentionProgram implements GpuProgram {
  variableNames = ["qkv", "bias", "rope", "pos", "mask", "kv"];
  variableComponents: number[];
  uniforms = PLACE_UNIFORMS;
  dispatchLayout = { x: [0] };
  workgroupSize: [number, number, number] = [ATT_WG, 1, 1];
  dispatch: [number, number, number];
  outputShape: number[];
  shaderKey: string;
  /** query heads a workgroup serves */
  readonly headsPerGroup: number;
  /** cache elements a load */
  readonly loadElements: number;
  /** half: the cache holds f16 pairs in 32-bit words (see CacheWriteProgram); perHead: one query head a workgroup */
  constructor(private readonly s: DecodeShape, N: number, private readonly half = false, perHead = false, private readonly packed?: PackedOut) {
    // (even: the model config refuses odd head_dim for rotary embeddings)
    if (s.headDim > MAX_DECODE_HEAD_DIM) throw new Error(`decode attention: head_dim ${s.headDim} is over ${MAX_DECODE_HEAD_DIM}`);
    this.headsPerGroup = attentionHeadsPerGroup(s, perHead, half);
    this.loadElements = attentionLoadElements(s.headDim, half);
    // the cache bound as vec4 words where a load takes 4 of them (placedByTensor appends its input as scalars)
    this.variableComponents = [1, 1, 1, 1, 1, this.loadElements / (half ? 2 : 1) === 4 ? 4 : 1];
    if (packed && packed.colsP < s.nHeads * s.headDim) throw new Error(`decode attention: a packed output of ${packed.colsP} columns cannot hold ${s.nHeads * s.headDim}`);
    this.outputShape = packed ? [(packed.rowsP * packed.colsP) / 2] : [N, s.nHeads * s.headDim];
    this.dispatch = grid(((packed ? packed.rowsP : N) * s.nHeads) / this.headsPerGroup);
    this.shaderKey = `verlAttention_${s.nHeads}_${s.nKvHeads}_${s.headDim}_g${this.headsPerGroup}_e${this.loadElements}${half ? "_f16" : ""}`
      + (packed ? `_packed${packed.colsP}_${packed.rounding}` : "");
  }
  /** WGSL returning the EU / 2 element pairs of cache load `u` (u counts loads: element u * EU). */
  private loadFn(): string {
    const EU = this.loadElements, un = (w: string) => `unpack2x16float(bitcast<u32>(${w}))`;
    const body = this.half
      ? (EU === 8 ? `let w = kv[u]; return array<vec2<f32>, 4>(${un("w.x")}, ${un("w.y")}, ${un("w.z")}, ${un("w.w")});` : `return array<vec2<f32>, 1>(${un("kv[u]")});`)
      : (EU === 4 ? "let w = kv[u]; return array<vec2<f32>, 2>(w.xy, w.zw);" : "return array<vec2<f32>, 1>(vec2<f32>(kv[2 * u], kv[2 * u + 1]));");
    return `fn verlKvLoad(u : i32) -> array<vec2<f32>, ${EU / 2}> { ${body} }`;
  }
  getUserCode(): string {
    const { nHeads: NH, nKvHeads: KVH, headDim: HD } = this.s, W = (NH + 2 * KVH) * HD, G = NH / KVH, HG = this.headsPerGroup;
    const T = ATT_WG, DP = HD / 2, EU = this.loadElements, EP = EU / 2, UR = HD / EU, P = Math.floor(T / UR);
    const RED = HG * T, LS = 2 * HG * T, NG = NH / HG;
    // phases summed a round: their partial outputs [R, HG, HD] fit in the weights' and reduction's floats
    const R = Math.min(P, Math.floor((2 * T) / HD)), rounds = Math.ceil(P / R), NA = Math.ceil((HG * DP) / T);
    const pk = this.packed;
    // the output pair (o, o') of elements 2 * i2, 2 * i2 + 1 of the group's [HG, HD]: packed words or two floats
    const write = pk
      ? `result[gid / ${NG} * ${pk.colsP / 2} + h0 * ${DP} + i2] = verlHalfPair(o.x, o.y);`
      : `if (live) { result[n * ${NH * HD} + h0 * ${HD} + 2 * i2] = o.x; result[n * ${NH * HD} + h0 * ${HD} + 2 * i2 + 1] = o.y; }`;
    // packed: the columns past the heads are zero, written by the last head group
    const padCols = pk && pk.colsP > NH * HD
      ? `if (h0 + ${HG} == ${NH}) {
          for (var c = ${(NH * HD) / 2} + tid; c < ${pk.colsP / 2}; c = c + ${T}) { result[gid / ${NG} * ${pk.colsP / 2} + c] = 0; }
        }`
      : "";
    const each = (f: (g: number) => string) => Array.from({ length: HG }, (_, g) => f(g)).join("\n          ");
    const pairs = (f: (q: number) => string) => Array.from({ length: EP }, (_, q) => f(q)).join("\n              ");
    return `${ropeSnippet(HD / 2)}${pk ? halfPairFn(pk.rounding) : ""}
      ${this.loadFn()}
      var<workgroup> qs : array<vec2<f32>, ${HG * DP}>;
      var<workgroup> sh : array<f32, ${attentionSharedFloats(HD, HG, this.half) - HG * HD}>;
      var<workgroup> groupShared : i32;
      fn main(index : i32) {
        let tid = i32(localIndex);
        if (tid == 0) { groupShared = i32(workgroupId.y * numWorkgroups.x + workgroupId.x); }
        let gid = workgroupUniformLoad(&groupShared);
        let live = gid < uniforms.nTok * ${NG};
        let n = min(gid / ${NG}, uniforms.nTok - 1);
        let h0 = (gid % ${NG}) * ${HG};
        let j = h0 / ${G};
        let b = n / uniforms.tPer;
        let slot = uniforms.slot0 + n % uniforms.tPer;
        let p = pos[n] + uniforms.posAdd;
        for (var i = tid; i < ${HG * DP}; i = i + ${T}) {
          let h = h0 + i / ${DP};
          let d = 2 * (i % ${DP});
          qs[i] = vec2<f32>(verlRope(n * ${W} + h * ${HD}, h * ${HD}, d, p), verlRope(n * ${W} + h * ${HD}, h * ${HD}, d + 1, p)) * ${f32(1 / Math.sqrt(HD))};
        }
        workgroupBarrier();
        // in loads: a row is ${UR} loads, the values start vOff / ${EU} loads in
        let kBase = (b * ${KVH} + j) * uniforms.maxLen * ${UR};
        let vBase = uniforms.vOff / ${EU} + kBase;
        let mBase = b * uniforms.maxLen;
        let du = tid % ${UR};
        let ph = tid / ${UR};
        ${each((g) => `var m${g} = -3.0e38; var l${g} = 0.0;`)}
        ${each((g) => Array.from({ length: EP }, (_, q) => `var o${g}_${q} = vec2<f32>(0.0);`).join(" "))}
        // a packed output's padding rows (live false) only write zeros: no columns for them
        let last = select(-1, slot, live);
        for (var t0 = 0; t0 <= last; t0 = t0 + ${T}) {
          let cnt = min(${T}, slot + 1 - t0);
          ${each((g) => `var s${g} = -3.0e38;`)}
          if (tid < cnt && mask[mBase + t0 + tid] != 0) {
            ${each((g) => `s${g} = 0.0;`)}
            let kr = kBase + (t0 + tid) * ${UR};
            for (var e = 0; e < ${UR}; e = e + 1) {
              let k = verlKvLoad(kr + e);
              ${each((g) => Array.from({ length: EP }, (_, q) => `s${g} = s${g} + dot(qs[${g * DP} + e * ${EP} + ${q}], k[${q}]);`).join(" "))}
            }
          }
          ${each((g) => `sh[${RED + g * T} + tid] = s${g};`)}
          workgroupBarrier();
          for (var st = ${T / 2}; st > 0; st = st >> 1u) {
            if (tid < st) {
              ${each((g) => `sh[${RED + g * T} + tid] = max(sh[${RED + g * T} + tid], sh[${RED + g * T} + tid + st]);`)}
            }
            workgroupBarrier();
          }
          ${each((g) => `let n${g} = max(m${g}, sh[${RED + g * T}]); let c${g} = exp(m${g} - n${g}); m${g} = n${g}; l${g} = l${g} * c${g};`)}
          ${each((g) => Array.from({ length: EP }, (_, q) => `o${g}_${q} = o${g}_${q} * c${g};`).join(" "))}
          ${each((g) => `sh[${g * T} + tid] = select(0.0, exp(s${g} - m${g}), s${g} > -1.0e38);`)}
          workgroupBarrier();
          if (ph < ${P}) {
            for (var c = ph; c < cnt; c = c + ${P}) {
              let v = verlKvLoad(vBase + (t0 + c) * ${UR} + du);
              ${each((g) => `let w${g} = sh[${g * T} + c]; l${g} = l${g} + w${g};`)}
              ${each((g) => Array.from({ length: EP }, (_, q) => `o${g}_${q} = o${g}_${q} + w${g} * v[${q}];`).join(" "))}
            }
          }
          workgroupBarrier();
        }
        if (ph < ${P} && du == 0) {
          ${each((g) => `sh[${LS} + ph * ${HG} + ${g}] = l${g};`)}
        }
        // the phases' outputs summed ${R} a round: invocation tid keeps element pairs tid + a * ${T} of [HG, HD]
        var acc : array<vec2<f32>, ${NA}>;
        for (var r = 0; r < ${rounds}; r = r + 1) {
          let q = ph - r * ${R};
          if (ph < ${P} && q >= 0 && q < ${R}) {
            ${each((g) => pairs((qq) => `sh[(q * ${HG} + ${g}) * ${HD} + du * ${EU} + ${2 * qq}] = o${g}_${qq}.x; sh[(q * ${HG} + ${g}) * ${HD} + du * ${EU} + ${2 * qq + 1}] = o${g}_${qq}.y;`))}
          }
          workgroupBarrier();
          let inRound = min(${R}, ${P} - r * ${R});
          for (var a = 0; a < ${NA}; a = a + 1) {
            let i2 = tid + a * ${T};
            if (i2 < ${HG * DP}) {
              for (var qq = 0; qq < inRound; qq = qq + 1) {
                let at = qq * ${HG * HD} + 2 * i2;
                acc[a] = acc[a] + vec2<f32>(sh[at], sh[at + 1]);
              }
            }
          }
          workgroupBarrier();
        }
        for (var a = 0; a < ${NA}; a = a + 1) {
          let i2 = tid + a * ${T};
          if (i2 < ${HG * DP}) {
            let g = i2 / ${DP};
            var l = 0.0;
            for (var q = 0; q < ${P}; q = q + 1) { l = l + sh[${LS} + q * ${HG} + g]; }
            var o = vec2<f32>(0.0);
            if (live && l > 0.0) { o = acc[a] / l; }
            ${write}
          }
        }
        ${padCols}
      }`;
  }
}

export interface SamplerSettings { invT: number; topK: number; topP: number; greedy: boolean; seed: number; step: number }

/** Words per row of the per-row settings input (SamplerProgram.rowSettings). */
const ROW_SETTINGS = 6;

/**
 * One token per row, on the device: greedy (first maximum), or a draw from
 * softmax(logits / T) restricted to the top-k, then the top-p nucleus of what is left, by
 * Gumbel-max with counter-based noise (seed, step, row, token). The top-k and top-p cut-offs
 * are exact thresholds found by a bitwise search over order-preserving keys of the scaled
 * logits (ties at a cut-off are all kept). Output [2 * rows] int32: the tokens, then the
 * bits of each token's log-prob under softmax(logits / T) (T = 1 when greedy).
 * The first pass over a row finds its maximum, the softmax's sum (a running sum rescaled
 * when the maximum moves) and, without top-k and top-p, the Gumbel draw too: plain sampling
 * and greedy read the row's logits once (they read them three and two times before
 * 2026-12-06), vec4 at a time where the vocabulary allows.
 *
 * perRow (the slot decoder's requests, each with its own sampling): the settings come from a
 * second input, ROW_SETTINGS int32 words a row (rowSettings), and the noise of a row depends
 * on its own (seed, step) only, not on where the row sits in the batch, so a request draws the
 * same tokens whichever requests share its steps.
 */
export class SamplerProgram implements GpuProgram {
  variableNames: string[];
  uniforms: string;
  dispatchLayout = { x: [0] };
  workgroupSize: [number, number, number] = [256, 1, 1];
  dispatch: [number, number, number];
  outputShape: number[];
  shaderKey: string;
  variableComponents: number[];
  constructor(private readonly V: number, R: number, private readonly perRow = false) {
    this.outputShape = [2 * R];
    this.dispatch = grid(R);
    this.variableNames = perRow ? ["logits", "rowSettings"] : ["logits"];
    this.variableComponents = perRow ? [this.V4 ? 4 : 1, 1] : [this.V4 ? 4 : 1];
    this.uniforms = perRow ? "nRows : i32," : "nRows : i32, invT : f32, topK : i32, topP : f32, greedy : i32, seed : u32, step : u32,";
    this.shaderKey = `verlSampler_${V}${perRow ? "_rows" : ""}`;
  }
  /** the logits bound as vec4 (the vocabulary a multiple of 4) */
  private get V4(): boolean { return this.V % 4 === 0; }
  /** `stepAdvancing`: the step number advances by one a step when the step is replayed (webgpu_replay.ts). */
  static uniforms(R: number, s: SamplerSettings, stepAdvancing = false): UniformValue[] {
    const step: UniformValue = { type: "uint32", data: [s.step >>> 0] };
    return [
      { type: "int32", data: [R] }, { type: "float32", data: [s.invT] }, { type: "int32", data: [s.topK] },
      { type: "float32", data: [s.topP] }, { type: "int32", data: [s.greedy ? 1 : 0] },
      { type: "uint32", data: [s.seed >>> 0] }, stepAdvancing ? advancing(step) : step,
    ];
  }
  /** The perRow program's input: each row's settings as int32 words (floats and the seed by their bits). */
  static rowSettings(rows: readonly SamplerSettings[]): Int32Array {
    const out = new Int32Array(rows.length * ROW_SETTINGS), f = new Float32Array(1), fi = new Int32Array(f.buffer);
    const bits = (x: number) => { f[0] = x; return fi[0]!; };
    rows.forEach((s, r) => out.set([bits(s.invT), s.topK, bits(s.topP), s.greedy ? 1 : 0, s.seed | 0, s.step | 0], r * ROW_SETTINGS));
    return out;
  }
  getUserCode(): string {
    const V = this.V;
    // every thread runs the same number of iterations over the vocabulary (no loop whose trip
    // count differs between threads comes before a barrier: llvmpipe summed wrongly after one)
    // reductions over the workgroup written out in place (barriers only in the entry function)
    const sum = (arr: string, dst: string, v: string) => `${arr}[tid] = ${v};
        workgroupBarrier();
        for (var s = 128; s > 0; s = s >> 1u) {
          if (tid < s) { ${arr}[tid] = ${arr}[tid] + ${arr}[tid + s]; }
          workgroupBarrier();
        }
        let ${dst} = ${arr}[0];
        workgroupBarrier();`;
    // the largest value, ties to the smallest index
    const argMax = (dst: string, v: string, i: string) => `rf[tid] = ${v};
        ri[tid] = ${i};
        workgroupBarrier();
        for (var s = 128; s > 0; s = s >> 1u) {
          if (tid < s) {
            let ov = rf[tid + s];
            let oi = ri[tid + s];
            if (ov > rf[tid] || (ov == rf[tid] && oi < ri[tid])) { rf[tid] = ov; ri[tid] = oi; }
          }
          workgroupBarrier();
        }
        let ${dst} = ri[0];
        workgroupBarrier();`;
    // a pass over the row: \`body\` sees token i and its scaled logit z, in increasing i for each thread
    const U = this.V4 ? 4 : 1, VU = V / U;
    const each = (body: string) => `for (var k = 0; k < ${Math.ceil(VU / 256)}; k = k + 1) {
          let iu = tid + k * 256;
          if (iu < ${VU}) {
            let zu = logits[base / ${U} + iu] * invT;
            ${Array.from({ length: U }, (_, c) => `{ let i = ${U} * iu + ${c}; let z = zu${U === 4 ? `[${c}]` : ""}; ${body} }`).join("\n            ")}
          }
        }`;
    const logit = (i: string) => (U === 4 ? `logits[(${i}) / 4][(${i}) % 4]` : `logits[${i}]`);
    // the draw of token i with scaled logit z: the larger Gumbel-perturbed logit wins (first on ties)
    const draw = `let u = (f32(verlHash(rs ^ verlHash(u32(i))) >> 8u) + 0.5) / 16777216.0;
              let g = z - log(-log(u));
              if (g > gb) { gb = g; gi = i; }`;
    return `
      var<workgroup> rf : array<f32, 256>;
      var<workgroup> ri : array<i32, 256>;
      var<workgroup> ru : array<u32, 256>;
      var<workgroup> goalShared : f32;
      ${this.perRow ? `var<workgroup> rowShared : array<i32, ${ROW_SETTINGS}>;` : ""}
      fn verlKey(z : f32) -> u32 {
        let b = bitcast<u32>(z);
        if ((b & 0x80000000u) != 0u) { return ~b; }
        return b | 0x80000000u;
      }
      fn verlHash(v : u32) -> u32 {
        let s = v * 747796405u + 2891336453u;
        let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
        return (w >> 22u) ^ w;
      }
      fn main(index : i32) {
        let tid = i32(localIndex);
        let row = index / 256;
        let r = min(row, uniforms.nRows - 1);
        let base = r * ${V};
        ${this.perRow ? `// thread 0 reads the row's settings; workgroupUniformLoad makes the branches below uniform
        if (tid == 0) {
          for (var j = 0; j < ${ROW_SETTINGS}; j = j + 1) { rowShared[j] = rowSettings[r * ${ROW_SETTINGS} + j]; }
        }
        let st = workgroupUniformLoad(&rowShared);
        let invT = bitcast<f32>(st[0]);
        let topK = st[1];
        let topP = bitcast<f32>(st[2]);
        let greedy = st[3];
        let rowSeed = bitcast<u32>(st[4]);
        let stepNo = bitcast<u32>(st[5]);
        let salt = 0u;` : `let invT = uniforms.invT;
        let topK = uniforms.topK;
        let topP = uniforms.topP;
        let greedy = uniforms.greedy;
        let rowSeed = uniforms.seed;
        let stepNo = uniforms.step;
        let salt = u32(r);`}
        // without top-k and top-p the draw is made in the first pass (every token is kept)
        let plain = greedy == 0 && (topK <= 0 || topK >= ${V}) && topP >= 1.0;
        let rs = verlHash(verlHash(rowSeed) ^ verlHash(stepNo * 2654435761u + salt));
        var gb = -3.0e38;
        var gi = ${V};
        var bm = -3.0e38;
        var bi = ${V};
        var se = 0.0;
        ${each(`if (z > bm) { se = se * exp(bm - z) + 1.0; bm = z; bi = i; } else { se = se + exp(z - bm); }
            if (plain) { ${draw} }`)}
        ${argMax("arg", "bm", "bi")}
        let m = ${logit("base + arg")} * invT;
        ${sum("rf", "seAll", "se * exp(bm - m)")}
        let logZ = m + log(seAll);
        var token = arg;
        if (greedy == 0 && !plain) {
          var low = 0u;
          if (topK > 0 && topK < ${V}) {
            var prefix = 0u;
            for (var bit = 31; bit >= 0; bit = bit - 1) {
              let cand = prefix | (1u << u32(bit));
              var cnt = 0u;
              ${each("if (verlKey(z) >= cand) { cnt = cnt + 1u; }")}
              ${sum("ru", "cntAll", "cnt")}
              if (cntAll >= u32(topK)) { prefix = cand; }
            }
            low = prefix;
          }
          if (topP < 1.0) {
            var mass = 0.0;
            ${each("if (verlKey(z) >= low) { mass = mass + exp(z - m); }")}
            ${sum("rf", "massAll", "mass")}
            // kept in workgroup memory: llvmpipe lost a private value live across the barriers below
            if (tid == 0) { goalShared = topP * massAll; }
            var prefix = 0u;
            for (var bit = 31; bit >= 0; bit = bit - 1) {
              let th = max(prefix | (1u << u32(bit)), low);
              var ms = 0.0;
              ${each("if (verlKey(z) >= th) { ms = ms + exp(z - m); }")}
              ${sum("rf", "msAll", "ms")}
              if (msAll >= goalShared) { prefix = prefix | (1u << u32(bit)); }
            }
            low = max(prefix, low);
          }
          ${each(`if (verlKey(z) >= low) { ${draw} }`)}
        }
        if (greedy == 0) {
          ${argMax("drawn", "gb", "gi")}
          token = drawn;
        }
        if (tid == 0 && row < uniforms.nRows) {
          result[row] = token;
          result[uniforms.nRows + row] = bitcast<i32>(${logit("base + token")} * invT - logZ);
        }
      }`;
  }
}
