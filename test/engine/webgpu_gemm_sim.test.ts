// The tensor-core GEMM kernels' WGSL, as their generators emit it, run on the CPU by the checker in
// wgsl_gemm_sim.ts (issue 23: the staged kernels failed on the H200 under `disable_robustness`).
// For every sweep candidate and every transpose layout it asserts: each storage and workgroup
// index inside the buffer / declared array (and Tint's subgroup-matrix robustness predicate true,
// so robustness never changes a load), no two accesses to a workgroup element by different
// invocations or subgroups between the same barriers with one a write, every padded output element
// written, and the product exact. The checker's own teeth are checked on broken variants.
import { test } from "node:test";
import assert from "node:assert/strict";
import { DEFAULT_DIRECT_TILE, DEFAULT_TILE, THIN_DIRECT_TILE, DirectGemmProgram, SplitKSumProgram, directKernel, directPadding, directSplits, parseSplitKCap, setSplitKCap, stagedKernel, type DirectTile, type GemmShape, type GemmTile, type StagedTile } from "../../src/engine/webgpu_gemm.js";
import { TENSOR_CORE_TILES } from "../../src/engine/webgpu_kernels.js";
import { runFirstStaged, runKernel, type KernelRun } from "./wgsl_gemm_sim.js";

const LAYOUTS = [[false, false], [false, true], [true, false], [true, true]] as const;
const lay = (ta: boolean, tb: boolean) => `${ta ? "T" : "N"}${tb ? "T" : "N"}`;
/** the autotuner's check problem: batch 2 against a broadcast right operand, nothing a multiple of a tile */
const checkProblem = (ta: boolean, tb: boolean): GemmShape => ({ batch: 2, m: 144, n: 200, k: 88, transposeA: ta, transposeB: tb, batchA: 2, batchB: 1 });

function assertClean(r: KernelRun, what: string): void {
  assert.deepEqual(r.errors, [], `${what}: ${r.errors.slice(0, 3).join("; ")}`);
  assert.deepEqual(r.mismatches, [], what);
  assert.equal(r.unwritten, 0, `${what}: output elements never written`);
  assert.ok(r.stats.workgroups > 0 && r.stats.matrixStores > 0, what);
}

/** the null-backend test's small staged tiles (every branch of the generator) */
const SMALL_STAGED: StagedTile[] = [
  { sgM: 2, sgN: 2, tm: 1, tn: 1, kf: 1, buffers: 1, pad: 16 }, { sgM: 2, sgN: 2, tm: 1, tn: 1, kf: 1, buffers: 2, pad: 16 },
  { sgM: 2, sgN: 2, tm: 1, tn: 2, kf: 2, buffers: 2, pad: 8 }, { sgM: 4, sgN: 1, tm: 1, tn: 2, kf: 1, buffers: 2, pad: 16 },
];

test("staged kernels: every sweep tile, four layouts: in bounds, race-free, exact", () => {
  for (const t of TENSOR_CORE_TILES.staged) for (const [ta, tb] of LAYOUTS) {
    assertClean(runKernel(stagedKernel(t), checkProblem(ta, tb)), `staged ${JSON.stringify(t)} ${lay(ta, tb)}`);
  }
  // the small tiles (many workgroups) on a smaller problem of the same kind
  for (const t of SMALL_STAGED) for (const [ta, tb] of [LAYOUTS[0], LAYOUTS[3]]) {
    const s: GemmShape = { batch: 2, m: 40, n: 72, k: 40, transposeA: ta, transposeB: tb, batchA: 2, batchB: 1 };
    assertClean(runKernel(stagedKernel(t), s), `staged ${JSON.stringify(t)} ${lay(ta, tb)}`);
  }
});

test("staged double-buffered kernels: an odd and an even number of K stages, several tiles", () => {
  for (const t of TENSOR_CORE_TILES.staged.filter((x) => x.buffers === 2)) for (const k of [16 * t.kf * 5, 16 * t.kf * 2 - 8]) {
    const s: GemmShape = { batch: 1, m: 200, n: 136, k, transposeA: false, transposeB: true, batchA: 1, batchB: 1 };
    assertClean(runKernel(stagedKernel(t), s), `staged ${JSON.stringify(t)} k ${k}`);
  }
});

