// Tensor-core matrix products on WebGPU (issue 23): WGSL with Dawn's experimental subgroup
// matrices (`chromium-experimental-subgroup-matrix`, f16 x f16 -> f32, 16 x 16 x 16, which
// NVIDIA's Vulkan driver runs on the tensor cores). tfjs has no f16 dtype, so the operands stay
// float32 tensors and are rounded to f16 (or to bf16 precision first, then held in f16) inside
// the kernels; the products accumulate in f32 and the result is a float32 tensor.
//
// The kernel the BatchMatMul override runs is the direct one at the end of this file (padded f16
// operands, fragments loaded from storage). The first kernels below stage tiles in workgroup
// memory; on the H200 they were right only single-buffered on whole tiles (docs/gpu.md), so
// only the benchmark runs them.
// Staged kernels, in tfjs-backend-webgpu's program shape (run with backend.runWebGPUProgram):
//   PackF16Program   float32 [n] -> int32 [n / 2], two f16 a word (optionally bf16-rounded first)
//   GemmProgram      C[b] = op(A[b]) op(B[b]), op = optional transpose, batch broadcast, with
//                    operands either float32 (converted while staged) or packed f16 words.
// A workgroup of (sgM x sgN) subgroups (32 lanes on NVIDIA) computes a BM x BN tile of C; each
// subgroup holds (BM / 16 / sgM) x (BN / 16 / sgN) result fragments. Per step of BK along K
// the workgroup stages the A and B tiles in workgroup memory as f16 (double-buffered: the
// next tile's global loads are issued before the current tile's products), and the subgroups
// load their fragments from there. Tiles on the edge of C are stored through workgroup memory
// with bounds checks; inner tiles straight to C.
//
// WGSL requires `enable` directives before any declaration, but tfjs prepends its own
// declarations to the user code: `hoistDirectives` (applied by webgpu.ts to every shader
// module of the device) moves them to the top.
import type { GpuProgram, UniformValue } from "../rollout/webgpu_programs.js";
import { Fragments, fragmentTile, geometryKey } from "./subgroup_fragments.js";

export type Rounding = "f16" | "bf16";

/** The tile shape of one GEMM kernel. */
export interface GemmTile {
  bm: number; bn: number; bk: number;
  /** subgroups along M and N (the workgroup has subgroupSize * sgM * sgN lanes: 32 on NVIDIA) */
  sgM: number; sgN: number;
  /** 2: double-buffered workgroup tiles, 1: single */
  buffers: 1 | 2;
}

/** The staged kernel's tile for the benchmark (single-buffered where it does not fit; see fitTile). */
export const DEFAULT_TILE: GemmTile = { bm: 128, bn: 128, bk: 32, sgM: 2, sgN: 4, buffers: 2 };

export interface GemmShape {
  batch: number; m: number; n: number; k: number;
  transposeA: boolean; transposeB: boolean;
  /** operands' batch sizes (1 = broadcast) */
  batchA: number; batchB: number;
}

/** How the operands are read: float32 words (vw floats a load) or packed f16 (pv halves a load). */
export interface OperandFormat { packed: boolean; width: number }

const PAD = 8; // f16 elements of padding per workgroup-tile row (bank spread, 16-byte alignment)
const MAX_WORKGROUP_BYTES = 49152;

/** The contiguous extent of an operand in memory (its fastest dimension). */
function contiguous(s: GemmShape, which: "a" | "b"): number {
  if (which === "a") return s.transposeA ? s.m : s.k;
  return s.transposeB ? s.k : s.n;
}

/** Widest load each operand allows: packed f16 (8 halves a load) needs a contiguous extent of a multiple of 8. */
export function operandFormat(s: GemmShape, which: "a" | "b", packed: boolean): OperandFormat {
  const c = contiguous(s, which);
  if (packed && c % 8 === 0) return { packed, width: 8 };
  return { packed: false, width: c % 4 === 0 ? 4 : 1 };
}

/** Workgroup memory of a tile (bytes), or the reason it cannot be built. */
export function tileBytes(t: GemmTile, s: Pick<GemmShape, "transposeA" | "transposeB">): number {
  const l = layout(t, s);
  return (t.buffers * (l.aSize + l.bSize) + l.aStride + l.bStride) * 2 + (t.sgM * t.sgN * 256 + 16) * 4 + 16; // + the shared workgroup id
}

/**
 * Workgroup tiles: A as [m][k] (row-major fragments) or [k][m] (column-major), B as [k][n] or
 * [n][k]; each array has one row stride of slack at its end (a fragment load's bounds clamp
 * may count 16 full strides).
 */
function layout(t: GemmTile, s: Pick<GemmShape, "transposeA" | "transposeB">): { aStride: number; aSize: number; bStride: number; bSize: number } {
  const aStride = s.transposeA ? t.bm + PAD : t.bk + PAD, aSize = s.transposeA ? t.bk * aStride : t.bm * aStride;
  const bStride = s.transposeB ? t.bk + PAD : t.bn + PAD, bSize = s.transposeB ? t.bn * bStride : t.bk * bStride;
  return { aStride, aSize, bStride, bSize };
}

/** The tile itself when it fits this product's layout, else its single-buffered version (or an error). */
export function fitTile(t: GemmTile, s: Pick<GemmShape, "transposeA" | "transposeB">): GemmTile {
  if (tileBytes(t, s) <= MAX_WORKGROUP_BYTES || t.buffers === 1) return t;
  return { ...t, buffers: 1 };
}

export function checkTile(t: GemmTile, s: Pick<GemmShape, "transposeA" | "transposeB">): void {
  const tm = t.bm / 16 / t.sgM, tn = t.bn / 16 / t.sgN;
  if (!Number.isInteger(tm) || !Number.isInteger(tn) || tm < 1 || tn < 1) throw new Error(`GEMM tile ${JSON.stringify(t)}: bm/bn must be multiples of 16 * sgM/sgN`);
  if (t.bk % 16 !== 0) throw new Error(`GEMM tile ${JSON.stringify(t)}: bk must be a multiple of 16`);
  const bytes = tileBytes(t, s);
  if (bytes > MAX_WORKGROUP_BYTES) throw new Error(`GEMM tile ${JSON.stringify(t)} needs ${bytes} bytes of workgroup memory (limit ${MAX_WORKGROUP_BYTES})`);
}

const dirRe = /^[ \t]*(enable|requires|diagnostic)\b[^;]*;[ \t]*$/gm;

