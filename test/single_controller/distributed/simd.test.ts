// The bridge's WebAssembly SIMD kernels give the JS loops' bits (one IEEE rounding per add and
// divide), on every bit pattern but NaN payloads, at unaligned lengths (the scalar tail) too.
import { test } from "node:test";
import assert from "node:assert/strict";
import { sharedMemory, simdKernels } from "../../../src/single_controller/distributed/simd.js";

function fillBits(a: Float32Array | Float64Array, seed: number): void {
  const u = new Uint32Array(a.buffer, a.byteOffset, (a.length * a.BYTES_PER_ELEMENT) / 4);
  let x = seed >>> 0;
  for (let i = 0; i < u.length; i++) {
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5; // xorshift32
    u[i] = x >>> 0;
  }
  // Values of alike magnitude too, where additions round (random bit patterns are mostly far apart).
  for (let i = 0; i < a.length; i += 3) a[i] = Math.sin(i) * 10 ** ((i % 7) - 3);
}

const same = (x: number, y: number) => Object.is(x, y) || (Number.isNaN(x) && Number.isNaN(y));

for (const f64 of [false, true]) {
  test(`SIMD add and add-divide equal the JS loops (${f64 ? "float64" : "float32"})`, () => {
    const mem = sharedMemory(4 << 20);
    const k = simdKernels(mem);
    const bpe = f64 ? 8 : 4;
    const view = (at: number, len: number) => (f64 ? new Float64Array(mem.buffer, at, len) : new Float32Array(mem.buffer, at, len));
    const n = 10_007, gap = 1 << 17; // src at 1 MiB, clear of dst
    const dst = view(0, n), src = view(gap * 8, n);
    for (const d of [1, 2, 3, 8]) {
      fillBits(dst, 7 + d);
      fillBits(src, 99 + d);
      const sum = f64 ? new Float64Array(n) : new Float32Array(n), quo = sum.slice();
      for (let i = 0; i < n; i++) sum[i] = dst[i]! + src[i]!;
      for (let i = 0; i < n; i++) quo[i] = sum[i]! / d;
      const keep = dst.slice();
      // Odd offset and length: vectors, then a scalar tail.
      (f64 ? k.add64 : k.add32)(bpe, gap * 8 + bpe, n - 2);
      dst[0] = keep[0]! + src[0]!;
      dst[n - 1] = keep[n - 1]! + src[n - 1]!;
      let bad = 0;
      for (let i = 0; i < n; i++) if (!same(dst[i]!, sum[i]!)) bad++;
      assert.equal(bad, 0, `add: ${bad} elements differ (divisor round ${d})`);
      dst.set(keep);
      (f64 ? k.addDiv64 : k.addDiv32)(0, gap * 8, n, d);
      for (let i = 0; i < n; i++) if (!same(dst[i]!, quo[i]!)) bad++;
      assert.equal(bad, 0, `add-divide by ${d}: ${bad} elements differ`);
    }
  });
}
