// Attention as WebAssembly SIMD kernels, generated for one head size and group
// size (the query heads that share a kv head). One call handles the `group`
// heads of one query token over n consecutive keys:
//   forward:  scores = q . k * scale, p = softmax(scores), out = p @ v
//             (optionally also the row max m and sum z, for the backward pass)
//   backward: p recomputed from m and z; dp = dO . v; ds = p (dp - dO . out);
//             dq = ds @ k; dk += ds q; dv += p dO (dk, dv accumulate over queries)
// JS would spend ~50 ns per key and head here; with f32x4, four keys per step and
// the head dimension unrolled it is several times faster.
import { Fn, instantiateKernel, Ty, V } from "./asm.js";
import { expConstants, emitExp, type ExpConstants } from "./exp.js";
import type { WasmMemory } from "./wasm_api.js";

export interface AttentionKernel {
  /**
   * attend(q, k, v, out, scratch, n[, m, z]): byte addresses into the memory;
   * scratch holds group * (n + 4) floats; m and z (with `stats`) receive group floats each.
   */
  attend(q: number, k: number, v: number, out: number, scratch: number, n: number, m?: number, z?: number): void;
}

export interface AttentionBackwardKernel {
  /** backward(q, k, v, dO, out, m, z, dq, dk, dv, scratch, n): scratch holds 2 * group * (n + 4) floats. */
  backward(q: number, k: number, v: number, dO: number, out: number, m: number, z: number, dq: number, dk: number, dv: number, scratch: number, n: number): void;
}

interface Ctx { f: Fn; C: number; G: number; rowBytes: number; s: number; ptr: number; tmp: number; x: number; dot: number; d: number[] }

function context(f: Fn, headDim: number, group: number): Ctx {
  return {
    f, C: headDim / 4, G: group, rowBytes: headDim * 4,
    s: f.local(Ty.i32), ptr: f.local(Ty.i32), tmp: f.local(Ty.v128), x: f.local(Ty.v128), dot: f.local(Ty.f32),
    d: Array.from({ length: 4 }, () => f.local(Ty.v128)),
  };
}

function hsum(f: Fn, v: number): void {
  f.get(v).lane(0).get(v).lane(1).f32Add().get(v).lane(2).get(v).lane(3).f32Add().f32Add();
}

/**
 * For each head g: out[g][s] = (vecs[g] . row_s) * scale for rows row_0.. at `rows` (n of them),
 * into the float arrays at byte addresses in locals base[g]; four rows per step, then one by one.
 * With `max`, also fold the values into the maxima (vector locals mxv[g], then scalar mx[g]).
 */