test("direct kernels: every sweep tile in two layouts, the default in all four: in bounds, exact", () => {
  for (const t of TENSOR_CORE_TILES.direct) for (const [ta, tb] of t === TENSOR_CORE_TILES.direct[10] ? LAYOUTS : [LAYOUTS[1], LAYOUTS[2]]) {
    assertClean(runKernel(directKernel(t), checkProblem(ta, tb)), `direct ${JSON.stringify(t)} ${lay(ta, tb)}`);
  }
  assert.deepEqual(TENSOR_CORE_TILES.direct[10], DEFAULT_DIRECT_TILE);
  // the thin products' tile (128 x 64), which the trainer takes for LoRA's factors: all four layouts
  for (const [ta, tb] of LAYOUTS) assertClean(runKernel(directKernel(THIN_DIRECT_TILE), checkProblem(ta, tb)), `thin ${lay(ta, tb)}`);
});

test("split-K direct kernels: parts in bounds, every part written, the summed parts exact", () => {
  const small: DirectTile = { sgM: 1, sgN: 1, tm: 1, tn: 1, unroll: 2, prefetch: true, splitK: true };
  const cases: [DirectTile, GemmShape][] = [
    // the default tile: one output tile, K in two parts
    [{ ...DEFAULT_DIRECT_TILE, splitK: true }, { batch: 1, m: 40, n: 72, k: 1100, transposeA: true, transposeB: false, batchA: 1, batchB: 1 }],
    // three parts, the last one partly K padding; a batch of 2 against a broadcast right operand
    [small, { batch: 2, m: 40, n: 72, k: 1600, transposeA: false, transposeB: true, batchA: 2, batchB: 1 }],
    [{ ...small, prefetch: false, unroll: 1 }, { batch: 1, m: 24, n: 20, k: 1060, transposeA: true, transposeB: true, batchA: 1, batchB: 1 }],
    // the thin tile as LoRA's x A^T takes it: a short last part
    [{ ...THIN_DIRECT_TILE, splitK: true }, { batch: 1, m: 200, n: 32, k: 1100, transposeA: false, transposeB: true, batchA: 1, batchB: 1 }],
  ];
  for (const [t, s] of cases) {
    const r = runKernel(directKernel(t), s), what = `split-K ${JSON.stringify(t)} ${JSON.stringify(s)}`;
    assert.ok(r.splits >= 2, `${what}: split (${r.splits})`);
    assertClean(r, what);
  }
  // the split's choice: many tiles or a short K keep one part; VERL_GEMM_SPLIT_K=0 turns it off
  const t: DirectTile = { ...DEFAULT_DIRECT_TILE, splitK: true };
  const lora: GemmShape = { batch: 1, m: 96, n: 896, k: 6144, transposeA: true, transposeB: false, batchA: 1, batchB: 1 };
  assert.equal(directSplits(lora, t), 12); // 7 tiles -> ~256 workgroups, at least 512 of K a part
  assert.equal(directSplits(lora, DEFAULT_DIRECT_TILE), 1);
  assert.equal(directSplits({ ...lora, m: 4096, n: 4096 }, t), 1);
  assert.equal(directSplits({ ...lora, k: 900 }, t), 1);
  // a tile's own targets (the decoder's) replace the trainer's: ~64 workgroups, parts of at least 1,024
  assert.equal(directSplits(lora, { ...t, splitTargets: { workgroups: 64, minChunk: 1024 } }), 6);
  const before = setSplitKCap(1);
  try {
    assert.equal(directSplits(lora, t), 1);
    setSplitKCap(4);
    assert.equal(directSplits(lora, t), 4);
  } finally {
    setSplitKCap(before);
  }
  // the part count follows K (a weight gradient's token count, new every micro-batch): it is a
  // uniform, and K pads as unsplit, so one pipeline serves every count and operands pack alike
  const keyOf = (k: number) => new DirectGemmProgram({ ...lora, k }, t);
  assert.ok(keyOf(6144).splits !== keyOf(2000).splits && keyOf(2000).splits >= 2);
  assert.equal(keyOf(6144).shaderKey, keyOf(2000).shaderKey);
  assert.equal(new SplitKSumProgram(1, 3, 8, 8, 128, 128).shaderKey, new SplitKSumProgram(1, 12, 8, 8, 128, 128).shaderKey);
  for (const k of [1100, 2000, 4864, 6144]) assert.deepEqual(directPadding({ ...lora, k }, t), directPadding({ ...lora, k }, DEFAULT_DIRECT_TILE));
  assert.equal(parseSplitKCap("0"), 1);
  assert.equal(parseSplitKCap(undefined), 64);
  assert.throws(() => parseSplitKCap("x"), /VERL_GEMM_SPLIT_K=x/);
  // the checker sees a part that sums the whole K (every part adds it: the sum is off)
  const s2 = cases[0]![1], r = runKernel(directKernel(cases[0]![0]), s2, (c) => c.replace("let k0 = part * chunk;", "let k0 = 0u * chunk;"));
  assert.ok(r.mismatches.length > 0, "a wrong K range is caught");
});