/** Moves WGSL's global directives (enable/requires/diagnostic) to the top of a shader, once each. */
export function hoistDirectives(code: string): string {
  if (!/\b(enable|requires)\s+[a-z]/.test(code) && !/^\s*diagnostic\s*\(/m.test(code)) return code;
  const found: string[] = [];
  const body = code.replace(dirRe, (line) => {
    const d = line.trim();
    if (!found.includes(d)) found.push(d);
    return "";
  });
  return found.length ? `${found.join("\n")}\n${body}` : code;
}

/** f32 -> f16 (or bf16 precision held in f16) as WGSL. */
function roundExpr(x: string, rounding: Rounding): string {
  return rounding === "bf16" ? `f16(verlBf16(${x}))` : `f16(${x})`;
}
const BF16_FN = `
      fn verlBf16(x : f32) -> f32 {
        let b = bitcast<u32>(x);
        return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
      }`;
/**
 * WGSL for producers that write a product's left operand directly as the direct kernel's padded f16
 * words (saving the pack dispatch): `verlHalfPair(a, b)` is two values as one word, bf16-rounded
 * first where asked, as PackPadProgram writes them.
 */
export function halfPairFn(rounding: Rounding): string {
  const v = (e: string) => (rounding === "bf16" ? `verlBf16(${e})` : e);
  return `${rounding === "bf16" ? BF16_FN : ""}
      fn verlHalfPair(a : f32, b : f32) -> i32 { return bitcast<i32>(pack2x16float(vec2<f32>(${v("a")}, ${v("b")}))); }`;
}
const BF16_VEC4_FN = `
      fn verlBf16v(x : vec4<f32>) -> vec4<f32> {
        return vec4<f32>(verlBf16(x.x), verlBf16(x.y), verlBf16(x.z), verlBf16(x.w));
      }`;

/** float32 [n] (n a multiple of 4) -> int32 [n / 2]: pack2x16float of consecutive pairs (bf16 rounding first when asked). */
export class PackF16Program implements GpuProgram {
  variableNames = ["x"];
  outputShape: number[];
  shaderKey: string;
  dispatchLayout = { x: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number] = [256, 1, 1];
  uniforms = "count : i32,";
  variableComponents = [4];
  outputComponent = 2;
  constructor(private readonly n: number, private readonly rounding: Rounding) {
    // output as vec2<i32> words: one invocation packs 4 floats into 2 words
    if (n % 4 !== 0) throw new Error(`PackF16Program: ${n} elements is not a multiple of 4`);
    this.outputShape = [n / 2];
    const groups = Math.ceil(Math.ceil(n / 4) / 256);
    this.dispatch = [Math.min(groups, 32768), Math.ceil(groups / 32768), 1];
    this.shaderKey = `verlPackF16_${rounding}`;
  }
  static uniforms(n: number): UniformValue[] { return [{ type: "int32", data: [n] }]; }
  getUserCode(): string {
    const r = this.rounding === "bf16";
    return `${r ? BF16_FN + BF16_VEC4_FN : ""}
      fn main(index : i32) {
        let q = index;
        if (q * 4 < uniforms.count) {
          var v = x[q];
          ${r ? "v = verlBf16v(v);" : ""}
          result[q] = vec2<i32>(bitcast<i32>(pack2x16float(v.xy)), bitcast<i32>(pack2x16float(v.zw)));
        }
      }`;
  }
}

/**
 * C = op(A) op(B) on the tensor cores. Inputs: a, b (float32, or int32 words of packed f16
 * when the format says so); output float32 [batch, m, n].
 */
export class GemmProgram implements GpuProgram {
  variableNames = ["a", "b"];
  outputShape: number[];
  shaderKey: string;
  dispatchLayout = { x: [2], y: [1], z: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number];
  uniforms = "dimM : i32, dimN : i32, dimK : i32, strideA : i32, strideB : i32,";
  variableComponents: number[];
  /** the adapter's fragments, as the backend found them when the program was made */
  private readonly fragments = new Fragments();
  constructor(private readonly s: GemmShape, private readonly t: GemmTile, private readonly fa: OperandFormat, private readonly fb: OperandFormat,
    private readonly rounding: Rounding, private readonly uniformityOff = true) {
    checkTile(t, s);
    this.outputShape = [s.batch, s.m, s.n];
    this.workgroupSize = [this.fragments.subgroupSize * t.sgM * t.sgN, 1, 1];
    this.dispatch = [Math.ceil(s.n / t.bn), Math.ceil(s.m / t.bm), s.batch];
    const comp = (f: OperandFormat) => (f.packed ? f.width / 2 : f.width);
    this.variableComponents = [comp(fa), comp(fb)];
    const fmt = (f: OperandFormat) => `${f.packed ? "h" : "f"}${f.width}`;
    this.shaderKey = `verlGemm_${t.bm}_${t.bn}_${t.bk}_${t.sgM}x${t.sgN}_${t.buffers}_${s.transposeA ? "T" : "N"}${s.transposeB ? "T" : "N"}_${fmt(fa)}_${fmt(fb)}_${rounding}${uniformityOff ? "" : "_strict"}${geometryKey(this.fragments.g)}`;
  }

  uniformValues(): UniformValue[] {
    const s = this.s, i = (v: number): UniformValue => ({ type: "int32", data: [v] });
    return [i(s.m), i(s.n), i(s.k), i(s.batchA > 1 ? s.m * s.k : 0), i(s.batchB > 1 ? s.k * s.n : 0)];
  }

  /**
   * WGSL staging one operand's tile into workgroup memory. Logical tile rows x cols along
   * (outer, inner) where inner is contiguous in global memory; `g(o, i)` is the element index
   * in global memory, `w(o, i)` in workgroup memory.
   */
  private stage(name: string, f: OperandFormat, rows: number, cols: number, outerDim: string, innerDim: string,
    outer0: string, inner0: string, ld: string, smem: string, w: (o: string, i: string) => string): { load: string; store: string; regs: string } {
    const lanes = this.workgroupSize[0], per = (rows * cols) / f.width, n = Math.ceil(per / lanes);
    const vecT = f.packed ? (f.width === 8 ? "vec4<i32>" : "i32") : (f.width === 4 ? "vec4<f32>" : "f32");
    const zero = f.packed ? (f.width === 8 ? "vec4<i32>(0)" : "0") : (f.width === 4 ? "vec4<f32>(0.0)" : "0.0");
    const vecsPerRow = cols / f.width;
    let load = "", store = "";
    for (let j = 0; j < n; j++) {
      load += `
        {
          let li = tid + ${j * lanes}u;
          let o = li / ${vecsPerRow}u;
          let iv = (li % ${vecsPerRow}u) * ${f.width}u;
          let go = ${outer0} + o;
          let gi = ${inner0} + iv;
          var v = ${zero};
          if (li < ${per}u && go < u32(${outerDim}) && gi < u32(${innerDim})) { v = ${name}[(${name}Off + go * u32(${ld}) + gi) / ${f.width}u]; }
          r_${name}[${j}] = v;
        }`;
      // the halves of the loaded vector, as f16
      let halves: string[];
      if (f.packed) {
        const words = f.width === 8 ? ["v.x", "v.y", "v.z", "v.w"] : ["v"];
        halves = words.flatMap((wd, q) => [`h${q}.x`, `h${q}.y`]);
        store += `
        {
          let li = tid + ${j * lanes}u;
          if (li < ${per}u) {
            let o = li / ${vecsPerRow}u;
            let iv = (li % ${vecsPerRow}u) * ${f.width}u;
            let v = r_${name}[${j}];
            ${words.map((wd, q) => `let h${q} = bitcast<vec2<f16>>(${wd});`).join(" ")}
            ${halves.map((h, c) => `${smem}[${w("o", `iv + ${c}u`)}] = ${h};`).join("\n            ")}
          }
        }`;
      } else {
        const comps = f.width === 4 ? ["v.x", "v.y", "v.z", "v.w"] : ["v"];
        store += `
        {
          let li = tid + ${j * lanes}u;
          if (li < ${per}u) {
            let o = li / ${vecsPerRow}u;
            let iv = (li % ${vecsPerRow}u) * ${f.width}u;
            let v = r_${name}[${j}];
            ${comps.map((cv, c) => `${smem}[${w("o", `iv + ${c}u`)}] = ${roundExpr(cv, this.rounding)};`).join("\n            ")}
          }
        }`;
      }
    }
    return { load, store, regs: `var r_${name} : array<${vecT}, ${n}>;` };
  }

  getUserCode(): string {
    const { s, t } = this, TM = t.bm / 16 / t.sgM, TN = t.bn / 16 / t.sgN, NSG = t.sgM * t.sgN;
    const { aStride, aSize, bStride, bSize } = layout(t, s);
    const A = s.transposeA
      ? this.stage("a", this.fa, t.bk, t.bm, "uniforms.dimK", "uniforms.dimM", "k0", "m0", "uniforms.dimM", "As", (o, i) => `aBase + ${o} * ${aStride}u + ${i}`)
      : this.stage("a", this.fa, t.bm, t.bk, "uniforms.dimM", "uniforms.dimK", "m0", "k0", "uniforms.dimK", "As", (o, i) => `aBase + ${o} * ${aStride}u + ${i}`);
    const B = s.transposeB
      ? this.stage("b", this.fb, t.bn, t.bk, "uniforms.dimN", "uniforms.dimK", "n0", "k0", "uniforms.dimK", "Bs", (o, i) => `bBase + ${o} * ${bStride}u + ${i}`)
      : this.stage("b", this.fb, t.bk, t.bn, "uniforms.dimK", "uniforms.dimN", "k0", "n0", "uniforms.dimN", "Bs", (o, i) => `bBase + ${o} * ${bStride}u + ${i}`);
    const F = this.fragments, SG = F.subgroupSize;
    // fragment (row block i of the subgroup's tile, k block kk) of A in workgroup memory
    const aFrag = (i: number, kk: string) => s.transposeA
      ? F.load("let", `fa${i}`, "left", "&As", `cur * ${aSize}u + (${kk}) * 16u * ${aStride}u + sgRow + ${i * 16}u`, `${aStride}u`, "col_major")
      : F.load("let", `fa${i}`, "left", "&As", `cur * ${aSize}u + (sgRow + ${i * 16}u) * ${aStride}u + (${kk}) * 16u`, `${aStride}u`, "row_major");
    const bFrag = (j: number, kk: string) => s.transposeB
      ? F.load("let", `fb${j}`, "right", "&Bs", `cur * ${bSize}u + (sgCol + ${j * 16}u) * ${bStride}u + (${kk}) * 16u`, `${bStride}u`, "col_major")
      : F.load("let", `fb${j}`, "right", "&Bs", `cur * ${bSize}u + (${kk}) * 16u * ${bStride}u + sgCol + ${j * 16}u`, `${bStride}u`, "row_major");
    const accs: string[] = [], macs: string[] = [], stores: string[] = [], edge: string[] = [];
    for (let i = 0; i < TM; i++) for (let j = 0; j < TN; j++) accs.push(F.declareResult(`c${i}_${j}`));
    macs.push(...Array.from({ length: TM }, (_, i) => aFrag(i, "kk")));
    macs.push(...Array.from({ length: TN }, (_, j) => bFrag(j, "kk")));
    for (let i = 0; i < TM; i++) for (let j = 0; j < TN; j++) macs.push(F.multiplyAccumulate(`c${i}_${j}`, `fa${i}`, `fb${j}`));
    for (let i = 0; i < TM; i++) for (let j = 0; j < TN; j++) {
      stores.push(F.store("&result", `cBase + (m0 + sgRow + ${i * 16}u) * N + n0 + sgCol + ${j * 16}u`, "N", `c${i}_${j}`));
      edge.push(`
          ${F.store("&Cs", "sg * 256u", "16u", `c${i}_${j}`)}
          workgroupBarrier();
          for (var e = lane; e < 256u; e = e + ${SG}u) {
            let gm = m0 + sgRow + ${i * 16}u + e / 16u;
            let gn = n0 + sgCol + ${j * 16}u + e % 16u;
            if (gm < M && gn < N) { result[cBase + gm * N + gn] = Cs[sg * 256u + e]; }
          }
          workgroupBarrier();`);
    }
    const bufs = t.buffers;
    const next = bufs === 2 ? "1u - cur" : "0u";
    // the buffer index is an expression ("1u - cur"): parenthesised, or the product binds to cur alone
    // (`1u - cur * aSize`: the next stage one half into buffer 0, or past the array; issue 23's shift of 1)
    const aBaseOf = (buf: string) => `(${buf}) * ${aSize}u`, bBaseOf = (buf: string) => `(${buf}) * ${bSize}u`;
    return `
      enable f16;
      enable chromium_experimental_subgroup_matrix;
      ${this.uniformityOff ? "diagnostic(off, chromium.subgroup_matrix_uniformity);" : ""}
      ${this.rounding === "bf16" ? BF16_FN : ""}
      var<workgroup> As : array<f16, ${bufs * aSize + aStride}>;
      var<workgroup> Bs : array<f16, ${bufs * bSize + bStride}>;
      var<workgroup> Cs : array<f32, ${NSG * 256 + 16}>;
      var<workgroup> wgShared : vec3<u32>;
      fn main() {
        let tid = localIndex;
        // tfjs keeps the builtins in private variables, which the uniformity analysis treats
        // as non-uniform: the workgroup id goes through workgroup memory
        if (tid == 0u) { wgShared = workgroupId; }
        let wid = workgroupUniformLoad(&wgShared);
        let sg = tid / ${SG}u;
        let lane = tid % ${SG}u;
        let sgRow = (sg / ${t.sgN}u) * ${TM * 16}u;
        let sgCol = (sg % ${t.sgN}u) * ${TN * 16}u;
        let M = u32(uniforms.dimM);
        let N = u32(uniforms.dimN);
        let K = u32(uniforms.dimK);
        let n0 = wid.x * ${t.bn}u;
        let m0 = wid.y * ${t.bm}u;
        let bz = wid.z;
        let aOff = bz * u32(uniforms.strideA);
        let bOff = bz * u32(uniforms.strideB);
        let cBase = bz * M * N;
        ${A.regs}
        ${B.regs}
        ${accs.join("\n        ")}
        let nk = (K + ${t.bk - 1}u) / ${t.bk}u;
        var k0 = 0u;
        var cur = 0u;
        ${bufs === 2 ? `{
          ${A.load}
          ${B.load}
          let aBase = 0u;
          let bBase = 0u;
          ${A.store}
          ${B.store}
        }
        workgroupBarrier();` : ""}
        for (var kt = 0u; kt < nk; kt = kt + 1u) {
          ${bufs === 2 ? `k0 = (kt + 1u) * ${t.bk}u;
          let more = kt + 1u < nk;
          if (more) {
            ${A.load}
            ${B.load}
          }` : `k0 = kt * ${t.bk}u;
          {
            ${A.load}
            ${B.load}
            let aBase = 0u;
            let bBase = 0u;
            ${A.store}
            ${B.store}
          }
          workgroupBarrier();`}
          for (var kk = 0u; kk < ${t.bk / 16}u; kk = kk + 1u) {
            ${macs.join("\n            ")}
          }
          ${bufs === 2 ? `if (more) {
            let aBase = ${aBaseOf(next)};
            let bBase = ${bBaseOf(next)};
            ${A.store}
            ${B.store}
          }
          workgroupBarrier();
          cur = ${next};` : "workgroupBarrier();"}
        }
        if (m0 + ${t.bm}u <= M && n0 + ${t.bn}u <= N) {
          ${stores.join("\n          ")}
        } else {
          ${edge.join("")}
        }
      }`;
  }
}

/** Floating-point work of a product (2 m n k a batch). */
export function gemmFlops(s: GemmShape): number {
  return 2 * s.batch * s.m * s.n * s.k;
}

// ---- direct kernel: padded f16 operands, fragments loaded straight from storage ----------------
//
// The staged kernel above is right with one workgroup buffer but gave wrong results on the
// H200 wherever a subgroup-matrix load or store touched workgroup memory at a second buffer or
// the edge scratch (docs/gpu.md), and it ran at 17-22 TFLOP/s. This kernel uses no workgroup
// memory: PackPadProgram writes each operand as f16 into a zero-padded copy (rows to the tile,
// columns to 16), so every fragment load is in bounds, and the output is padded the same way
// (sliced back by the caller when the shape is not a multiple).

/** Marks user code whose named inputs are f16 storage (the shader hook rewrites tfjs's declarations). */
export const F16_BINDINGS = "// verl-f16-bindings:";

/** tfjs declares inputs by dtype (array<i32> for packed words): rewrite the marked ones to array<f16>. */
export function rewriteF16Bindings(code: string): string {
  const at = code.indexOf(F16_BINDINGS);
  if (at < 0) return code;
  const names = code.slice(at + F16_BINDINGS.length, code.indexOf("\n", at)).split(",").map((x) => x.trim()).filter(Boolean);
  let out = code;
  for (const n of names) out = out.replace(new RegExp(`(var<storage, read> ${n}\\s*:\\s*)array<.*?>;`), "$1array<f16>;");
  return out;
}

export const roundUp = (x: number, m: number) => Math.ceil(x / m) * m;

/**
 * float32 [batch, rows, cols] -> f16 [batch, rowsP, colsP] zero-padded, as int32 words (two halves
 * a word; colsP even). Rounded to f16, or to bf16 precision first.
 */
export class PackPadProgram implements GpuProgram {
  variableNames = ["x"];
  outputShape: number[];
  shaderKey: string;
  dispatchLayout = { x: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number] = [256, 1, 1];
  uniforms = "rows : i32, cols : i32, rowsP : i32, colsP : i32, words : i32,";
  readonly words: number;
  constructor(private readonly batch: number, private readonly rows: number, private readonly cols: number,
    private readonly rowsP: number, private readonly colsP: number, private readonly rounding: Rounding) {
    if (colsP % 2 !== 0) throw new Error(`PackPadProgram: padded columns ${colsP} must be even`);
    this.words = (batch * rowsP * colsP) / 2;
    this.outputShape = [this.words];
    const groups = Math.ceil(this.words / 256);
    this.dispatch = [Math.min(groups, 32768), Math.ceil(groups / 32768), 1];
    this.shaderKey = `verlPackPad_${rounding}`;
  }
  uniformValues(): UniformValue[] {
    return [this.rows, this.cols, this.rowsP, this.colsP, this.words].map((v) => ({ type: "int32" as const, data: [v] }));
  }
  getUserCode(): string {
    const r = this.rounding === "bf16";
    const v = (e: string) => (r ? `verlBf16(${e})` : e);
    return `${r ? BF16_FN : ""}
      fn verlAt(b : i32, row : i32, col : i32) -> f32 {
        if (row < uniforms.rows && col < uniforms.cols) { return x[(b * uniforms.rows + row) * uniforms.cols + col]; }
        return 0.0;
      }
      fn main(index : i32) {
        if (index < uniforms.words) {
          let e = index * 2;
          let perB = uniforms.rowsP * uniforms.colsP;
          let b = e / perB;
          let rem = e - b * perB;
          let row = rem / uniforms.colsP;
          let col = rem - row * uniforms.colsP;
          result[index] = bitcast<i32>(pack2x16float(vec2<f32>(${v("verlAt(b, row, col)")}, ${v("verlAt(b, row, col + 1)")})));
        }
      }`;
  }
}

/**
 * Direct kernel shape: subgroups per workgroup and fragments per subgroup, K steps unrolled.
 * `prefetch`: the next K step's fragments are loaded (into registers) before this step's
 * products, so loads overlap the tensor cores. `baked`: the padded extents are constants of the
 * shader (one pipeline per shape) instead of uniforms, so the driver sees constant strides that
 * are multiples of 16 (the issue's fast probe had its sizes baked in).
 */
export interface DirectTile {
  sgM: number; sgN: number; tm: number; tn: number; unroll: 1 | 2 | 4; prefetch?: boolean; baked?: boolean; splitK?: boolean;
  /** split-K's targets for this tile's products (absent: the trainer's, setSplitKTargets) */
  splitTargets?: SplitKTargets;
}
/**
 * The kernel a product runs before its class is tuned: 2 x 2 subgroups of 4 x 4 fragments (128 x 128
 * a workgroup), register prefetch, strides baked in; the best of the H200 sweep of 2026-12-04
 * (docs/gpu.md, "Autotuned kernels": 104-112 TFLOP/s at 4096^3 NN, against 33 for the same tile
 * without prefetch and baked strides the day before).
 */
export const DEFAULT_DIRECT_TILE: DirectTile = { sgM: 2, sgN: 2, tm: 4, tn: 4, unroll: 1, prefetch: true, baked: true };

/**
 * The tile of products with a thin side (min(m, n) <= THIN_SIDE: LoRA's factors and their
 * gradients): 2 x 1 subgroups of 4 x 4 fragments, 128 x 64 a workgroup, so a side of 32 or 64 pads
 * to 64, not 128. On an H100, at the 0.5B shape, three of LoRA's backward products of 1-5 ms (dB
 * and dH of gate/up, x A^T of down) took 24-46% less time with it than with the 128 x 128 tile, split
 * or not, and dA of down about the same; the two under 0.4 ms are bound by their dispatches' host
 * time either way (docs/gpu.md, "Split-K for thin products").
 */
export const THIN_DIRECT_TILE: DirectTile = { sgM: 2, sgN: 1, tm: 4, tn: 4, unroll: 1, prefetch: true, baked: true };
export const THIN_SIDE = 96;
export const isThinProduct = (s: GemmShape): boolean => Math.min(s.m, s.n) <= THIN_SIDE;

/**
 * Workgroups a split-K product aims for: about four per streaming multiprocessor on the H100 and
 * H200 (132 each; WebGPU does not say how many an adapter has). The H100 sweep of 256, 512 and
 * 1,024 found 512 best or within 10% for LoRA's products and full fine-tuning's thin weight gradients.
 */
export const SPLIT_K_WORKGROUPS = 512;
/** The least K a split covers (32 steps of 16): shorter splits spend more on the partial sums than they save. */
export const SPLIT_K_MIN_CHUNK = 512;

/** VERL_GEMM_SPLIT_K's value as a cap on the parts: `0` turns split-K off (1 part), a number caps them (unset: 64). */
export function parseSplitKCap(v: string | undefined): number {
  if (v === undefined || v === "") return 64;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`VERL_GEMM_SPLIT_K=${v}: expected 0 (off) or the most splits a product may take`);
  return Math.max(1, n);
}

