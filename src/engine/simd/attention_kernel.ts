// Decode-time attention as a WebAssembly SIMD kernel, generated for one head size
// and group size. One call attends the `group` query heads that share a kv head
// over n consecutive cached keys:
//   scores = q . k * scale, p = softmax(scores), out = p @ v
// JS would spend ~50 ns per key and head here; with f32x4 and the loops unrolled
// over the head dimension it is several times faster, and it is what bounds a
// small model's decode step.
import { assemble, Fn, Ty, V } from "./asm.js";
import { expConstants, emitExp } from "./exp.js";
import { wasmApi, type WasmMemory } from "./wasm_api.js";

export interface AttentionKernel {
  /** attend(q, k, v, out, scratch, n): byte addresses into the memory; scratch holds group * (n + 3) floats. */
  attend(q: number, k: number, v: number, out: number, scratch: number, n: number): void;
}

export function buildAttentionKernel(memory: WasmMemory, headDim: number, group: number, scale: number): AttentionKernel {
  if (headDim % 4 !== 0) throw new Error(`attention kernel: head size ${headDim} is not a multiple of 4`);
  const C = headDim / 4, G = group, rowBytes = headDim * 4;
  const f = new Fn([Ty.i32, Ty.i32, Ty.i32, Ty.i32, Ty.i32, Ty.i32]);
  const [q, k, v, out, sc, n] = [0, 1, 2, 3, 4, 5];
  const s = f.local(Ty.i32), ptr = f.local(Ty.i32), end = f.local(Ty.i32), n4 = f.local(Ty.i32);
  const dot = f.local(Ty.f32), x = f.local(Ty.v128), tmp = f.local(Ty.v128), sumv = f.local(Ty.v128), pv = f.local(Ty.v128);
  const qv = Array.from({ length: G }, () => Array.from({ length: C }, () => f.local(Ty.v128)));
  const acc = Array.from({ length: G }, () => Array.from({ length: C }, () => f.local(Ty.v128)));
  const mx = Array.from({ length: G }, () => f.local(Ty.f32));
  const sum = Array.from({ length: G }, () => f.local(Ty.f32));
  const base = Array.from({ length: G }, () => f.local(Ty.i32));
  const splat = (val: number) => { const l = f.local(Ty.v128); f.f32(val).simd(V.f32x4Splat).set(l); return l; };
  const cst = expConstants(f);

  // n4 = n rounded up to 4; base[g] = sc + g * n4 * 4
  f.get(n).i32(3).i32Add().i32(-4).raw(0x71).set(n4); // i32.and
  for (let g = 0; g < G; g++) f.get(sc).get(n4).i32(g * 4).i32Mul().i32Add().set(base[g]!);
  for (let g = 0; g < G; g++) {
    for (let c = 0; c < C; c++) f.get(q).vLoad((g * headDim + 4 * c) * 4).set(qv[g]![c]!);
    f.f32(-3.4e38).set(mx[g]!);
  }

  // pass 1: scores and running maxima, four keys at a time (then the rest one by one)
  const d = Array.from({ length: 4 }, () => f.local(Ty.v128)), mxv = Array.from({ length: G }, () => f.local(Ty.v128));
  for (let g = 0; g < G; g++) f.f32(-3.4e38).simd(V.f32x4Splat).set(mxv[g]!);
  const scalev = splat(scale);
  f.i32(0).set(s).get(k).set(ptr);
  f.loop(() => {
    f.get(s).i32(4).i32Add().get(n).raw(0x4a).brIf(1); // i32.gt_s: fewer than four keys left
    for (let g = 0; g < G; g++) {
      for (let key = 0; key < 4; key++) {
        for (let c = 0; c < C; c++) {
          f.get(qv[g]![c]!).get(ptr).vLoad(key * rowBytes + 16 * c).simd(V.f32x4Mul);
          if (c > 0) f.simd(V.f32x4Add);
        }
        f.set(d[key]!);
      }
      // transpose-and-add: [sum d0, sum d1, sum d2, sum d3]
      f.get(d[0]!).get(d[1]!).shuffle32(0, 2, 4, 6).get(d[0]!).get(d[1]!).shuffle32(1, 3, 5, 7).simd(V.f32x4Add).set(tmp);
      f.get(d[2]!).get(d[3]!).shuffle32(0, 2, 4, 6).get(d[2]!).get(d[3]!).shuffle32(1, 3, 5, 7).simd(V.f32x4Add).set(x);
      f.get(tmp).get(x).shuffle32(0, 2, 4, 6).get(tmp).get(x).shuffle32(1, 3, 5, 7).simd(V.f32x4Add).get(scalev).simd(V.f32x4Mul).set(x);
      f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().get(x).vStore();
      f.get(mxv[g]!).get(x).simd(V.f32x4Max).set(mxv[g]!);
    }
    f.get(s).i32(4).i32Add().set(s).get(ptr).i32(4 * rowBytes).i32Add().set(ptr).br(0);
  });
  f.loop(() => {
    f.get(s).get(n).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) {
      for (let c = 0; c < C; c++) {
        f.get(qv[g]![c]!).get(ptr).vLoad(16 * c).simd(V.f32x4Mul);
        if (c > 0) f.simd(V.f32x4Add);
      }
      f.set(tmp);
      f.get(tmp).lane(0).get(tmp).lane(1).f32Add().get(tmp).lane(2).get(tmp).lane(3).f32Add().f32Add().f32(scale).f32Mul().set(dot);
      f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().get(dot).f32Store();
      f.get(mx[g]!).get(dot).f32Max().set(mx[g]!);
    }
    f.get(s).i32(1).i32Add().set(s).get(ptr).i32(rowBytes).i32Add().set(ptr).br(0);
  });
  for (let g = 0; g < G; g++) {
    for (let l = 0; l < 4; l++) f.get(mx[g]!).get(mxv[g]!).lane(l).f32Max().set(mx[g]!);
  }
  // pad each head's scores to n4 with a very negative value (its exp is ~1e-38)
  f.loop(() => {
    f.get(s).get(n4).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().f32(-1e30).f32Store();
    f.get(s).i32(1).i32Add().set(s).br(0);
  });

  // pass 2: exponentials and sums, four at a time
  for (let g = 0; g < G; g++) {
    f.f32(0).simd(V.f32x4Splat).set(sumv).get(mx[g]!).simd(V.f32x4Splat).set(pv);
    f.get(base[g]!).set(ptr).get(base[g]!).get(n4).i32(2).i32Shl().i32Add().set(end);
    f.loop(() => {
      f.get(ptr).get(end).i32GeS().brIf(1);
      f.get(ptr).vLoad().get(pv).simd(V.f32x4Sub).set(x);
      emitExp(f, x, tmp, cst);
      f.get(ptr).get(x).vStore();
      f.get(sumv).get(x).simd(V.f32x4Add).set(sumv);
      f.get(ptr).i32(16).i32Add().set(ptr).br(0);
    });
    f.get(sumv).lane(0).get(sumv).lane(1).f32Add().get(sumv).lane(2).get(sumv).lane(3).f32Add().f32Add().set(sum[g]!);
  }

  // pass 3: out = sum_s p_s v_s / sum
  for (let g = 0; g < G; g++) for (let c = 0; c < C; c++) f.f32(0).simd(V.f32x4Splat).set(acc[g]![c]!);
  f.i32(0).set(s).get(v).set(ptr);
  f.loop(() => {
    f.get(s).get(n).i32GeS().brIf(1);
    for (let g = 0; g < G; g++) {
      f.get(base[g]!).get(s).i32(2).i32Shl().i32Add().f32Load().simd(V.f32x4Splat).set(pv);
      for (let c = 0; c < C; c++) f.get(acc[g]![c]!).get(pv).get(ptr).vLoad(16 * c).simd(V.f32x4Mul).simd(V.f32x4Add).set(acc[g]![c]!);
    }
    f.get(s).i32(1).i32Add().set(s).get(ptr).i32(rowBytes).i32Add().set(ptr).br(0);
  });
  for (let g = 0; g < G; g++) {
    f.f32(1).get(sum[g]!).f32Div().simd(V.f32x4Splat).set(pv);
    for (let c = 0; c < C; c++) f.get(out).get(acc[g]![c]!).get(pv).simd(V.f32x4Mul).vStore((g * headDim + 4 * c) * 4);
  }

  const inst = new wasmApi.Instance(new wasmApi.Module(assemble({ attend: f })), { env: { memory } });
  return { attend: inst.exports["attend"] as AttentionKernel["attend"] };
}
