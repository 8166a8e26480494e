// The tensor-core kernels' fragments as the adapter has them.
//
// The GEMM generators (webgpu_gemm.ts) think in 16 x 16 fragments (f16 x f16 -> f32, 16 x 16 x 16:
// NVIDIA's tensor-core shape, subgroups of 32). Adapters whose only f16 -> f32 subgroup-matrix
// shape is 8 x 8 x 8 (Apple's simdgroup matrices, subgroups of 32; Mesa's lavapipe, subgroups of 8)
// get each 16 x 16 fragment as 2 x 2 of theirs and each 16 x 16 x 16 product as eight 8 x 8 x 8
// ones, with the same tiles, padding and operand layouts: one kernel design, and the whole
// tensor-core path testable on a CPU (scripts/lavapipe.sh). This file writes those WGSL statements.

/** The hardware fragment's side and the subgroup size the kernels are laid out for. */
export interface FragmentGeometry { side: 16 | 8; subgroupSize: number }

const NATIVE: FragmentGeometry = { side: 16, subgroupSize: 32 };
let geometry: FragmentGeometry = NATIVE;

export function fragmentGeometry(): FragmentGeometry {
  return geometry;
}

/** Set when the backend is initialised from the adapter's configs (webgpu.ts); tests restore it. */
export function setFragmentGeometry(g: FragmentGeometry): void {
  if ((g.side !== 16 && g.side !== 8) || !Number.isInteger(g.subgroupSize) || g.subgroupSize < 1 || g.subgroupSize > 128) {
    throw new Error(`setFragmentGeometry: side must be 16 or 8 and the subgroup size 1-128, got ${JSON.stringify(g)}`);
  }
  geometry = { side: g.side, subgroupSize: g.subgroupSize };
}

/** The shader-key suffix of a geometry: empty for the native one, so its pipelines keep their keys. */
export function geometryKey(g: FragmentGeometry = geometry): string {
  return g.side === 16 && g.subgroupSize === 32 ? "" : `_f${g.side}s${g.subgroupSize}`;
}

export type FragmentKind = "left" | "right" | "result";
export type Major = "row_major" | "col_major";

/**
 * WGSL statements on logical 16 x 16 fragments. A logical fragment `name` is one variable of the
 * adapter's 16 x 16 type, or four of its 8 x 8 type named `name_PQ` (block row P, block column Q).
 * Offsets and strides are WGSL u32 expressions; element (r, c) of a fragment in memory is at
 * offset + r * stride + c (row_major) or offset + c * stride + r (col_major).
 */
export class Fragments {
  readonly g: FragmentGeometry;
  constructor(g: FragmentGeometry = geometry) {
    this.g = g;
  }

  get subgroupSize(): number {
    return this.g.subgroupSize;
  }

  type(kind: FragmentKind): string {
    const s = this.g.side;
    return kind === "result" ? `subgroup_matrix_result<f32, ${s}, ${s}>` : `subgroup_matrix_${kind}<f16, ${s}, ${s}>`;
  }

  private get split(): boolean {
    return this.g.side === 8;
  }

  /** The 8 x 8 blocks of a logical fragment: name suffix and block position. */
  private blocks(): { sfx: string; p: number; q: number }[] {
    return this.split ? [0, 1].flatMap((p) => [0, 1].map((q) => ({ sfx: `_${p}${q}`, p, q }))) : [{ sfx: "", p: 0, q: 0 }];
  }

  /** Offset of block (p, q) from the fragment's offset. */
  private at(offset: string, stride: string, major: Major, p: number, q: number): string {
    if (p === 0 && q === 0) return offset;
    const [along, across] = major === "row_major" ? [p, q] : [q, p]; // rows advance by the stride in row_major
    const terms = [along ? `${8 * along}u * (${stride})` : "", across ? `${8 * across}u` : ""].filter(Boolean);
    return `${offset} + ${terms.join(" + ")}`;
  }

  /** `var name : result;` (zeroed). */
  declareResult(name: string): string {
    return this.blocks().map((b) => `var ${name}${b.sfx} : ${this.type("result")};`).join(" ");
  }

  /** A left or right fragment loaded from `ptr` (e.g. `&a`), declared with `decl` ("let", "var") or assigned (""). */
  load(decl: "let" | "var" | "", name: string, kind: "left" | "right", ptr: string, offset: string, stride: string, major: Major): string {
    return this.blocks().map((b) =>
      `${decl ? decl + " " : ""}${name}${b.sfx} = subgroupMatrixLoad<${this.type(kind)}, ${major}>(${ptr}, ${this.at(offset, stride, major, b.p, b.q)}, ${stride});`).join(" ");
  }

  /** dst = src, fragment by fragment (register prefetch's hand-over). */
  copy(dst: string, src: string): string {
    return this.blocks().map((b) => `${dst}${b.sfx} = ${src}${b.sfx};`).join(" ");
  }

  /** c += a b: one 16 x 16 x 16 product, or eight 8 x 8 x 8 ones (C_PQ += A_P0 B_0Q + A_P1 B_1Q). */
  multiplyAccumulate(c: string, a: string, b: string): string {
    if (!this.split) return `${c} = subgroupMatrixMultiplyAccumulate(${a}, ${b}, ${c});`;
    const out: string[] = [];
    for (const { sfx, p, q } of this.blocks()) for (const r of [0, 1]) out.push(`${c}${sfx} = subgroupMatrixMultiplyAccumulate(${a}_${p}${r}, ${b}_${r}${q}, ${c}${sfx});`);
    return out.join(" ");
  }

  /** A result fragment stored row-major at `offset` with row stride `stride`. */
  store(ptr: string, offset: string, stride: string, name: string): string {
    return this.blocks().map((b) => `subgroupMatrixStore<row_major>(${ptr}, ${this.at(offset, stride, "row_major", b.p, b.q)}, ${name}${b.sfx}, ${stride});`).join(" ");
  }
}

/** Most invocations a tile's workgroup may have here (WebGPU's default maxComputeInvocationsPerWorkgroup). */
const MAX_INVOCATIONS = 256;

/**
 * The tile a kernel runs with these fragments: the same workgroup tile (so the same padding,
 * dispatch and operand layouts), but where each logical fragment is four emulated ones, twice the
 * subgroups along M and N with half the fragments each, when the workgroup stays within 256
 * invocations. A subgroup then holds as many hardware fragments as on NVIDIA; lavapipe compiles a
 * subgroup of 4 x 4 emulated fragments in about 100 s, of 2 x 2 in about 12 s.
 */
export function fragmentTile<T extends { sgM: number; sgN: number; tm: number; tn: number }>(t: T, g: FragmentGeometry = geometry): T {
  if (g.side === 16 || t.tm % 2 !== 0 || t.tn % 2 !== 0 || 4 * t.sgM * t.sgN * g.subgroupSize > MAX_INVOCATIONS) return t;
  return { ...t, sgM: 2 * t.sgM, sgN: 2 * t.sgN, tm: t.tm / 2, tn: t.tn / 2 };
}