// read once (directSplits runs several times a product, on every training step), not per call
let splitKCapValue: number | undefined;
function splitKCap(): number {
  return (splitKCapValue ??= parseSplitKCap(process.env.VERL_GEMM_SPLIT_K));
}

/** What split-K aims for: workgroups a product (SPLIT_K_WORKGROUPS) and the least K a part covers (SPLIT_K_MIN_CHUNK). */
export interface SplitKTargets { workgroups: number; minChunk: number }
let splitKTargets: SplitKTargets = { workgroups: SPLIT_K_WORKGROUPS, minChunk: SPLIT_K_MIN_CHUNK };

/** Sets split-K's targets (the benchmark sweeps them); returns the previous ones. */
export function setSplitKTargets(t: SplitKTargets): SplitKTargets {
  if (!(Number.isInteger(t.workgroups) && t.workgroups >= 2 && Number.isInteger(t.minChunk) && t.minChunk >= 16 && t.minChunk % 16 === 0)) {
    throw new Error(`split-K targets: workgroups ${t.workgroups} must be an integer >= 2 and minChunk ${t.minChunk} a multiple of 16`);
  }
  const prev = splitKTargets;
  splitKTargets = { ...t };
  return prev;
}

/** Sets the cap on split-K parts (1: off; undefined: VERL_GEMM_SPLIT_K again); returns the previous one. Benchmarks and tests compare split and unsplit with it. */
export function setSplitKCap(cap: number | undefined): number {
  const prev = splitKCap();
  splitKCapValue = cap === undefined ? undefined : Math.max(1, cap);
  return prev;
}

