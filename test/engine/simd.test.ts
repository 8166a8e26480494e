import { test } from "node:test";
import assert from "node:assert/strict";
import { simdSupported, assemble, Fn, Ty, V } from "../../src/engine/simd/asm.js";
import { SimdArena } from "../../src/engine/simd/arena.js";
import { wasmApi } from "../../src/engine/simd/wasm_api.js";
import { buildAttentionKernel } from "../../src/engine/simd/attention_kernel.js";
import { buildSwiGluKernel } from "../../src/engine/simd/swiglu_kernel.js";
import { Rng } from "../../src/utils/rng.js";

test("the assembler emits modules the runtime validates; Node 20 has SIMD", () => {
  assert.equal(simdSupported(), true);
  const f = new Fn([Ty.i32, Ty.i32], [Ty.i32]);
  f.get(0).get(1).i32Add();
  assert.ok(wasmApi.validate(assemble({ add: f })));
  const bad = new Fn([], [Ty.i32]);
  bad.f32(1); // an f32 where an i32 result is declared
  assert.equal(wasmApi.validate(assemble({ bad })), false);
  void V;
});

test("the SIMD attention kernel matches a float64 reference (head sizes 4-16, groups 1-4, 1-130 keys)", () => {
  const rng = new Rng(1);
  const arena = SimdArena.create(1 << 16, 8)!;
  const F = new Float32Array(arena.memory.buffer);
  for (const [hd, g, n] of [[8, 2, 1], [8, 2, 3], [8, 2, 4], [8, 2, 130], [16, 1, 33], [4, 4, 5], [12, 3, 9]] as const) {
    const scale = 1 / Math.sqrt(hd), kern = buildAttentionKernel(arena.memory, hd, g, scale);
    const q = 0, k = 1024, v = k + n * hd, out = v + n * hd, sc = out + g * hd + 16;
    for (let i = 0; i < g * hd; i++) F[q + i] = rng.normal();
    for (let i = 0; i < n * hd; i++) { F[k + i] = 2 * rng.normal(); F[v + i] = rng.normal(); }
    kern.attend(4 * q, 4 * k, 4 * v, 4 * out, 4 * sc, n);
    for (let gi = 0; gi < g; gi++) {
      const s = Array.from({ length: n }, (_, j) => { let d = 0; for (let c = 0; c < hd; c++) d += F[q + gi * hd + c]! * F[k + j * hd + c]!; return d * scale; });
      const m = Math.max(...s), e = s.map((x) => Math.exp(x - m)), z = e.reduce((a, b) => a + b, 0);
      for (let c = 0; c < hd; c++) {
        const want = e.reduce((a, p, j) => a + (p / z) * F[v + j * hd + c]!, 0);
        assert.ok(Math.abs(want - F[out + gi * hd + c]!) < 1e-5, `hd ${hd} g ${g} n ${n}: ${want} vs ${F[out + gi * hd + c]}`);
      }
    }
  }
});

test("the SIMD SwiGLU kernel matches silu(gate) * up, including large |gate|", () => {
  const arena = SimdArena.create(1 << 12, 4)!;
  const F = new Float32Array(arena.memory.buffer), W = 12, rows = 3;
  const kern = buildSwiGluKernel(arena.memory, W);
  const gu = 0, h = 256;
  for (let r = 0; r < rows; r++) for (let j = 0; j < 2 * W; j++) F[gu + r * 2 * W + j] = j < W ? (j - 6) * (r + 1) * 7 : (j % 5) - 2;
  kern.swiglu(4 * gu, 4 * h, rows);
  for (let r = 0; r < rows; r++) {
    for (let j = 0; j < W; j++) {
      const g = F[gu + r * 2 * W + j]!, u = F[gu + r * 2 * W + W + j]!, want = (g / (1 + Math.exp(-g))) * u;
      assert.ok(Math.abs(want - F[h + r * W + j]!) <= 1e-6 * Math.max(1, Math.abs(want)), `row ${r} col ${j}: ${want} vs ${F[h + r * W + j]}`);
    }
  }
});
