// h = silu(gate) * up = gate * up / (1 + exp(-gate)) over rows laid out
// [gate (F) | up (F)], four lanes at a time (F a multiple of 4).
import { Fn, instantiateKernel, Ty, V } from "./asm.js";
import { expConstants, emitExp } from "./exp.js";
import type { WasmMemory } from "./wasm_api.js";

export interface SwiGluKernel {
  /** swiglu(gu, h, rows): byte addresses; gu holds rows x 2F floats, h receives rows x F. */
  swiglu(gu: number, h: number, rows: number): void;
}

export function buildSwiGluKernel(memory: WasmMemory, F: number): SwiGluKernel {
  if (F % 4 !== 0) throw new Error(`swiglu kernel: width ${F} is not a multiple of 4`);
  return { swiglu: instantiateKernel<SwiGluKernel["swiglu"]>(memory, `swiglu/${F}`, "swiglu", () => swigluFn(F)) };
}

function swigluFn(F: number): Fn {
  const f = new Fn([Ty.i32, Ty.i32, Ty.i32]);
  const [gu, h, rows] = [0, 1, 2];
  const r = f.local(Ty.i32), j = f.local(Ty.i32), g = f.local(Ty.v128), e = f.local(Ty.v128), tmp = f.local(Ty.v128), one = f.local(Ty.v128);
  const cst = expConstants(f);
  f.f32(1).simd(V.f32x4Splat).set(one);
  f.i32(0).set(r);
  f.loop(() => {
    f.get(r).get(rows).i32GeS().brIf(1);
    f.i32(0).set(j);
    f.loop(() => {
      f.get(j).i32(4 * F).i32GeS().brIf(1);
      f.get(gu).get(j).i32Add().vLoad().set(g);
      f.f32(0).simd(V.f32x4Splat).get(g).simd(V.f32x4Sub).set(e);
      emitExp(f, e, tmp, cst);
      // h = g * up / (1 + e)
      f.get(h).get(j).i32Add();
      f.get(g).get(gu).get(j).i32Add().vLoad(4 * F).simd(V.f32x4Mul).get(one).get(e).simd(V.f32x4Add).simd(V.f32x4Div);
      f.vStore();
      f.get(j).i32(16).i32Add().set(j).br(0);
    });
    f.get(gu).i32(8 * F).i32Add().set(gu).get(h).i32(4 * F).i32Add().set(h);
    f.get(r).i32(1).i32Add().set(r).br(0);
  });
  return f;
}