/**
 * How many parts a direct product's K is cut into (1: not split). A product with few output tiles
 * and a long K, such as a weight gradient g^T x over 6,144 tokens into a LoRA factor of 32 rows,
 * would keep a handful of workgroups busy for the whole K while the rest of the GPU idles; split,
 * each part sums its own K range into a [splits, mP, nP] scratch, and a second pass adds the parts
 * (in a fixed order, so the result is the same bits every time).
 */
export function directSplits(s: GemmShape, t: DirectTile): number {
  return splitPlan(s, t).splits;
}

/** directSplits with the K each part covers: whole K steps, the last part what is left of kP (every part at least one step). */
export function splitPlan(s: GemmShape, t: DirectTile): { splits: number; chunk: number } {
  const step = 16 * t.unroll, kP = roundUp(s.k, step), none = { splits: 1, chunk: kP };
  if (!t.splitK) return none;
  const cap = splitKCap(), { workgroups, minChunk } = t.splitTargets ?? splitKTargets;
  const tiles = Math.ceil(s.m / (16 * t.tm * t.sgM)) * Math.ceil(s.n / (16 * t.tn * t.sgN)) * s.batch;
  if (cap <= 1 || tiles * 2 > workgroups) return none;
  const want = Math.min(Math.ceil(workgroups / tiles), Math.floor(s.k / minChunk), cap);
  if (want < 2) return none;
  // no part of padding alone: the parts are re-counted from the chunk they round to
  const chunk = roundUp(Math.ceil(kP / want), step), splits = Math.ceil(kP / chunk);
  return splits < 2 ? none : { splits, chunk };
}

