// Every tensor-core kernel the autotuner may choose compiles, checked on Dawn's null backend
// (shader and pipeline creation without a GPU: it has shader-f16 and subgroup matrices, but no
// subgroup-matrix configs, 16 KiB of workgroup memory, and subgroups of up to 128 lanes, so a
// one-subgroup workgroup fails only its pipeline's size rule there). It cannot run them: the
// H200 bench (bench/gpu_gemm.ts --only sweep) and the autotuner's own check do that.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { checkShape } from "../../src/engine/gemm_autotune.js";

process.env.VERL_DAWN_FLAGS = "backend=null,enable-dawn-features=allow_unsafe_apis";
process.env.VERL_WEBGPU_QUIET = "1";

let skip: string | false = false;
try {
  const { initBackend } = await import("../../src/engine/backend.js");
  await initBackend("webgpu");
} catch (e) {
  skip = `Dawn's null backend is unavailable here: ${(e as Error).message.split("\n")[0]}`;
}

const { TENSOR_CORE_CANDIDATES, stagedCandidate, webGpuErrorCapture } = await import("../../src/engine/webgpu_kernels.js");
type Candidate = (typeof TENSOR_CORE_CANDIDATES)[number];
const SUBGROUP_RULE = /^The x-dimension of workgroup_size \(\d+\) must be a multiple of the device maxSubgroupSize \(\d+\) when the shader uses a subgroup matrix/;

/** Staged tiles small enough for the null device's 16 KiB, so the staged generator's every branch compiles here. */
const SMALL_STAGED = [
  { sgM: 2, sgN: 2, tm: 1, tn: 1, kf: 1, buffers: 1, pad: 16 }, { sgM: 2, sgN: 2, tm: 1, tn: 1, kf: 1, buffers: 2, pad: 16 },
  { sgM: 2, sgN: 2, tm: 1, tn: 2, kf: 2, buffers: 2, pad: 8 }, { sgM: 4, sgN: 1, tm: 1, tn: 2, kf: 1, buffers: 2, pad: 16 }, { sgM: 2, sgN: 2, tm: 2, tn: 2, kf: 2, buffers: 2, pad: 0 },
] as const;

async function compileOutcome(c: Candidate, cls: string): Promise<{ thrown?: string; deviceError?: string | null }> {
  const s = checkShape(cls);
  const a = tf.randomNormal(s.transposeA ? [s.batchA, s.k, s.m] : [s.batchA, s.m, s.k]);
  const b = tf.randomNormal(s.transposeB ? [s.batchB, s.n, s.k] : [s.batchB, s.k, s.n]);
  const cap = webGpuErrorCapture();
  cap.begin();
  let thrown: string | undefined;
  try { c.matMul(a, b, s).dispose(); } catch (e) { thrown = (e as Error).message; }
  const deviceError = await cap.end();
  tf.dispose([a, b]);
  return { thrown, deviceError };
}

test("every autotuner candidate compiles (all four transpose layouts, batch broadcast)", { skip }, async () => {
  const dev = (tf.backend() as unknown as { device: { limits: Record<string, number>; adapterInfo?: { subgroupMaxSize?: number } } }).device;
  const limit = dev.limits.maxComputeWorkgroupStorageSize!;
  let compiled = 0;
  for (const c of [...TENSOR_CORE_CANDIDATES, ...SMALL_STAGED.map((t) => stagedCandidate(t))]) {
    for (const cls of ["NN/large", "NT/large", "TN/small", "TT/small"]) {
      const o = await compileOutcome(c, cls);
      const bytes = c.kernel.workgroupBytes(checkShape(cls)), lanes = 32 * (c.params.sgM as number) * (c.params.sgN as number);
      const what = `${c.name} ${cls}`;
      if (bytes > limit) {
        // refused before a pipeline is made (under skip_validation an oversized one crashes the process)
        assert.match(o.thrown ?? "", new RegExp(`needs ${bytes} bytes of workgroup memory, the device allows ${limit}`), what);
        continue;
      }
      assert.equal(o.thrown, undefined, what);
      if (lanes < 128) {
        // the null device's 128-lane subgroups: this rule fires at pipeline creation, after the shader module was accepted
        assert.match(o.deviceError ?? "", SUBGROUP_RULE, what);
        assert.doesNotMatch(o.deviceError ?? "", /ShaderModule|error:/, what);
        continue;
      }
      assert.equal(o.deviceError, null, what);
      compiled++;
    }
  }
  assert.ok(compiled >= 40, `${compiled} candidate pipelines compiled`);
});

test("a broken shader is caught by the same check", { skip }, async () => {
  const { directCandidate } = await import("../../src/engine/webgpu_kernels.js");
  const { DirectGemmProgram } = await import("../../src/engine/webgpu_gemm.js");
  const t = { sgM: 2, sgN: 2, tm: 2, tn: 2, unroll: 1 } as const;
  const c = directCandidate(t);
  c.kernel.program = (s) => {
    const p = new DirectGemmProgram(s, t), code = p.getUserCode();
    p.shaderKey += "_broken"; // its own pipeline, not the good one from tfjs's cache
    p.getUserCode = () => code.replace("subgroupMatrixMultiplyAccumulate(", "subgroupMatrixMultiplyAccumulateX(");
    return p;
  };
  const o = await compileOutcome(c, "NN/large");
  assert.equal(o.thrown, undefined);
  assert.match(o.deviceError ?? "", /subgroupMatrixMultiplyAccumulateX/);
});

test("split-K products compile: the split kernel in four layouts and the parts' sum", { skip }, async () => {
  const { directCandidate } = await import("../../src/engine/webgpu_kernels.js");
  const { DEFAULT_DIRECT_TILE, THIN_DIRECT_TILE, directSplits } = await import("../../src/engine/webgpu_gemm.js");
  const { webGpuInfo } = await import("../../src/engine/webgpu.js");
  // the thin tile's 64 lanes must be a whole number of subgroups (the null adapter says 128; tensor cores need 32)
  const tiles = (webGpuInfo.subgroupMaxSize ?? 32) <= 64 ? [DEFAULT_DIRECT_TILE, THIN_DIRECT_TILE] : [DEFAULT_DIRECT_TILE];
  for (const tile of tiles) for (const [ta, tb] of [[false, false], [false, true], [true, false], [true, true]] as const) {
    const t = { ...tile, splitK: true }, c = directCandidate(t);
    const s = { batch: 2, m: 40, n: 72, k: 1100, transposeA: ta, transposeB: tb, batchA: 2, batchB: 1 };
    assert.equal(directSplits(s, t), 2);
    const a = tf.randomNormal(ta ? [2, s.k, s.m] : [2, s.m, s.k]), b = tf.randomNormal(tb ? [1, s.n, s.k] : [1, s.k, s.n]);
    const cap = webGpuErrorCapture();
    cap.begin();
    const out = c.matMul(a, b, s);
    assert.deepEqual(out.shape, [2, 40, 72]);
    const err = await cap.end();
    tf.dispose([a, b, out]);
    assert.equal(err, null, `split-K ${tile.sgM}x${tile.sgN} ${ta ? "T" : "N"}${tb ? "T" : "N"}`);
  }
});
