// The tensor-core kernel autotuner's selection logic (src/engine/gemm_autotune.ts), on the CPU
// backend: this machine's adapters have no subgroup matrices, so the candidates here are real
// tfjs products (one correct at f16 input precision, some deliberately wrong) and the timer is a
// table. The checks, the shift probe, the pinning and the caching are the production code.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { GemmAutotuner, PRODUCT_CLASSES, parsePin, productClass, type GemmCandidate, type GemmTimer } from "../../src/engine/gemm_autotune.js";
import type { GemmShape } from "../../src/engine/webgpu_gemm.js";

await tf.setBackend("cpu");

/** op(A) op(B) in float32 after rounding the inputs to f16, as the tensor-core kernels do. */
function f16Product(a: tf.Tensor, b: tf.Tensor, s: GemmShape): tf.Tensor {
  return tf.tidy(() => {
    const r = (x: tf.Tensor) => tf.tensor(Float32Array.from(x.dataSync(), (v) => fromHalf(toHalf(v))), x.shape);
    return tf.matMul(r(a) as tf.Tensor3D, r(b) as tf.Tensor3D, s.transposeA, s.transposeB);
  });
}
// f32 <-> f16 rounding (round to nearest even), enough for normal values
function toHalf(v: number): number {
  const f = new Float32Array([v]), u = new Uint32Array(f.buffer)[0]!;
  const sign = (u >>> 16) & 0x8000, exp = ((u >>> 23) & 0xff) - 127 + 15, man = u & 0x7fffff;
  if (exp <= 0) return sign;
  if (exp >= 31) return sign | 0x7c00;
  let h = sign | (exp << 10) | (man >>> 13);
  const rest = man & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++;
  return h;
}
function fromHalf(h: number): number {
  const sign = h & 0x8000 ? -1 : 1, exp = (h >>> 10) & 0x1f, man = h & 0x3ff;
  if (exp === 0) return sign * man * 2 ** -24;
  return sign * (1 + man / 1024) * 2 ** (exp - 15);
}

const correct = (name: string): GemmCandidate => ({ name, params: { kind: "test" }, matMul: f16Product });
/** The right product, every element moved one place along the flat output (the staged kernel's H200 symptom). */
const shifted: GemmCandidate = {
  name: "shifted", params: {},
  matMul: (a, b, s) => tf.tidy(() => {
    const c = f16Product(a, b, s), flat = c.reshape([-1]);
    return tf.concat([flat.slice(1), flat.slice(0, 1)]).reshape(c.shape);
  }),
};
/** Within 1% of the right product: wrong for a 16-bit product (3e-4). */
const noisy: GemmCandidate = { name: "noisy", params: {}, matMul: (a, b, s) => tf.tidy(() => { const c = f16Product(a, b, s); return tf.add(c, tf.mul(tf.randomNormal(c.shape, 0, 1, "float32", 3), tf.mul(tf.norm(c), 0.01 / Math.sqrt(c.size)))); }) };
const throwing: GemmCandidate = { name: "throwing", params: {}, matMul: () => { throw new Error("pipeline creation failed on purpose"); } };
const nan: GemmCandidate = { name: "nan", params: {}, matMul: (a, b, s) => tf.tidy(() => tf.mul(f16Product(a, b, s), tf.scalar(NaN))) };

/** Fake timer: ms by candidate name; records whom it timed and runs the product once, as a real timer would. */
function tableTimer(ms: Record<string, number>): GemmTimer & { timed: string[] } {
  const timed: string[] = [];
  const t: GemmTimer = async (c, run) => { timed.push(c.name); run(); return ms[c.name]!; };
  return Object.assign(t, { timed });
}
const reference = (a: tf.Tensor, b: tf.Tensor, s: GemmShape) => tf.matMul(a as tf.Tensor3D, b as tf.Tensor3D, s.transposeA, s.transposeB);
const smallTime = (cls: string): GemmShape => ({ batch: 1, m: 32, n: 48, k: 16, transposeA: cls[0] === "T", transposeB: cls[1] === "T", batchA: 1, batchB: 1 });
const quiet = { info() {}, warn() {} };

test("product classes: transposes and a size bucket", () => {
  assert.equal(productClass({ m: 6144, n: 4864, transposeA: false, transposeB: true }), "NT/large");
  assert.equal(productClass({ m: 512, n: 151936, transposeA: false, transposeB: true }), "NT/small");
  assert.equal(productClass({ m: 4864, n: 896, transposeA: true, transposeB: false }), "TN/small");
  assert.equal(PRODUCT_CLASSES.length, 8);
});

test("wrong, failing and non-finite candidates are skipped with their reasons; the fastest correct one is chosen", async () => {
  const timer = tableTimer({ shifted: 0.1, noisy: 0.2, throwing: 0.1, nan: 0.1, slow: 5, fast: 2 });
  const warnings: object[] = [];
  const t = new GemmAutotuner([shifted, noisy, throwing, nan, correct("slow"), correct("fast")], {
    timer, reference, timeShape: smallTime, log: { info() {}, warn: (o: object) => { warnings.push(o); } },
  });
  for (const cls of ["NN/large", "NT/small", "TN/large", "TT/small"]) {
    const ch = await t.tune(cls);
    assert.equal(ch.candidate?.name, "fast", cls);
    const r = Object.fromEntries(ch.reports.map((x) => [x.name, x]));
    assert.equal(r.shifted!.ok, false);
    assert.match(r.shifted!.reason!, /relative error .* above 0\.002/);
    assert.equal(r.shifted!.shift, 1, "the shift probe names the one-element shift");
    assert.equal(r.noisy!.ok, false);
    assert.equal(r.throwing!.ok, false);
    assert.match(r.throwing!.reason!, /failed to run: pipeline creation failed on purpose/);
    assert.equal(r.nan!.ok, false);
    assert.ok(r.slow!.ok && r.fast!.ok && r.fast!.relErr! < 1e-3 && r.fast!.relErr! > 0, `f16 rounding error ${r.fast!.relErr}`);
    assert.equal(r.fast!.ms, 2);
  }
  // only correct candidates are ever timed
  assert.deepEqual([...new Set(timer.timed)].sort(), ["fast", "slow"]);
  assert.equal(warnings.length, 4 * 4);
});