/**
 * Padded extents of a product for a direct tile. Split or not, K pads to whole K steps only, so an
 * operand packs the same for both (and the part count, which follows the token count, changes no
 * stride baked into the kernel).
 */
export function directPadding(s: GemmShape, t: DirectTile): { mP: number; nP: number; kP: number } {
  return { mP: roundUp(s.m, 16 * t.tm * t.sgM), nP: roundUp(s.n, 16 * t.tn * t.sgN), kP: roundUp(s.k, 16 * t.unroll) };
}

const TC_ENABLES = `
      enable f16;
      enable chromium_experimental_subgroup_matrix;
      diagnostic(off, chromium.subgroup_matrix_uniformity);`;

/** A product kernel on padded f16 operands (PackPadProgram's layout): its padding and its program. */
export interface PaddedGemmKernel {
  padding(s: GemmShape): { mP: number; nP: number; kP: number };
  program(s: GemmShape): GpuProgram & { uniformValues(): UniformValue[] };
  /** workgroup memory the program needs (bytes; 0 for none) */
  workgroupBytes(s: GemmShape): number;
  /** K splits: the program's output is then [batch * splits, mP, nP] partial sums (absent: 1) */
  splits?(s: GemmShape): number;
}

export const directKernel = (t: DirectTile): PaddedGemmKernel => ({
  padding: (s) => directPadding(s, t),
  program: (s) => new DirectGemmProgram(s, t),
  workgroupBytes: () => 16,
  splits: (s) => directSplits(s, t),
});

/** Uniform values of a padded product: extents and per-batch operand strides (0: broadcast). */
function paddedUniforms(s: GemmShape, pad: { mP: number; nP: number; kP: number }): UniformValue[] {
  const { mP, nP, kP } = pad, i = (v: number): UniformValue => ({ type: "int32", data: [v] });
  return [i(mP), i(nP), i(kP), i(s.batchA > 1 ? mP * kP : 0), i(s.batchB > 1 ? kP * nP : 0)];
}

/** WGSL lines reading the padded extents and batch offsets (uniforms). */
function extentLines(): string {
  return `
        let mP = u32(uniforms.mP);
        let nP = u32(uniforms.nP);
        let kP = u32(uniforms.kP);
        let aOff = wid.z * u32(uniforms.strideA);
        let bOff = wid.z * u32(uniforms.strideB);`;
}

/**
 * extentLines for a split-K product: workgroup z is batch * splits + part; the part's K range [k0,
 * kEnd). The part count is a uniform, not a constant: it follows K (the token count of a weight
 * gradient, which changes with every micro-batch), and a constant would compile a pipeline for each.
 */
function splitLines(): string {
  return `
        let mP = u32(uniforms.mP);
        let nP = u32(uniforms.nP);
        let kP = u32(uniforms.kP);
        let splits = u32(uniforms.splits);
        let part = wid.z % splits;
        let aOff = (wid.z / splits) * u32(uniforms.strideA);
        let bOff = (wid.z / splits) * u32(uniforms.strideB);
        let chunk = u32(uniforms.chunk);
        let k0 = part * chunk;
        let kEnd = min(k0 + chunk, kP);`;
}

