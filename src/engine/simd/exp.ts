// exp on four f32 lanes for the SIMD kernels: exp(x) = 2^n * 2^f with y = x log2(e),
// n = round(y), |f| <= 1/2, and 2^f from its degree-7 series (relative error
// ~1e-7, float32's own). Inputs are clamped to [-87, 88] so 2^n stays normal.
import { Fn, Ty, V } from "./asm.js";

export interface ExpConstants { log2e: number; lo: number; hi: number; coef: number[]; bias: number }

/** Hoist the constants into locals (emit once, before the loops). */
export function expConstants(f: Fn): ExpConstants {
  const splat = (val: number) => { const l = f.local(Ty.v128); f.f32(val).simd(V.f32x4Splat).set(l); return l; };
  const coef = [1, 2, 3, 4, 5, 6, 7].reduce((c, k) => [...c, c[k - 1]! * Math.LN2 / k], [1]);
  const c = { log2e: splat(Math.LOG2E), lo: splat(-87), hi: splat(88), coef: coef.map(splat), bias: f.local(Ty.v128) };
  f.i32(127).simd(V.i32x4Splat).set(c.bias);
  return c;
}

/** x <- exp(x) in place (a v128 local); tmp is a scratch v128 local. */
export function emitExp(f: Fn, x: number, tmp: number, c: ExpConstants): void {
  f.get(x).get(c.lo).simd(V.f32x4Max).get(c.hi).simd(V.f32x4Min).get(c.log2e).simd(V.f32x4Mul).set(x);
  f.get(x).simd(V.f32x4Nearest).set(tmp);
  f.get(x).get(tmp).simd(V.f32x4Sub).set(x);
  f.get(c.coef[c.coef.length - 1]!);
  for (let i = c.coef.length - 2; i >= 0; i--) f.get(x).simd(V.f32x4Mul).get(c.coef[i]!).simd(V.f32x4Add);
  // 2^n from the exponent bits: (n + 127) << 23
  f.get(tmp).simd(V.i32x4TruncSatF32x4S).get(c.bias).simd(V.i32x4Add).i32(23).simd(V.i32x4Shl);
  f.simd(V.f32x4Mul).set(x);
}
