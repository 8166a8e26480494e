// The tensor-core kernels on adapters whose subgroup matrices are 8 x 8 x 8 (Apple; Mesa's lavapipe,
// which scripts/lavapipe.sh runs on a CPU): each 16 x 16 fragment as four, each 16 x 16 x 16
// product as eight. The kernels' WGSL is run by the CPU checker (wgsl_gemm_sim.ts) with the
// adapter's subgroup size: in bounds, race-free, exact, for the direct, thin, split-K and staged
// kernels; and the native geometry's WGSL is the same text as before the emitter existed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Fragments, fragmentGeometry, fragmentTile, geometryKey, setFragmentGeometry, type FragmentGeometry } from "../../src/engine/subgroup_fragments.js";
import { DEFAULT_DIRECT_TILE, DEFAULT_TILE, THIN_DIRECT_TILE, DirectGemmProgram, directKernel, stagedKernel, type DirectTile, type GemmShape } from "../../src/engine/webgpu_gemm.js";
import { TENSOR_CORE_TILES } from "../../src/engine/webgpu_kernels.js";
import { runFirstStaged, runKernel, type KernelRun } from "./wgsl_gemm_sim.js";

const LAYOUTS = [[false, false], [false, true], [true, false], [true, true]] as const;
const checkProblem = (ta: boolean, tb: boolean): GemmShape => ({ batch: 2, m: 144, n: 200, k: 88, transposeA: ta, transposeB: tb, batchA: 2, batchB: 1 });

function withGeometry<T>(g: FragmentGeometry, fn: () => T): T {
  const before = fragmentGeometry();
  setFragmentGeometry(g);
  try {
    return fn();
  } finally {
    setFragmentGeometry(before);
  }
}

function assertClean(r: KernelRun, what: string): void {
  assert.deepEqual(r.errors, [], `${what}: ${r.errors.slice(0, 3).join("; ")}`);
  assert.deepEqual(r.mismatches, [], what);
  assert.equal(r.unwritten, 0, `${what}: output elements never written`);
  assert.ok(r.stats.matrixStores > 0, what);
}

test("native fragments: one statement a fragment, as the kernels always wrote it; no key suffix", () => {
  const F = new Fragments({ side: 16, subgroupSize: 32 });
  assert.equal(F.load("let", "fa0", "left", "&a", "aOff + k", "lda", "row_major"), "let fa0 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&a, aOff + k, lda);");
  assert.equal(F.multiplyAccumulate("c0_0", "fa0", "fb0"), "c0_0 = subgroupMatrixMultiplyAccumulate(fa0, fb0, c0_0);");
  assert.equal(F.store("&result", "cOff", "ldc", "c0_0"), "subgroupMatrixStore<row_major>(&result, cOff, c0_0, ldc);");
  assert.equal(geometryKey({ side: 16, subgroupSize: 32 }), "");
  assert.deepEqual(fragmentTile(DEFAULT_DIRECT_TILE, { side: 16, subgroupSize: 32 }), DEFAULT_DIRECT_TILE);
});

test("8 x 8 fragments: four blocks a fragment at the right offsets, eight products a 16 x 16 x 16 one", () => {
  const F = new Fragments({ side: 8, subgroupSize: 8 });
  const rowMajor = F.load("let", "fa0", "left", "&a", "o", "ld", "row_major");
  assert.match(rowMajor, /let fa0_00 = subgroupMatrixLoad<subgroup_matrix_left<f16, 8, 8>, row_major>\(&a, o, ld\);/);
  assert.match(rowMajor, /let fa0_01 = [^;]*\(&a, o \+ 8u, ld\);/); // block column 1: 8 elements along the row
  assert.match(rowMajor, /let fa0_10 = [^;]*\(&a, o \+ 8u \* \(ld\), ld\);/); // block row 1: 8 rows down
  const colMajor = F.load("", "fb0", "right", "&b", "o", "ld", "col_major");
  assert.match(colMajor, /fb0_01 = [^;]*col_major>\(&b, o \+ 8u \* \(ld\), ld\);/); // column-major: columns advance by the stride
  assert.match(colMajor, /fb0_10 = [^;]*col_major>\(&b, o \+ 8u, ld\);/);
  assert.equal(F.multiplyAccumulate("c", "a", "b").match(/subgroupMatrixMultiplyAccumulate/g)?.length, 8);
  assert.match(F.multiplyAccumulate("c", "a", "b"), /c_01 = subgroupMatrixMultiplyAccumulate\(a_00, b_01, c_01\); c_01 = subgroupMatrixMultiplyAccumulate\(a_01, b_11, c_01\);/);
  assert.equal(geometryKey({ side: 8, subgroupSize: 8 }), "_f8s8");
  assert.throws(() => setFragmentGeometry({ side: 12 as 8, subgroupSize: 8 }), /side must be 16 or 8/);
});