/**
 * The split-K parts [batch * splits, mP, nP] summed, part 0 first, into the product's [batch, m, n]
 * (the padding's rows and columns dropped in the same pass). With `residual` (a [batch, m, n]
 * input), residual + the sum: a decoder's residual connection in the same pass, one dispatch and
 * one [m, n] round trip fewer a product (also with one part: then it is the crop and the add).
 */
export class SplitKSumProgram implements GpuProgram {
  variableNames: string[];
  outputShape: number[];
  dispatchLayout = { x: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number] = [256, 1, 1];
  uniforms = "m : i32, n : i32, mP : i32, nP : i32, total : i32, splits : i32,";
  // one pipeline for every part count (a uniform, as in the split product)
  shaderKey: string;
  constructor(private readonly batch: number, private readonly splits: number, private readonly m: number, private readonly n: number,
    private readonly mP: number, private readonly nP: number, private readonly residual = false) {
    this.outputShape = [batch, m, n];
    this.variableNames = residual ? ["parts", "residual"] : ["parts"];
    this.shaderKey = residual ? "verlSplitKSumResidual" : "verlSplitKSum";
    const groups = Math.ceil((batch * m * n) / 256);
    this.dispatch = [Math.min(groups, 32768), Math.ceil(groups / 32768), 1];
  }
  uniformValues(): UniformValue[] {
    return [this.m, this.n, this.mP, this.nP, this.batch * this.m * this.n, this.splits].map((v) => ({ type: "int32" as const, data: [v] }));
  }
  getUserCode(): string {
    return `
      fn main(index : i32) {
        if (index < uniforms.total) {
          let perB = uniforms.m * uniforms.n;
          let b = index / perB;
          let rem = index - b * perB;
          let row = rem / uniforms.n;
          let col = rem - row * uniforms.n;
          let plane = uniforms.mP * uniforms.nP;
          var at = b * uniforms.splits * plane + row * uniforms.nP + col;
          var acc = parts[at];
          for (var p = 1; p < uniforms.splits; p++) {
            at = at + plane;
            acc = acc + parts[at];
          }
          result[index] = ${this.residual ? "residual[index] + acc" : "acc"};
        }
      }`;
  }
}

/** Row strides of the padded operands and result in storage: A's, B's, C's. */
function rowStrides(s: GemmShape, pad: { mP: number; nP: number; kP: number }): [number, number, number] {
  return [s.transposeA ? pad.mP : pad.kP, s.transposeB ? pad.kP : pad.nP, pad.nP];
}

/**
 * WGSL lines naming the row strides lda, ldb, ldc: constants when baked (only the strides: the
 * extents that vary between products of one weight, such as the token count, stay uniforms, so a
 * training run compiles one pipeline per weight shape, not per batch), else the uniforms' extents.
 */
function strideLines(s: GemmShape, pad: { mP: number; nP: number; kP: number }, baked: boolean): string {
  if (!baked) return `
        let lda = ${s.transposeA ? "mP" : "kP"};
        let ldb = ${s.transposeB ? "kP" : "nP"};
        let ldc = nP;`;
  const [a, b, c] = rowStrides(s, pad);
  return `
        const lda = ${a}u;
        const ldb = ${b}u;
        const ldc = ${c}u;`;
}

/** The shader key's shape part: transposes, and the strides when they are baked in. */
function keyShape(s: GemmShape, pad: { mP: number; nP: number; kP: number }, baked: boolean): string {
  return `${s.transposeA ? "T" : "N"}${s.transposeB ? "T" : "N"}${baked ? `_ld${rowStrides(s, pad).join("_")}` : ""}`;
}

/** What the direct and staged kernels share: padded operands, one workgroup per output tile of sgM x sgN subgroups of tm x tn fragments. */
abstract class PaddedGemmProgram implements GpuProgram {
  variableNames = ["a", "b"];
  outputShape: number[];
  abstract shaderKey: string;
  dispatchLayout = { x: [2], y: [1], z: [0] };
  dispatch: [number, number, number];
  workgroupSize: [number, number, number];
  uniforms = "mP : i32, nP : i32, kP : i32, strideA : i32, strideB : i32,";
  /** the adapter's fragments, as the backend found them when the program was made */
  protected readonly fragments = new Fragments();
  constructor(protected readonly s: GemmShape, t: { sgM: number; sgN: number; tm: number; tn: number }, readonly pad: { mP: number; nP: number; kP: number },
    readonly split: { splits: number; chunk: number } = { splits: 1, chunk: pad.kP }) {
    const splits = split.splits;
    this.outputShape = [s.batch * splits, pad.mP, pad.nP];
    this.workgroupSize = [this.fragments.subgroupSize * t.sgM * t.sgN, 1, 1];
    this.dispatch = [pad.nP / (16 * t.tn * t.sgN), pad.mP / (16 * t.tm * t.sgM), s.batch * splits];
    if (splits > 1) this.uniforms += " splits : i32, chunk : i32,";
  }
  uniformValues(): UniformValue[] {
    const u = paddedUniforms(this.s, this.pad);
    return this.splits === 1 ? u : [...u, { type: "int32", data: [this.splits] }, { type: "int32", data: [this.split.chunk] }];
  }
  /** K parts summed by SplitKSumProgram (1: not split). */
  get splits(): number { return this.split.splits; }
  abstract getUserCode(): string;
}

/**
 * C[b] (float32 [batch, mP, nP]) = op(A[b]) op(B[b]) from padded f16 operands: A as [mP, kP]
 * (or [kP, mP] transposed), B as [kP, nP] (or [nP, kP]).
 */