test("the first staged kernel (GemmProgram): double-buffered and edge tiles in bounds, race-free, exact", () => {
  // its next-stage base was `1u - cur * aSize` (no parentheses): the stage went one half into buffer 0
  // (racing the loads of it) or past the array, the H200's "shifted by one element"
  const tiles: GemmTile[] = [DEFAULT_TILE, { bm: 64, bn: 64, bk: 32, sgM: 2, sgN: 2, buffers: 2 }, { bm: 64, bn: 64, bk: 16, sgM: 2, sgN: 2, buffers: 1 }];
  for (const t of tiles) for (const [ta, tb] of [LAYOUTS[0], LAYOUTS[3]]) for (const packed of [true, false]) {
    const r = runFirstStaged(t, checkProblem(ta, tb), packed);
    assertClean(r, `GemmProgram ${JSON.stringify(t)} ${lay(ta, tb)} ${packed ? "packed" : "f32"}`);
    if (t.buffers === 2) assert.match(r.code, /let aBase = \(1u - cur\) \* \d+u;/);
  }
});

test("the checker catches a missing barrier, a shifted fragment, swapped halves and a short array", () => {
  const b2: StagedTile = { sgM: 2, sgN: 2, tm: 2, tn: 2, kf: 2, buffers: 2, pad: 8 }, b1: StagedTile = { ...b2, buffers: 1 };
  const s = checkProblem(false, false);
  const once = (code: string, from: string | RegExp, to: string) => {
    const out = code.replace(from, to);
    assert.notEqual(out, code, `the edit ${from} applies`);
    return out;
  };
  // double buffering without the barrier that ends a stage: the next stage's stores race the other subgroups' loads
  let r = runKernel(stagedKernel(b2), s, (c) => once(c, /workgroupBarrier\(\);\s*cur = 1u - cur;/, "cur = 1u - cur;"));
  assert.match(r.errors.join("\n"), /race: As\[\d+\] (read|written) by/);
  // single-buffered without the barrier after the products
  r = runKernel(stagedKernel(b1), s, (c) => once(c, /(\n\s*}\n\s*)workgroupBarrier\(\);(\s*}\s*subgroupMatrixStore)/, "$1$2"));
  assert.match(r.errors.join("\n"), /race/);
  // a fragment of A one half to the right: its last column is the row padding, never written
  r = runKernel(stagedKernel(b2), s, (c) => once(c, /kk \* 16u, 40u\)/g, "kk * 16u + 1u, 40u)"));
  assert.match(r.errors.join("\n"), /subgroupMatrixLoad by subgroup \d+: As\[\d+\] read before any write/);
  // the halves of a word stored the other way round: wrong products
  r = runKernel(stagedKernel(b2), s, (c) => once(c, "As[w] = h0.x; As[w + 1u] = h0.y;", "As[w] = h0.y; As[w + 1u] = h0.x;"));
  assert.ok(r.mismatches.length > 0);
  // workgroup memory one tile row short: out of bounds
  r = runKernel(stagedKernel(b2), s, (c) => c.replace(/As : array<f16, (\d+)>/, (_m, n: string) => `As : array<f16, ${Number(n) - 40}>`));
  assert.match(r.errors.join("\n"), /As\[\d+\] outside array<_, \d+>/);
  // a direct kernel whose result rows overrun the padded output (ldc one too large)
  r = runKernel(directKernel({ sgM: 2, sgN: 2, tm: 2, tn: 2, unroll: 1 }), s, (c) => once(c, "let ldc = nP;", "let ldc = nP + 16u;"));
  assert.match(r.errors.join("\n"), /subgroupMatrixStore: result\[\d+\] outside the bound buffer/);
});