function emitDots(c: Ctx, vecs: number[][], rows: number, n: number, base: number[], scale: number, max?: { mxv: number[]; mx: number[] }): void {
  const { f, C, G, rowBytes, s, ptr, tmp, x, dot, d } = c;
  let scalev = -1;
  if (scale !== 1) { scalev = f.local(Ty.v128); f.f32(scale).simd(V.f32x4Splat).set(scalev); }
  f.i32(0).set(s).get(rows).set(ptr);
  f.loop(() => {
    f.get(s).i32(4).i32Add().get(n).raw(0x4a).brIf(1); // i32.gt_s: fewer than four rows left
    for (let g = 0; g < G; g++) {
      for (let key = 0; key < 4; key++) {
        for (let j = 0; j < C; j++) {
          f.get(vecs[g]![j]!).get(ptr).vLoad(key * rowBytes + 16 * j).simd(V.f32x4Mul);
          if (j > 0) f.simd(V.f32x4Add);
        }
        f.set(d[key]!);
      }
      // transpose-and-add: [sum d0, sum d1, sum d2, sum d3]
      f.get(d[0]!).get(d[1]!).shuffle32(0, 2, 4, 6).get(d[0]!).get(d[1]!).shuffle32(1, 3, 5, 7).simd(V.f32x4Add).set(tmp);
      f.get(d[2]!).get(d[3]!).shuffle32(0, 2, 4, 6).get(d[2]!).get(d[3]!).shuffle32(1, 3, 5, 7).simd(V.f32x4Add).set(x);
      f.get(tmp).get(x).shuffle32(0, 2, 4, 6).get(tmp).get(x).shuffle32(1, 3, 5, 7).simd(V.f32x4Add);
      if (scale !== 1) f.get(scalev).simd(V.f32x4Mul);
      f.set(x);
      f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().get(x).vStore();
      if (max) f.get(max.mxv[g]!).get(x).simd(V.f32x4Max).set(max.mxv[g]!);
    }
    f.get(s).i32(4).i32Add().set(s).get(ptr).i32(4 * rowBytes).i32Add().set(ptr).br(0);
  });
  f.loop(() => {
    f.get(s).get(n).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) {
      for (let j = 0; j < C; j++) {
        f.get(vecs[g]![j]!).get(ptr).vLoad(16 * j).simd(V.f32x4Mul);
        if (j > 0) f.simd(V.f32x4Add);
      }
      f.set(tmp);
      hsum(f, tmp);
      if (scale !== 1) f.f32(scale).f32Mul();
      f.set(dot);
      f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().get(dot).f32Store();
      if (max) f.get(max.mx[g]!).get(dot).f32Max().set(max.mx[g]!);
    }
    f.get(s).i32(1).i32Add().set(s).get(ptr).i32(rowBytes).i32Add().set(ptr).br(0);
  });
  if (max) for (let g = 0; g < G; g++) for (let l = 0; l < 4; l++) f.get(max.mx[g]!).get(max.mxv[g]!).lane(l).f32Max().set(max.mx[g]!);
}

/** In place over base[g][0, n4): x <- exp(x - shift[g]) * mul[g] (v128 splat locals); optionally sums into sum[g] (f32). */
function emitExpPass(c: Ctx, cst: ExpConstants, base: number[], n4: number, shift: number[], mul: number[] | undefined, sum?: number[]): void {
  const { f, G, ptr, tmp, x } = c;
  const end = f.local(Ty.i32), sumv = f.local(Ty.v128);
  for (let g = 0; g < G; g++) {
    if (sum) f.f32(0).simd(V.f32x4Splat).set(sumv);
    f.get(base[g]!).set(ptr).get(base[g]!).get(n4).i32(2).i32Shl().i32Add().set(end);
    f.loop(() => {
      f.get(ptr).get(end).i32GeS().brIf(1);
      f.get(ptr).vLoad().get(shift[g]!).simd(V.f32x4Sub).set(x);
      emitExp(f, x, tmp, cst);
      if (mul) f.get(x).get(mul[g]!).simd(V.f32x4Mul).set(x);
      f.get(ptr).get(x).vStore();
      if (sum) f.get(sumv).get(x).simd(V.f32x4Add).set(sumv);
      f.get(ptr).i32(16).i32Add().set(ptr).br(0);
    });
    if (sum) { hsum(f, sumv); f.set(sum[g]!); }
  }
}

/** n4 = n rounded up to 4; base[g] = scratch + (first + g) * n4 floats. */
function emitBases(f: Fn, n: number, scratch: number, G: number, first = 0): { n4: number; base: number[] } {
  const n4 = f.local(Ty.i32);
  f.get(n).i32(3).i32Add().i32(-4).raw(0x71).set(n4); // i32.and
  const base = Array.from({ length: G }, (_, g) => {
    const l = f.local(Ty.i32);
    f.get(scratch).get(n4).i32((first + g) * 4).i32Mul().i32Add().set(l);
    return l;
  });
  return { n4, base };
}

/** Fill base[g][n, n4) with `value`. */
function emitPad(c: Ctx, base: number[], n: number, n4: number, value: number): void {
  const { f, G, s } = c;
  f.get(n).set(s);
  f.loop(() => {
    f.get(s).get(n4).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().f32(value).f32Store();
    f.get(s).i32(1).i32Add().set(s).br(0);
  });
}

function loadHeads(f: Fn, addr: number, G: number, C: number, headDim: number): number[][] {
  return Array.from({ length: G }, (_, g) => Array.from({ length: C }, (_, j) => {
    const l = f.local(Ty.v128);
    f.get(addr).vLoad((g * headDim + 4 * j) * 4).set(l);
    return l;
  }));
}