export class DirectGemmProgram extends PaddedGemmProgram {
  shaderKey: string;
  private readonly t: DirectTile;
  constructor(s: GemmShape, tile: DirectTile) {
    if (![1, 2, 4].includes(tile.unroll)) throw new Error(`DirectGemmProgram: unroll ${tile.unroll} is not 1, 2 or 4`);
    super(s, fragmentTile(tile), directPadding(s, tile), splitPlan(s, tile));
    const t = (this.t = fragmentTile(tile));
    this.shaderKey = `verlDirectGemm_${t.sgM}x${t.sgN}_${t.tm}x${t.tn}_u${t.unroll}${t.prefetch ? "p" : ""}${this.splits > 1 ? "_split" : ""}_${keyShape(s, this.pad, !!t.baked)}${geometryKey(this.fragments.g)}`;
  }
  getUserCode(): string {
    const { s, t } = this, F = this.fragments;
    const aFrag = (decl: "let" | "var" | "", name: string, i: number, k: string) => s.transposeA
      ? F.load(decl, name, "left", "&a", `aOff + (${k}) * lda + row0 + ${i * 16}u`, "lda", "col_major")
      : F.load(decl, name, "left", "&a", `aOff + (row0 + ${i * 16}u) * lda + ${k}`, "lda", "row_major");
    const bFrag = (decl: "let" | "var" | "", name: string, j: number, k: string) => s.transposeB
      ? F.load(decl, name, "right", "&b", `bOff + (col0 + ${j * 16}u) * ldb + ${k}`, "ldb", "col_major")
      : F.load(decl, name, "right", "&b", `bOff + (${k}) * ldb + col0 + ${j * 16}u`, "ldb", "row_major");
    const acc: string[] = [], store: string[] = [];
    for (let i = 0; i < t.tm; i++) for (let j = 0; j < t.tn; j++) acc.push(F.declareResult(`c${i}_${j}`));
    const kAt = (base: string, u: number) => (u === 0 ? base : `${base} + ${16 * u}u`);
    /** fragment loads of one K step (all unrolled parts) at `base`, as `let`/assignments to names with prefix p */
    const loads = (base: string, p: string, decl: "let" | "var" | "") => {
      const out: string[] = [];
      for (let u = 0; u < t.unroll; u++) {
        for (let i = 0; i < t.tm; i++) out.push(aFrag(decl, `${p}a${u}_${i}`, i, kAt(base, u)));
        for (let j = 0; j < t.tn; j++) out.push(bFrag(decl, `${p}b${u}_${j}`, j, kAt(base, u)));
      }
      return out;
    };
    const macs = (p: string) => {
      const out: string[] = [];
      for (let u = 0; u < t.unroll; u++) for (let i = 0; i < t.tm; i++) for (let j = 0; j < t.tn; j++) out.push(F.multiplyAccumulate(`c${i}_${j}`, `${p}a${u}_${i}`, `${p}b${u}_${j}`));
      return out;
    };
    const step = 16 * t.unroll, split = this.splits > 1;
    // split-K: workgroup z is (batch, part); the part sums K in [k0, kEnd)
    const k0 = split ? "k0" : "0u", kEnd = split ? "kEnd" : "kP";
    let loop: string;
    if (!t.prefetch) {
      loop = `for (var k = ${k0}; k < ${kEnd}; k = k + ${step}u) {
          ${[...loads("k", "", "let"), ...macs("")].join("\n          ")}
        }`;
    } else {
      // registers hold the current step; the next step's loads are issued before its products
      // (the last iteration reloads its own step: kn is clamped, never out of bounds)
      const cur = loads(k0, "", "var"), copy: string[] = [];
      for (let u = 0; u < t.unroll; u++) {
        for (let i = 0; i < t.tm; i++) copy.push(F.copy(`a${u}_${i}`, `na${u}_${i}`));
        for (let j = 0; j < t.tn; j++) copy.push(F.copy(`b${u}_${j}`, `nb${u}_${j}`));
      }
      loop = `${cur.join("\n        ")}
        for (var k = ${k0}; k < ${kEnd}; k = k + ${step}u) {
          let kn = min(k + ${step}u, ${kEnd} - ${step}u);
          ${[...loads("kn", "n", "let"), ...macs(""), ...copy].join("\n          ")}
        }`;
    }
    for (let i = 0; i < t.tm; i++) for (let j = 0; j < t.tn; j++) {
      store.push(F.store("&result", `cOff + (row0 + ${i * 16}u) * ldc + col0 + ${j * 16}u`, "ldc", `c${i}_${j}`));
    }
    return `${TC_ENABLES}
      ${F16_BINDINGS} a,b
      var<workgroup> wgShared : vec3<u32>;
      fn main() {
        let tid = localIndex;
        if (tid == 0u) { wgShared = workgroupId; }
        let wid = workgroupUniformLoad(&wgShared);
        let sg = tid / ${F.subgroupSize}u;${split ? splitLines() : extentLines()}${strideLines(s, this.pad, !!t.baked)}
        let row0 = wid.y * ${16 * t.tm * t.sgM}u + (sg / ${t.sgN}u) * ${16 * t.tm}u;
        let col0 = wid.x * ${16 * t.tn * t.sgN}u + (sg % ${t.sgN}u) * ${16 * t.tn}u;
        let cOff = wid.z * mP * nP;
        ${acc.join("\n        ")}
        ${loop}
        ${store.join("\n        ")}
      }`;
  }
}

// ---- aligned staged kernel: padded f16 operands, tiles in workgroup memory ------------------------
//
// The first staged kernel (GemmProgram above) came back shifted by one element on the H200 with a
// second buffer or through its edge scratch, where workgroup-memory fragment offsets and strides
// were multiples of 8 halves (16 bytes) but not of 16 (the shift was in fact its next-stage base,
// `1u - cur * aSize` for `(1u - cur) * aSize`, found by test/engine/webgpu_gemm_sim.test.ts and
// fixed; not re-measured on the H200). This one keeps every workgroup-memory
// fragment offset and row stride a multiple of `pad` halves (16 by default: 32 bytes), reads the
// padded operands PackPadProgram writes (8 halves a load, no bounds checks, no edge tiles: the
// output is padded), and stores its results straight to storage. `pad: 8` rebuilds the old
// alignment, to tell on the device whether alignment was the cause; `pad: 0` (rows of exactly the
// tile, still multiples of 16) lets 128 x 128 tiles double-buffer in 48 KiB in every layout.

/** Staged tile: sgM x sgN subgroups of tm x tn fragments, kf fragments of K a stage, 1 or 2 buffers. */
export interface StagedTile { sgM: number; sgN: number; tm: number; tn: number; kf: number; buffers: 1 | 2; pad: 0 | 8 | 16 }

export function stagedPadding(s: GemmShape, t: StagedTile): { mP: number; nP: number; kP: number } {
  return { mP: roundUp(s.m, 16 * t.tm * t.sgM), nP: roundUp(s.n, 16 * t.tn * t.sgN), kP: roundUp(s.k, 16 * t.kf) };
}

/** Workgroup layout of the staged tiles: row strides (halves), tile sizes (halves, one buffer). */
export function stagedLayout(t: StagedTile, s: Pick<GemmShape, "transposeA" | "transposeB">): { aStride: number; aSize: number; bStride: number; bSize: number; bytes: number } {
  const bm = 16 * t.tm * t.sgM, bn = 16 * t.tn * t.sgN, bk = 16 * t.kf;
  // transposed A is kept as in memory, [bk][bm]; B transposed as [bn][bk]
  const aStride = (s.transposeA ? bm : bk) + t.pad, aSize = (s.transposeA ? bk : bm) * aStride;
  const bStride = (s.transposeB ? bk : bn) + t.pad, bSize = (s.transposeB ? bn : bk) * bStride;
  return { aStride, aSize, bStride, bSize, bytes: t.buffers * (aSize + bSize) * 2 + 16 };
}

export const stagedKernel = (t: StagedTile): PaddedGemmKernel => ({
  padding: (s) => stagedPadding(s, t),
  program: (s) => new StagedF16GemmProgram(s, t),
  workgroupBytes: (s) => stagedLayout(t, s).bytes,
});

export class StagedF16GemmProgram extends PaddedGemmProgram {
  shaderKey: string;
  // the packed operands as vec4<i32>: 8 halves a load
  variableComponents = [4, 4];
  private readonly t: StagedTile;
  constructor(s: GemmShape, tile: StagedTile) {
    if (![0, 8, 16].includes(tile.pad)) throw new Error(`StagedF16GemmProgram: pad ${tile.pad} is not 0, 8 or 16 halves`);
    super(s, fragmentTile(tile), stagedPadding(s, tile));
    const t = (this.t = fragmentTile(tile));
    this.shaderKey = `verlStagedF16Gemm_${t.sgM}x${t.sgN}_${t.tm}x${t.tn}_k${t.kf}_b${t.buffers}_p${t.pad}_${keyShape(s, this.pad, false)}${geometryKey(this.fragments.g)}`;
  }