test("a choice is made once per class: cached, and concurrent asks share one tuning", async () => {
  const timer = tableTimer({ a: 1, b: 2 });
  const t = new GemmAutotuner([correct("a"), correct("b")], { timer, reference, timeShape: smallTime, log: quiet });
  const [x, y] = await Promise.all([t.tune("NT/large"), t.tune("NT/large")]);
  assert.equal(x, y);
  assert.equal(await t.tune("NT/large"), x);
  assert.equal(t.chosen("NT/large"), x);
  assert.equal(t.chosen("NN/large"), undefined);
  assert.equal(timer.timed.length, 2);
});

test("the chosen kernel gives the same result every time (deterministic given the choice)", async () => {
  const t = new GemmAutotuner([correct("a")], { timer: tableTimer({ a: 1 }), reference, timeShape: smallTime, log: quiet });
  const c = (await t.tune("NN/small")).candidate!;
  const s: GemmShape = { batch: 1, m: 20, n: 30, k: 40, transposeA: false, transposeB: false, batchA: 1, batchB: 1 };
  const a = tf.randomNormal([1, 20, 40], 0, 1, "float32", 1), b = tf.randomNormal([1, 40, 30], 0, 1, "float32", 2);
  const r1 = c.matMul(a, b, s), r2 = c.matMul(a, b, s);
  assert.deepEqual(await r1.data(), await r2.data());
  tf.dispose([a, b, r1, r2]);
});

test("no correct candidate: the class stays on tfjs's float32 kernel", async () => {
  const timer = tableTimer({});
  const t = new GemmAutotuner([shifted, throwing], { timer, reference, timeShape: smallTime, log: quiet });
  const ch = await t.tune("NN/large");
  assert.equal(ch.candidate, null);
  assert.equal(ch.reports.length, 2);
  assert.deepEqual(timer.timed, []);
});

test("a candidate whose timing fails is not chosen", async () => {
  const failingTimer: GemmTimer = async (c, run) => { if (c.name === "fast") throw new Error("device lost"); run(); return 3; };
  const t = new GemmAutotuner([correct("fast"), correct("ok")], { timer: failingTimer, reference, timeShape: smallTime, log: quiet });
  const ch = await t.tune("NN/large");
  assert.equal(ch.candidate?.name, "ok");
  assert.match(ch.reports[0]!.reason!, /timing failed: device lost/);
});

test("device errors raised during a candidate's run skip it", async () => {
  let running = "";
  const errors = { begin() {}, async end() { return running === "bad" ? "Invalid ShaderModule" : null; } };
  const track = (c: GemmCandidate): GemmCandidate => ({ ...c, matMul: (a, b, s) => { running = c.name; return c.matMul(a, b, s); } });
  const t = new GemmAutotuner([track(correct("bad")), track(correct("good"))], { timer: tableTimer({ bad: 1, good: 2 }), reference, errors, timeShape: smallTime, log: quiet });
  const ch = await t.tune("NT/large");
  assert.equal(ch.candidate?.name, "good");
  assert.match(ch.reports[0]!.reason!, /device error \(compile or dispatch\): Invalid ShaderModule/);
});

test("VERL_GEMM_KERNEL pins a choice (checked, not timed), per class or for all; a wrong pin is an error", async () => {
  assert.deepEqual(parsePin("direct_2x2_4x4"), { all: "direct_2x2_4x4", byClass: new Map() });
  assert.deepEqual(parsePin("NT/large=a, NN/small=f32").byClass, new Map([["NT/large", "a"], ["NN/small", "f32"]]));
  assert.throws(() => parsePin("XX/large=a"), /product class 'XX\/large'/);
  const cands = [correct("a"), correct("b"), shifted];
  assert.throws(() => new GemmAutotuner(cands, { timer: tableTimer({}), reference, pin: "nope", log: quiet }), /VERL_GEMM_KERNEL: no candidate 'nope' \(have f32, a, b, shifted\)/);

  const timer = tableTimer({ a: 1, b: 2 });
  const t = new GemmAutotuner(cands, { timer, reference, pin: "b,NN/small=f32,TT/large=shifted", timeShape: smallTime, log: quiet });
  const nt = await t.tune("NT/large");
  assert.equal(nt.candidate?.name, "b");
  assert.equal(nt.pinned, true);
  assert.deepEqual(nt.reports.map((r) => r.name), ["b"]);
  assert.deepEqual(timer.timed, []);
  assert.equal((await t.tune("NN/small")).candidate, null);
  await assert.rejects(t.tune("TT/large"), /VERL_GEMM_KERNEL pins 'shifted' for TT\/large, which failed its check: relative error/);
});