export function buildAttentionKernel(memory: WasmMemory, headDim: number, group: number, scale: number, opts: { stats?: boolean } = {}): AttentionKernel {
  if (headDim % 4 !== 0) throw new Error(`attention kernel: head size ${headDim} is not a multiple of 4`);
  const key = `attend/${headDim}/${group}/${scale}/${opts.stats === true}`;
  return { attend: instantiateKernel<AttentionKernel["attend"]>(memory, key, "attend", () => attendFn(headDim, group, scale, opts)) };
}

function attendFn(headDim: number, group: number, scale: number, opts: { stats?: boolean }): Fn {
  const f = new Fn(Array(opts.stats ? 8 : 6).fill(Ty.i32) as Ty[]);
  const [q, k, v, out, sc, n, mOut, zOut] = [0, 1, 2, 3, 4, 5, 6, 7];
  const c = context(f, headDim, group), { C, G, rowBytes, s, ptr } = c;
  const cst = expConstants(f);
  const { n4, base } = emitBases(f, n, sc, G);
  const qv = loadHeads(f, q, G, C, headDim);
  const mx = Array.from({ length: G }, () => { const l = f.local(Ty.f32); f.f32(-3.4e38).set(l); return l; });
  const mxv = Array.from({ length: G }, () => { const l = f.local(Ty.v128); f.f32(-3.4e38).simd(V.f32x4Splat).set(l); return l; });
  // pass 1: scores and maxima; pad to n4 with a very negative value (its exp is ~1e-38)
  emitDots(c, qv, k, n, base, scale, { mxv, mx });
  emitPad(c, base, n, n4, -1e30);
  // pass 2: exponentials and their sums
  const shift = mx.map((m) => { const l = f.local(Ty.v128); f.get(m).simd(V.f32x4Splat).set(l); return l; });
  const sum = Array.from({ length: G }, () => f.local(Ty.f32));
  emitExpPass(c, cst, base, n4, shift, undefined, sum);
  // pass 3: out = sum_s p_s v_s / sum
  const acc = Array.from({ length: G }, () => Array.from({ length: C }, () => { const l = f.local(Ty.v128); f.f32(0).simd(V.f32x4Splat).set(l); return l; }));
  const pv = f.local(Ty.v128);
  f.i32(0).set(s).get(v).set(ptr);
  f.loop(() => {
    f.get(s).get(n).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) {
      f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().f32Load().simd(V.f32x4Splat).set(pv);
      for (let j = 0; j < C; j++) f.get(acc[g]![j]!).get(pv).get(ptr).vLoad(16 * j).simd(V.f32x4Mul).simd(V.f32x4Add).set(acc[g]![j]!);
    }
    f.get(s).i32(1).i32Add().set(s).get(ptr).i32(rowBytes).i32Add().set(ptr).br(0);
  });
  for (let g = 0; g < G; g++) {
    f.f32(1).get(sum[g]!).f32Div().simd(V.f32x4Splat).set(pv);
    for (let j = 0; j < C; j++) f.get(out).get(acc[g]![j]!).get(pv).simd(V.f32x4Mul).vStore((g * headDim + 4 * j) * 4);
    if (opts.stats) {
      f.get(mOut).get(mx[g]!).f32Store(4 * g);
      f.get(zOut).get(sum[g]!).f32Store(4 * g);
    }
  }
  return f;
}

export function buildAttentionBackwardKernel(memory: WasmMemory, headDim: number, group: number): AttentionBackwardKernel {
  if (headDim % 4 !== 0) throw new Error(`attention kernel: head size ${headDim} is not a multiple of 4`);
  const key = `attend_backward/${headDim}/${group}`;
  return { backward: instantiateKernel<AttentionBackwardKernel["backward"]>(memory, key, "backward", () => backwardFn(headDim, group)) };
}