  /** Copy of one operand's tile (rows x cols halves, cols contiguous in storage) into workgroup memory through registers. */
  private copy(name: string, rows: number, cols: number, row0: string, col0: string, ld: string, stride: number): { load: string; store: (base: string) => string; regs: string } {
    const lanes = this.workgroupSize[0], vecsPerRow = cols / 8, per = rows * vecsPerRow, n = Math.ceil(per / lanes);
    let load = "", store = "";
    for (let j = 0; j < n; j++) {
      const guard = (j + 1) * lanes > per ? `if (li < ${per}u) ` : "";
      load += `
          { let li = tid + ${j * lanes}u; ${guard}{ r_${name}[${j}] = ${name}[(${name}Off + (${row0} + li / ${vecsPerRow}u) * ${ld} + ${col0} + (li % ${vecsPerRow}u) * 8u) / 8u]; } }`;
      store += `
          { let li = tid + ${j * lanes}u; ${guard}{
            let w = BASE + (li / ${vecsPerRow}u) * ${stride}u + (li % ${vecsPerRow}u) * 8u;
            let v = r_${name}[${j}];
            let h0 = bitcast<vec2<f16>>(v.x); let h1 = bitcast<vec2<f16>>(v.y); let h2 = bitcast<vec2<f16>>(v.z); let h3 = bitcast<vec2<f16>>(v.w);
            ${name === "a" ? "As" : "Bs"}[w] = h0.x; ${name === "a" ? "As" : "Bs"}[w + 1u] = h0.y; ${name === "a" ? "As" : "Bs"}[w + 2u] = h1.x; ${name === "a" ? "As" : "Bs"}[w + 3u] = h1.y;
            ${name === "a" ? "As" : "Bs"}[w + 4u] = h2.x; ${name === "a" ? "As" : "Bs"}[w + 5u] = h2.y; ${name === "a" ? "As" : "Bs"}[w + 6u] = h3.x; ${name === "a" ? "As" : "Bs"}[w + 7u] = h3.y;
          } }`;
    }
    return { load, store: (base) => store.replaceAll("BASE", base), regs: `var r_${name} : array<vec4<i32>, ${n}>;` };
  }

  getUserCode(): string {
    const { s, t } = this, bm = 16 * t.tm * t.sgM, bn = 16 * t.tn * t.sgN, bk = 16 * t.kf;
    const { aStride, aSize, bStride, bSize } = stagedLayout(t, s);
    const A = s.transposeA ? this.copy("a", bk, bm, "k0", "m0", "mP", aStride) : this.copy("a", bm, bk, "m0", "k0", "kP", aStride);
    const B = s.transposeB ? this.copy("b", bn, bk, "n0", "k0", "kP", bStride) : this.copy("b", bk, bn, "k0", "n0", "nP", bStride);
    const F = this.fragments;
    const aFrag = (i: number) => s.transposeA
      ? F.load("let", `fa${i}`, "left", "&As", `cur * ${aSize}u + kk * ${16 * aStride}u + sgRow + ${i * 16}u`, `${aStride}u`, "col_major")
      : F.load("let", `fa${i}`, "left", "&As", `cur * ${aSize}u + (sgRow + ${i * 16}u) * ${aStride}u + kk * 16u`, `${aStride}u`, "row_major");
    const bFrag = (j: number) => s.transposeB
      ? F.load("let", `fb${j}`, "right", "&Bs", `cur * ${bSize}u + (sgCol + ${j * 16}u) * ${bStride}u + kk * 16u`, `${bStride}u`, "col_major")
      : F.load("let", `fb${j}`, "right", "&Bs", `cur * ${bSize}u + kk * ${16 * bStride}u + sgCol + ${j * 16}u`, `${bStride}u`, "row_major");
    const acc: string[] = [], macs: string[] = [], store: string[] = [];
    for (let i = 0; i < t.tm; i++) for (let j = 0; j < t.tn; j++) acc.push(F.declareResult(`c${i}_${j}`));
    for (let i = 0; i < t.tm; i++) macs.push(aFrag(i));
    for (let j = 0; j < t.tn; j++) macs.push(bFrag(j));
    for (let i = 0; i < t.tm; i++) for (let j = 0; j < t.tn; j++) macs.push(F.multiplyAccumulate(`c${i}_${j}`, `fa${i}`, `fb${j}`));
    for (let i = 0; i < t.tm; i++) for (let j = 0; j < t.tn; j++) {
      store.push(F.store("&result", `cOff + (m0 + sgRow + ${i * 16}u) * nP + n0 + sgCol + ${j * 16}u`, "nP", `c${i}_${j}`));
    }
    const compute = `for (var kk = 0u; kk < ${t.kf}u; kk = kk + 1u) {
            ${macs.join("\n            ")}
          }`;
    const body = t.buffers === 1
      ? `for (var k0 = 0u; k0 < kP; k0 = k0 + ${bk}u) {
          ${A.load}${B.load}${A.store("0u")}${B.store("0u")}
          workgroupBarrier();
          let cur = 0u;
          ${compute}
          workgroupBarrier();
        }`
      // double-buffered: the next stage's global loads are issued before this stage's products,
      // stored into the other buffer after them; one barrier a stage
      : `var k0 = 0u;
        ${A.load}${B.load}${A.store("0u")}${B.store("0u")}
        workgroupBarrier();
        var cur = 0u;
        for (var kt = 0u; kt < kP / ${bk}u; kt = kt + 1u) {
          k0 = (kt + 1u) * ${bk}u;
          let more = k0 < kP;
          if (more) {${A.load}${B.load}
          }
          ${compute}
          if (more) {${A.store(`(1u - cur) * ${aSize}u`)}${B.store(`(1u - cur) * ${bSize}u`)}
          }
          workgroupBarrier();
          cur = 1u - cur;
        }`;
    return `${TC_ENABLES}
      var<workgroup> As : array<f16, ${t.buffers * aSize}>;
      var<workgroup> Bs : array<f16, ${t.buffers * bSize}>;
      var<workgroup> wgShared : vec3<u32>;
      fn main() {
        let tid = localIndex;
        if (tid == 0u) { wgShared = workgroupId; }
        let wid = workgroupUniformLoad(&wgShared);
        let sg = tid / ${F.subgroupSize}u;${extentLines()}
        let m0 = wid.y * ${bm}u;
        let n0 = wid.x * ${bn}u;
        let sgRow = (sg / ${t.sgN}u) * ${16 * t.tm}u;
        let sgCol = (sg % ${t.sgN}u) * ${16 * t.tn}u;
        let cOff = wid.z * mP * nP;
        ${A.regs}
        ${B.regs}
        ${acc.join("\n        ")}
        ${body}
        ${store.join("\n        ")}
      }`;
  }
}