test("emulated fragments keep the workgroup tile: twice the subgroups, half the fragments, within 256 invocations", () => {
  const lvp = { side: 8, subgroupSize: 8 } as const, apple = { side: 8, subgroupSize: 32 } as const;
  assert.deepEqual(fragmentTile(DEFAULT_DIRECT_TILE, lvp), { ...DEFAULT_DIRECT_TILE, sgM: 4, sgN: 4, tm: 2, tn: 2 });
  assert.deepEqual(fragmentTile(THIN_DIRECT_TILE, lvp), { ...THIN_DIRECT_TILE, sgM: 4, sgN: 2, tm: 2, tn: 2 });
  assert.deepEqual(fragmentTile(DEFAULT_DIRECT_TILE, apple), DEFAULT_DIRECT_TILE); // 16 subgroups of 32 would be 512
  assert.deepEqual(fragmentTile({ sgM: 1, sgN: 1, tm: 1, tn: 1 }, lvp), { sgM: 1, sgN: 1, tm: 1, tn: 1 });
  const s = checkProblem(false, true);
  const native = new DirectGemmProgram(s, DEFAULT_DIRECT_TILE);
  const emulated = withGeometry(lvp, () => new DirectGemmProgram(s, DEFAULT_DIRECT_TILE));
  assert.deepEqual(emulated.dispatch, native.dispatch);
  assert.deepEqual(emulated.pad, native.pad);
  assert.deepEqual(emulated.workgroupSize, [128, 1, 1]);
  assert.notEqual(emulated.shaderKey, native.shaderKey);
});

for (const g of [{ side: 8, subgroupSize: 8 }, { side: 8, subgroupSize: 32 }] as const) {
  const name = `${g.side}x${g.side} fragments, subgroups of ${g.subgroupSize}`;
  test(`${name}: the default, thin and split-K direct kernels in bounds, race-free and exact`, () => withGeometry(g, () => {
    for (const [ta, tb] of LAYOUTS) {
      assertClean(runKernel(directKernel(DEFAULT_DIRECT_TILE), checkProblem(ta, tb)), `default ${ta}${tb}`);
      assertClean(runKernel(directKernel(THIN_DIRECT_TILE), checkProblem(ta, tb)), `thin ${ta}${tb}`);
    }
    const split: DirectTile = { ...THIN_DIRECT_TILE, splitK: true };
    const r = runKernel(directKernel(split), { batch: 1, m: 200, n: 32, k: 1100, transposeA: false, transposeB: true, batchA: 1, batchB: 1 });
    assert.ok(r.splits >= 2);
    assertClean(r, "thin split-K");
    // K unrolled with prefetch and a one-subgroup tile
    assertClean(runKernel(directKernel(TENSOR_CORE_TILES.direct[12]!), checkProblem(true, false)), "unrolled prefetch");
  }));

  test(`${name}: the staged kernels and the first staged kernel in bounds, race-free and exact`, () => withGeometry(g, () => {
    for (const t of TENSOR_CORE_TILES.staged.slice(0, 3)) {
      const s = checkProblem(false, true);
      if (stagedKernel(t).program(s).workgroupSize[0] > 256) continue;
      assertClean(runKernel(stagedKernel(t), s), `staged ${JSON.stringify(t)}`);
    }
    assertClean(runFirstStaged({ ...DEFAULT_TILE, bm: 64, bn: 64, sgM: 2, sgN: 2 }, checkProblem(true, true), true), "GemmProgram");
  }));
}

test("the checker catches an emulated block loaded from the wrong place", () => withGeometry({ side: 8, subgroupSize: 8 }, () => {
  const s = checkProblem(false, false);
  const r = runKernel(directKernel(DEFAULT_DIRECT_TILE), s, (c) => {
    // the prefetched block (row block 0, column block 1) of the second fragment of A, without its column offset
    const out = c.replace(/(let na0_1_01 = subgroupMatrixLoad<[^(]*\(&a, [^,]*?) \+ 8u, lda\)/, "$1, lda)");
    assert.notEqual(out, c, "the edit applies");
    return out;
  });
  assert.ok(r.mismatches.length > 0, "a block of A read at its neighbour's offset gives wrong products");
}));