function backwardFn(headDim: number, group: number): Fn {
  const f = new Fn(Array(12).fill(Ty.i32) as Ty[]);
  const [q, k, v, dO, out, mIn, zIn, dq, dk, dv, sc, n] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
  const c = context(f, headDim, group), { C, G, rowBytes, s, ptr, tmp } = c;
  const cst = expConstants(f);
  const { n4, base: pBase } = emitBases(f, n, sc, G);
  const { base: dpBase } = emitBases(f, n, sc, G, G);
  const qv = loadHeads(f, q, G, C, headDim), gv = loadHeads(f, dO, G, C, headDim);
  // D[g] = dO . out ; shift = m ; mul = 1 / z
  const Dv: number[] = [], shift: number[] = [], inv: number[] = [];
  for (let g = 0; g < G; g++) {
    for (let j = 0; j < C; j++) {
      f.get(gv[g]![j]!).get(out).vLoad((g * headDim + 4 * j) * 4).simd(V.f32x4Mul);
      if (j > 0) f.simd(V.f32x4Add);
    }
    f.set(tmp);
    const D = f.local(Ty.v128);
    hsum(f, tmp);
    f.simd(V.f32x4Splat).set(D);
    Dv.push(D);
    const sh = f.local(Ty.v128), iv = f.local(Ty.v128);
    f.get(mIn).f32Load(4 * g).simd(V.f32x4Splat).set(sh);
    f.f32(1).get(zIn).f32Load(4 * g).f32Div().simd(V.f32x4Splat).set(iv);
    shift.push(sh); inv.push(iv);
  }
  // p = exp(q . k - m) / z (pad p to 0), dp = dO . v
  emitDots(c, qv, k, n, pBase, 1);
  emitPad(c, pBase, n, n4, -1e30);
  emitExpPass(c, cst, pBase, n4, shift, inv);
  emitDots(c, gv, v, n, dpBase, 1);
  // per key: ds = p (dp - D); dq += ds k; dk += sum_g ds q; dv += sum_g p dO
  const acc = Array.from({ length: G }, () => Array.from({ length: C }, () => { const l = f.local(Ty.v128); f.f32(0).simd(V.f32x4Splat).set(l); return l; }));
  const pS = Array.from({ length: G }, () => f.local(Ty.v128)), dsS = Array.from({ length: G }, () => f.local(Ty.v128));
  const kp = f.local(Ty.i32), vp = f.local(Ty.i32);
  f.i32(0).set(s).get(k).set(ptr).get(dk).set(kp).get(dv).set(vp);
  f.loop(() => {
    f.get(s).get(n).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) {
      f.get(pBase[g]!).get(s).i32(2).i32Shl().i32Add().f32Load().simd(V.f32x4Splat).set(pS[g]!);
      f.get(dpBase[g]!).get(s).i32(2).i32Shl().i32Add().f32Load().simd(V.f32x4Splat).get(Dv[g]!).simd(V.f32x4Sub).get(pS[g]!).simd(V.f32x4Mul).set(dsS[g]!);
    }
    for (let j = 0; j < C; j++) {
      for (let g = 0; g < G; g++) f.get(acc[g]![j]!).get(dsS[g]!).get(ptr).vLoad(16 * j).simd(V.f32x4Mul).simd(V.f32x4Add).set(acc[g]![j]!);
      f.get(kp).get(kp).vLoad(16 * j);
      for (let g = 0; g < G; g++) f.get(dsS[g]!).get(qv[g]![j]!).simd(V.f32x4Mul).simd(V.f32x4Add);
      f.vStore(16 * j);
      f.get(vp).get(vp).vLoad(16 * j);
      for (let g = 0; g < G; g++) f.get(pS[g]!).get(gv[g]![j]!).simd(V.f32x4Mul).simd(V.f32x4Add);
      f.vStore(16 * j);
    }
    f.get(s).i32(1).i32Add().set(s);
    for (const p of [ptr, kp, vp]) f.get(p).i32(rowBytes).i32Add().set(p);
    f.br(0);
  });
  for (let g = 0; g < G; g++) for (let j = 0; j < C; j++) f.get(dq).get(acc[g]![j]!).vStore((g * headDim + 4 * j) * 4);
  return f;
}
