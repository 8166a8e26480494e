// The decoder's producers that write the next product's left operand as padded f16 words
// (RmsNormProgram and SwiGluProgram with `packed`, src/rollout/webgpu_programs.ts): their words
// must equal the f32 program's output packed by PackPadProgram (the pack dispatch they replace),
// bit for bit, padding included. pack2x16float is core WGSL, so any adapter runs this (llvmpipe,
// the H200); without one the test skips with the reason.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { webgpuOrReason } from "../engine/webgpu_adapter.js";
import { PackPadProgram, type Rounding } from "../../src/engine/webgpu_gemm.js";
import { RmsNormProgram, SwiGluProgram, type GpuProgram, type UniformValue } from "../../src/rollout/webgpu_programs.js";

type Runner = { runWebGPUProgram(p: GpuProgram, inputs: tf.TensorInfo[], dtype: string, uniforms: UniformValue[]): tf.TensorInfo };
const run = (p: GpuProgram, inputs: tf.Tensor[], dtype: "float32" | "int32", uniforms: UniformValue[]): tf.Tensor =>
  tf.engine().makeTensorFromTensorInfo((tf.backend() as unknown as Runner).runWebGPUProgram(p, inputs, dtype, uniforms));
const rowsUniform = (n: number): UniformValue[] => [{ type: "int32", data: [n] }];

async function packedOf(y: tf.Tensor, rows: number, cols: number, rowsP: number, colsP: number, rounding: Rounding): Promise<Int32Array> {
  const p = new PackPadProgram(1, rows, cols, rowsP, colsP, rounding);
  const t = run(p, [y], "int32", p.uniformValues());
  const out = (await t.data()) as Int32Array;
  t.dispose();
  return out;
}

for (const rounding of ["f16", "bf16"] as const) {
  test(`RMSNorm and SwiGLU written as packed ${rounding} operands equal the f32 output packed by PackPad`, async (t) => {
    const why = await webgpuOrReason();
    if (why) return t.skip(why);
    const N = 5, D = 90, F = 70, rowsP = 32, colsD = 96, colsF = 80; // odd-sized rows and padding on both sides
    const x = tf.randomNormal([N, D], 0, 3, "float32", 7), w = tf.randomNormal([D], 1, 0.2, "float32", 8), gu = tf.randomNormal([N, 2 * F], 0, 2, "float32", 9);
    try {
      const norm = run(new RmsNormProgram(D, 1e-6, N), [x, w], "float32", rowsUniform(N));
      const normPacked = run(new RmsNormProgram(D, 1e-6, N, { rowsP, colsP: colsD, rounding }), [x, w], "int32", rowsUniform(N));
      assert.deepEqual(Array.from((await normPacked.data()) as Int32Array), Array.from(await packedOf(norm, N, D, rowsP, colsD, rounding)));
      const act = run(new SwiGluProgram(F, N), [gu], "float32", rowsUniform(N));
      const sp = new SwiGluProgram(F, N, { rowsP, colsP: colsF, rounding });
      const actPacked = run(sp, [gu], "int32", sp.uniformValues());
      assert.deepEqual(Array.from((await actPacked.data()) as Int32Array), Array.from(await packedOf(act, N, F, rowsP, colsF, rounding)));
      // the same program (one compiled pipeline) at more rows writes every row: the H200's slot decoder
      // met a bound baked in at the first call's rows
      const N2 = 40, rowsP2 = 64, gu2 = tf.randomNormal([N2, 2 * F], 0, 2, "float32", 10);
      const act2 = run(new SwiGluProgram(F, N2), [gu2], "float32", rowsUniform(N2));
      const sp2 = new SwiGluProgram(F, N2, { rowsP: rowsP2, colsP: colsF, rounding });
      const actPacked2 = run(sp2, [gu2], "int32", sp2.uniformValues());
      assert.deepEqual(Array.from((await actPacked2.data()) as Int32Array), Array.from(await packedOf(act2, N2, F, rowsP2, colsF, rounding)));
      tf.dispose([gu2, act2, actPacked2]);
      // the words hold real values, not zeros alone
      assert.ok(Array.from((await normPacked.data()) as Int32Array).some((v) => v !== 0));
      tf.dispose([norm, normPacked, act, actPacked]);
    } finally {
      tf.dispose([x, w, gu]);
    }
  });
}
