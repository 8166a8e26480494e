// The tensor-core kernels' WGSL on NVIDIA's geometry (16 x 16 x 16 fragments, subgroups of 32) is
// the text the H100/H200 runs validated (docs/gpu.md). A change to a generator that alters it must
// be deliberate and measured on a GPU again: this test holds a SHA-256 of every kernel's text
// (each tuner candidate, the trainer's thin and split-K tiles, the first staged kernel) in all four
// layouts, and fails, naming the kernels, when one differs. After a deliberate change, rewrite the
// fixture with VERL_UPDATE_WGSL_FIXTURE=1 and say in the commit which GPU run covers the new text.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fragmentGeometry, setFragmentGeometry } from "../../src/engine/subgroup_fragments.js";
import { DEFAULT_DIRECT_TILE, DEFAULT_TILE, THIN_DIRECT_TILE, GemmProgram, directKernel, fitTile, operandFormat, type GemmShape, type PaddedGemmKernel } from "../../src/engine/webgpu_gemm.js";
import { TENSOR_CORE_CANDIDATES } from "../../src/engine/webgpu_kernels.js";
import { packageRoot } from "../../src/utils/paths.js";

const FIXTURE = join(packageRoot, "test/engine/fixtures/native_wgsl.json");
const LAYOUTS = [[false, false], [false, true], [true, false], [true, true]] as const;
const shape = (ta: boolean, tb: boolean): GemmShape => ({ batch: 2, m: 144, n: 200, k: 88, transposeA: ta, transposeB: tb, batchA: 2, batchB: 1 });
const sha = (code: string) => createHash("sha256").update(code).digest("hex").slice(0, 16);

function nativeTexts(): Record<string, string> {
  const before = fragmentGeometry();
  setFragmentGeometry({ side: 16, subgroupSize: 32 });
  try {
    const kernels: [string, PaddedGemmKernel][] = [
      ...TENSOR_CORE_CANDIDATES.map((c) => [c.name, c.kernel] as [string, PaddedGemmKernel]),
      ["trainer_default", directKernel(DEFAULT_DIRECT_TILE)],
      ["trainer_thin", directKernel(THIN_DIRECT_TILE)],
    ];
    const out: Record<string, string> = {};
    for (const [ta, tb] of LAYOUTS) {
      const layout = `${ta ? "T" : "N"}${tb ? "T" : "N"}`, s = shape(ta, tb);
      for (const [name, k] of kernels) out[`${name}/${layout}`] = sha(k.program(s).getUserCode());
      for (const packed of [false, true]) {
        const t = fitTile(DEFAULT_TILE, s);
        out[`first_staged${packed ? "_packed" : ""}/${layout}`] = sha(new GemmProgram(s, t, operandFormat(s, "a", packed), operandFormat(s, "b", packed), "f16").getUserCode());
      }
    }
    // split-K: LoRA's factor gradient (a long K, a thin output)
    const split = { batch: 1, m: 200, n: 32, k: 1100, transposeA: false, transposeB: true, batchA: 1, batchB: 1 };
    out["trainer_thin_split_k/NT"] = sha(directKernel({ ...THIN_DIRECT_TILE, splitK: true }).program(split).getUserCode());
    return out;
  } finally {
    setFragmentGeometry(before);
  }
}

test("NVIDIA's tensor-core WGSL is the text the GPU runs validated (fixture test/engine/fixtures/native_wgsl.json)", () => {
  const now = nativeTexts();
  if (process.env.VERL_UPDATE_WGSL_FIXTURE === "1") {
    writeFileSync(`${FIXTURE}.tmp`, JSON.stringify(now, null, 1) + "\n");
    renameSync(`${FIXTURE}.tmp`, FIXTURE);
    return;
  }
  const want = JSON.parse(readFileSync(FIXTURE, "utf8")) as Record<string, string>;
  const changed = Object.keys({ ...want, ...now }).filter((k) => want[k] !== now[k]);
  assert.deepEqual(changed, [], `the WGSL of ${changed.length} kernels on NVIDIA's geometry changed (${changed.slice(0, 8).join(", ")}): if deliberate, run them on a GPU and rewrite the fixture with VERL_UPDATE_WGSL_FIXTURE=1`);
});
