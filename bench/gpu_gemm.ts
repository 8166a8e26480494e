// The tensor-core GEMM of issue 23 (src/engine/webgpu_gemm.ts) on the GPU, in one process:
//   bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js [--only adapter,validate,check,sweep,staged_old,direct,registry,splitk,compile]
//     [--size 4096] [--reps 10] [--tiles BMxBNxBKxSGMxSGNxBUF,...] [--formats f32,packed]
//     [--budget-s 140] [--toggles default,disable_robustness] [--candidates NAME,...] [--classes NT/large,...]
// `sweep` runs every autotuner candidate (src/engine/gemm_autotune.ts, webgpu_kernels.ts) at
// 4096^3 and the model's shapes, one JSON line each, then the autotuner's choice per class;
// `splitk` times the trainer's split-K products (LoRA's factor gradients) against the unsplit kernel.
// With --toggles it runs once per Dawn toggle set (a child process each, extra toggles joined by
// "+" appended to VERL_DAWN_FLAGS or the defaults), the budget split between them.
// `validate` is meant for a run with Dawn's validation on (VERL_DAWN_FLAGS without
// skip_validation): it reports every uncaptured device error and the error scope around one
// product. One JSON line per measurement; each part is caught on its own.
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { webGpuInfo, webGpuSummary } from "../src/engine/webgpu.js";
import { DEFAULT_TILE, fitTile, gemmFlops, tileBytes, type GemmShape, type GemmTile } from "../src/engine/webgpu_gemm.js";
import { DEFAULT_DIRECT_TILE, THIN_DIRECT_TILE, directPadding, directSplits, isThinProduct, setSplitKCap, setSplitKTargets, SPLIT_K_MIN_CHUNK, SPLIT_K_WORKGROUPS, type DirectTile, type SplitKTargets } from "../src/engine/webgpu_gemm.js";
import { directMatMul, gemmAutotuner, gemmShape, packOperand, paddedMatMul, setMatmulPrecision, tensorCoreMatMul, tensorCoreStats, tensorCoreSupport, TENSOR_CORE_CANDIDATES,
  stagedCandidate, webGpuTimer, type TensorCoreCandidate } from "../src/engine/webgpu_kernels.js";
import { DEFAULT_DAWN_FLAGS } from "../src/engine/webgpu.js";
import { productClass, relativeError } from "../src/engine/gemm_autotune.js";
import { spawnSync } from "node:child_process";
import { sync } from "./gpu.js";

interface Args {
  only: Set<string>; size: number; reps: number; tiles: GemmTile[]; formats: string[]; direct: DirectTile[]; kernel: "direct" | "staged";
  budgetS: number; toggles: string[] | null; candidates: string[] | null; classes: string[]; shapes: SweepShape[];
  /** --splitk-targets WORKGROUPSxMINCHUNK,...: split-K's targets the splitk part sweeps (default: the engine's) */
  splitTargets: SplitKTargets[];
  /** --splitk-tiles trainer|SGMxSGNxTMxTNxUNROLL,...: direct tiles the splitk part times (prefetch and baked strides on; "trainer", the default: the trainer's choice per product) */
  splitTiles: DirectTile[];
}
/** name, m, n, k, transposeA, transposeB */
type SweepShape = [string, number, number, number, boolean, boolean];
/** NAME:MxNxK[:TN|NT|TT|NN] */
function parseShape(v: string): SweepShape {
  const [name, dims, t = "NN"] = v.split(":");
  const [m, n, k] = (dims ?? "").split("x").map(Number);
  if (!name || ![m, n, k].every((d) => Number.isInteger(d) && d! > 0) || !/^[NT][NT]$/.test(t)) throw new Error(`bench/gpu_gemm: shape '${v}' is not NAME:MxNxK[:NT]`);
  return [name, m!, n!, k!, t[0] === "T", t[1] === "T"];
}

function parseDirect(s: string): DirectTile {
  const [sgM, sgN, tm, tn, unroll] = s.split("x").map(Number);
  if (![sgM, sgN, tm, tn, unroll].every((v) => Number.isInteger(v) && v! > 0)) throw new Error(`bench/gpu_gemm: direct tile '${s}' is not SGMxSGNxTMxTNxUNROLL`);
  return { sgM: sgM!, sgN: sgN!, tm: tm!, tn: tn!, unroll: unroll === 4 ? 4 : unroll === 2 ? 2 : 1 };
}
const DIRECT = ["1x1x4x4x1", "2x2x4x4x1", "2x2x4x4x2", "4x1x4x4x1", "1x4x4x4x1", "2x2x2x4x1", "2x2x4x2x1", "2x4x2x2x1", "4x4x2x2x1", "2x2x2x2x2"];

function parseTile(s: string): GemmTile {
  const [bm, bn, bk, sgM, sgN, buf] = s.split("x").map(Number);
  if (![bm, bn, bk, sgM, sgN, buf].every((v) => Number.isInteger(v) && v! > 0)) throw new Error(`bench/gpu_gemm: tile '${s}' is not BMxBNxBKxSGMxSGNxBUF`);
  return { bm: bm!, bn: bn!, bk: bk!, sgM: sgM!, sgN: sgN!, buffers: buf === 1 ? 1 : 2 };
}

const SWEEP = ["128x128x32x2x4x2", "128x128x16x2x4x2", "128x128x32x4x2x2", "128x128x64x2x4x1", "128x256x16x2x4x2", "256x128x16x4x2x2", "128x256x32x2x4x1", "64x128x32x2x2x2", "64x64x32x2x2x2"];

function parseArgs(argv: string[]): Args {
  const a: Args = { only: new Set(["adapter", "check", "sweep", "registry"]), size: 4096, reps: 10, tiles: SWEEP.map(parseTile), formats: ["packed", "f32"], direct: DIRECT.map(parseDirect), kernel: "direct",
    budgetS: 140, toggles: null, candidates: null, classes: ["NN/large", "NT/large", "TN/large", "NT/small"], shapes: SWEEP_SHAPES,
    splitTargets: [{ workgroups: SPLIT_K_WORKGROUPS, minChunk: SPLIT_K_MIN_CHUNK }], splitTiles: [DEFAULT_DIRECT_TILE] };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i], v = argv[i + 1];
    if (v === undefined) throw new Error(`bench/gpu_gemm: '${k}' needs a value`);
    if (k === "--only") a.only = new Set(v.split(","));
    else if (k === "--size") a.size = Number(v);
    else if (k === "--reps") a.reps = Number(v);
    else if (k === "--tiles") a.tiles = v.split(",").map(parseTile);
    else if (k === "--formats") a.formats = v.split(",");
    else if (k === "--direct") a.direct = v.split(",").map(parseDirect);
    else if (k === "--kernel") a.kernel = v === "staged" ? "staged" : "direct";
    else if (k === "--budget-s") a.budgetS = Number(v);
    else if (k === "--toggles") a.toggles = v.split(",");
    else if (k === "--candidates") a.candidates = v.split(",");
    else if (k === "--classes") a.classes = v.split(",");
    else if (k === "--shapes") a.shapes = v.split(",").map(parseShape);
    else if (k === "--splitk-targets") a.splitTargets = v.split(",").map((t) => {
      const [workgroups, minChunk] = t.split("x").map(Number);
      return { workgroups: workgroups!, minChunk: minChunk! };
    });
    else if (k === "--splitk-tiles") a.splitTiles = v.split(",").map((t) => (t === "trainer" ? DEFAULT_DIRECT_TILE : { ...parseDirect(t), prefetch: true, baked: true }));
    else throw new Error(`bench/gpu_gemm: unknown argument '${k}'`);
  }
  return a;
}

const emit = (name: string, config: object, figures: object) => console.log(JSON.stringify({ name, config, figures }));
async function part(name: string, fn: () => Promise<void>): Promise<void> {
  try { await fn(); } catch (e) { emit(name, {}, { error: (e as Error).stack ?? String(e) }); }
}

interface TI { dataId: object; shape: number[]; dtype: string }
const backend = () => tf.backend() as unknown as Parameters<typeof tensorCoreMatMul>[0] & { device: GpuDevice };
interface GpuDevice {
  pushErrorScope(f: string): void; popErrorScope(): Promise<{ message: string } | null>;
  addEventListener(t: string, f: (e: { error: { message: string } }) => void): void;
  queue: { onSubmittedWorkDone(): Promise<void> };
}
const toTensor = (t: TI) => tf.engine().makeTensorFromTensorInfo(t as tf.TensorInfo);

/** ||x - ref|| / ||ref|| and whether x has a NaN, read back as two scalars. */
async function relErr(x: tf.Tensor, ref: tf.Tensor): Promise<{ rel: number; nan: boolean }> {
  const [r, n] = tf.tidy(() => [tf.div(tf.norm(tf.sub(x, ref)), tf.norm(ref)), tf.any(tf.isNaN(x))]);
  const rel = (await r!.data())[0]!, nan = (await n!.data())[0]! !== 0;
  tf.dispose([r!, n!]);
  return { rel, nan };
}

/** The f32 reference product through tfjs's own kernel (the override off). */
function reference(a: tf.Tensor, b: tf.Tensor, ta: boolean, tb: boolean): tf.Tensor {
  setMatmulPrecision("f32");
  return tf.matMul(a as tf.Tensor3D, b as tf.Tensor3D, ta, tb);
}

let seed = 11;
let kernelKind: "direct" | "staged" = "direct";
/** One product on the tensor cores with the kernel under test. */
function tc(a: tf.Tensor, b: tf.Tensor, s: GemmShape, opts: { packed?: boolean; rounding?: "f16" | "bf16"; strictUniformity?: boolean } = {}): tf.Tensor {
  const out = kernelKind === "direct"
    ? directMatMul(backend(), a as unknown as TI, b as unknown as TI, s, [s.batch, s.m, s.n], { rounding: opts.rounding })
    : tensorCoreMatMul(backend(), a as unknown as TI, b as unknown as TI, s, [s.batch, s.m, s.n], { ...opts, experimental: true });
  return toTensor(out);
}
function operands(s: GemmShape): [tf.Tensor, tf.Tensor] {
  const aShape = s.transposeA ? [s.batchA, s.k, s.m] : [s.batchA, s.m, s.k];
  const bShape = s.transposeB ? [s.batchB, s.n, s.k] : [s.batchB, s.k, s.n];
  return [tf.randomNormal(aShape, 0, 1, "float32", seed++), tf.randomNormal(bShape, 0, 1, "float32", seed++)];
}

async function timeIt(run: () => tf.Tensor, reps: number): Promise<number> {
  for (let i = 0; i < 2; i++) { const w = run(); await w.data(); w.dispose(); }
  const t0 = performance.now();
  let last: tf.Tensor | undefined;
  for (let i = 0; i < reps; i++) { last?.dispose(); last = run(); }
  await last!.data();
  const ms = (performance.now() - t0) / reps;
  last!.dispose();
  return ms;
}

async function adapter(): Promise<void> {
  const dev = backend().device as unknown as { features: Set<string> };
  emit("adapter", {}, { summary: webGpuSummary(), flags: webGpuInfo.flags, adapter_features: webGpuInfo.features, device_features: [...dev.features].sort(),
    requested: webGpuInfo.requested, subgroup_matrix_configs: webGpuInfo.subgroupMatrixConfigs, tensor_cores: tensorCoreSupport });
}

/** With validation on: every device error while one product of each kind runs. */
async function validate(): Promise<void> {
  const dev = backend().device, errors: string[] = [];
  dev.addEventListener("uncapturederror", (e) => { errors.push(e.error.message); });
  for (const [packed, strictUniformity] of [[false, false], [true, false], [false, true]]) {
    const s: GemmShape = { batch: 1, m: 256, n: 256, k: 256, transposeA: false, transposeB: true, batchA: 1, batchB: 1 };
    const [a, b] = operands(s);
    errors.length = 0;
    dev.pushErrorScope("validation");
    const out = tc(a, b, s, { packed, strictUniformity });
    const scope = await dev.popErrorScope();
    const ref = reference(a, b, false, true);
    let err: object;
    try { err = await relErr(out, ref); } catch (e) { err = { read_failed: (e as Error).message }; }
    await dev.queue.onSubmittedWorkDone();
    emit("validate", { packed, strict_uniformity: strictUniformity, flags: webGpuInfo.flags }, { scope_error: scope?.message ?? null, uncaptured: [...errors], ...err });
    tf.dispose([a, b, out, ref]);
  }
}

/** Small cases that tell a layout mistake from a K-loop or edge mistake (identity operands, one fragment, one tile). */
async function debug(): Promise<void> {
  const eye = (n: number) => tf.eye(n).reshape([1, n, n]);
  const row = async (t: tf.Tensor, n: number) => Array.from((await t.data()).slice(0, n)).map((v) => +v.toFixed(3));
  for (const packed of [false, true]) {
    const b = tf.randomNormal([1, 16, 16], 0, 1, "float32", 5);
    const s: GemmShape = { batch: 1, m: 16, n: 16, k: 16, transposeA: false, transposeB: false, batchA: 1, batchB: 1 };
    const o1 = tc(eye(16), b, s, { packed });
    const o2 = tc(b, eye(16), s, { packed });
    emit("debug_identity", { packed }, { b_row0: await row(b, 6), b_col0: Array.from((await b.data()).filter((_, i) => i % 16 === 0).slice(0, 6)).map((v) => +v.toFixed(3)),
      I_times_b_row0: await row(o1, 6), b_times_I_row0: await row(o2, 6), ...(await relErr(o1, b)), b_times_I: await relErr(o2, b) });
    tf.dispose([b, o1, o2]);
  }
  const cases: [number, number, number][] = [[16, 16, 16], [16, 16, 32], [128, 128, 32], [128, 128, 64], [128, 128, 96], [256, 256, 256], [130, 128, 32], [128, 136, 32], [128, 128, 40], [1000, 1032, 1000]];
  for (const [m, n, k] of cases) {
    for (const packed of [false, true]) {
      const s: GemmShape = { batch: 1, m, n, k, transposeA: false, transposeB: false, batchA: 1, batchB: 1 };
      const [a, b] = operands(s);
      const out = tc(a, b, s, { packed });
      const ref = reference(a, b, false, false);
      emit("debug_case", { m, n, k, packed }, await relErr(out, ref));
      tf.dispose([a, b, out, ref]);
    }
  }
}

/** Edge shapes, all four transpose combinations, batches and broadcast, against tfjs's f32 product. */
async function check(): Promise<void> {
  const shapes: [number, number, number, number, number][] = [[1, 1000, 1032, 1000, 1], [1, 77, 96, 40, 1], [3, 100, 64, 100, 3], [4, 130, 136, 64, 1], [1, 512, 896, 896, 1], [2, 256, 256, 128, 2], [1, 200, 256, 96, 1], [1, 1000, 896, 640, 1]]; // the last two: padded in rows only (a prefix view, no slice)
  for (const [batch, m, n, k, bb] of shapes) {
    for (const [ta, tb] of [[false, false], [false, true], [true, false], [true, true]] as const) {
      for (const packed of [false, true]) {
        const s: GemmShape = { batch, m, n, k, transposeA: ta, transposeB: tb, batchA: batch, batchB: bb };
        const [a, b] = operands(s);
        const out = tc(a, b, s, { packed });
        const ref = reference(a, b, ta, tb);
        const e = await relErr(out, ref);
        emit("check", { batch, m, n, k, batchB: bb, transposeA: ta, transposeB: tb, packed }, { ...e, ok: !e.nan && e.rel < 2e-3 });
        tf.dispose([a, b, out, ref]);
      }
    }
  }
  for (const rounding of ["bf16"] as const) {
    const s: GemmShape = { batch: 1, m: 512, n: 512, k: 512, transposeA: false, transposeB: false, batchA: 1, batchB: 1 };
    const [a, b] = operands(s);
    for (const packed of [false, true]) {
      const out = tc(a, b, s, { packed, rounding });
      const ref = reference(a, b, false, false);
      emit("check", { m: 512, n: 512, k: 512, rounding, packed }, await relErr(out, ref));
      tf.dispose([out, ref]);
    }
    tf.dispose([a, b]);
  }
}

/** The first staged kernel (GemmProgram) over tiles and operand formats (the part named `sweep` before the autotuner). */
async function stagedOld(a: Args): Promise<void> {
  const N = a.size;
  for (const layout of [[false, false], [false, true]] as const) {
    const s: GemmShape = { batch: 1, m: N, n: N, k: N, transposeA: layout[0], transposeB: layout[1], batchA: 1, batchB: 1 };
    const [x, y] = operands(s);
    const ref = reference(x, y, layout[0], layout[1]);
    for (const tile of a.tiles) {
      for (const fmt of a.formats) {
        await part("sweep", async () => {
          const packed = fmt === "packed";
          const run = () => toTensor(tensorCoreMatMul(backend(), x as unknown as TI, y as unknown as TI, s, [1, N, N], { packed, tile, experimental: true }));
          const ms = await timeIt(run, a.reps);
          const out = run();
          const e = await relErr(out, ref);
          out.dispose();
          emit("sweep", { m: N, n: N, k: N, transposeB: layout[1], tile: fitTile(tile, s), packed, workgroup_bytes: tileBytes(fitTile(tile, s), s) }, { ms, tflops: gemmFlops(s) / ms / 1e9, ...e });
        });
      }
    }
    tf.dispose([x, y, ref]);
  }
}

async function sweepDirect(a: Args): Promise<void> {
  const N = a.size;
  for (const [ta, tb] of [[false, false], [false, true], [true, false]] as const) {
    const s: GemmShape = { batch: 1, m: N, n: N, k: N, transposeA: ta, transposeB: tb, batchA: 1, batchB: 1 };
    const [x, y] = operands(s);
    const ref = reference(x, y, ta, tb);
    for (const tile of a.direct) {
      await part("sweep_direct", async () => {
        const run = () => toTensor(directMatMul(backend(), x as unknown as TI, y as unknown as TI, s, [1, N, N], { tile }));
        const ms = await timeIt(run, a.reps);
        const out = run();
        const e = await relErr(out, ref);
        out.dispose();
        emit("sweep_direct", { m: N, n: N, k: N, transposeA: ta, transposeB: tb, tile, padded: directPadding(s, tile) }, { ms, tflops: gemmFlops(s) / ms / 1e9, ...e });
      });
      if (ta) break; // the TN layout with the first tile only
    }
    tf.dispose([x, y, ref]);
  }
}

/** The sweep's problems: the square product both ways and the 0.5B model's largest shapes. */
const SWEEP_SHAPES: SweepShape[] = [
  ["square_NN", 4096, 4096, 4096, false, false], ["square_NT", 4096, 4096, 4096, false, true],
  ["x_wT_up_NT", 6144, 4864, 896, false, true], ["down_NN", 6144, 896, 4864, false, false], ["lm_head_NT", 512, 151936, 896, false, true],
];
/** Sweep-only candidates: the staged kernel with the old 8-half alignment, to tell on the device whether alignment was the shift's cause. */
const SWEEP_EXTRA: TensorCoreCandidate[] = [stagedCandidate({ sgM: 2, sgN: 2, tm: 4, tn: 4, kf: 2, buffers: 2, pad: 8 }), stagedCandidate({ sgM: 2, sgN: 2, tm: 4, tn: 4, kf: 2, buffers: 1, pad: 8 })];

/**
 * Every autotuner candidate: its check (the tuner's own, on the small problem of each transpose
 * layout the shapes use), then ms and TFLOP/s at each shape with the error against tfjs's f32
 * product there; then the autotuner's choice per class. Stops timing when the budget runs out.
 */
async function sweep(a: Args): Promise<void> {
  const t0 = performance.now(), left = () => a.budgetS - (performance.now() - t0) / 1000;
  const tuner = gemmAutotuner(), toggles = webGpuInfo.flags;
  // the baseline, the probe's form, then the staged kernels (the alignment question), then the other direct variants: if the budget runs out, it is on those
  const first = ["direct_2x2_4x4", "direct_1x1_4x4"];
  const all = [...TENSOR_CORE_CANDIDATES, ...SWEEP_EXTRA].sort((x, y) => rank(x) - rank(y));
  function rank(c: TensorCoreCandidate): number { return first.includes(c.name) ? first.indexOf(c.name) : c.params.kind === "staged" ? 2 : 3; }
  const chosen = a.candidates ? all.filter((c) => a.candidates!.some((n) => c.name === n || c.name.includes(n))) : all;
  // operands and f32 references once per shape (ms of tfjs's own kernel too)
  const problems: { name: string; s: GemmShape; x: tf.Tensor; y: tf.Tensor; ref: tf.Tensor }[] = [];
  /** kernel -> shape -> "TFLOP/s with packing / kernel alone", for one short line at the end */
  const summary: Record<string, Record<string, string>> = {};
  // the tuner reserves a quarter of the budget (at least 20 s) for its choices at the end
  const reserve = Math.max(20, a.budgetS / 4);
  try {
    for (const [name, m, n, k, ta, tb] of a.shapes) {
      const s: GemmShape = { batch: 1, m, n, k, transposeA: ta, transposeB: tb, batchA: 1, batchB: 1 };
      const [x, y] = operands(s);
      problems.push({ name, s, x, y, ref: reference(x, y, ta, tb) });
    }
    for (const c of chosen) {
      if (left() < reserve) { emit("sweep", { kernel: c.name, params: c.params, toggles }, { skipped: "budget" }); continue; }
      // the check problem of each transpose layout the shapes use (its "large" class; the check is the same for both sizes)
      const classes = [...new Set(problems.map((p) => productClass({ ...p.s, m: 4096, n: 4096 })))];
      const checks = [];
      for (const cls of classes) checks.push({ cls, ...(await tuner.check(c, cls)) });
      const compileOk = checks.every((r) => !/device error|failed to run/.test(r.reason ?? ""));
      const figures: Record<string, object> = {};
      if (checks.every((r) => r.ok)) {
        for (const p of problems) {
          if (left() < reserve) { figures[p.name] = { skipped: "budget" }; continue; }
          try {
            const ms = await webGpuTimer(c, () => { c.matMul(p.x, p.y, p.s).dispose(); }, p.s);
            const out = c.matMul(p.x, p.y, p.s);
            const rel = await relativeError(out, p.ref);
            out.dispose();
            // the kernel alone: both operands packed once beforehand (the trainer keeps weights packed; the probe had no packing)
            const be = backend(), pa = packOperand(be, p.x as unknown as TI, p.s, c.kernel, "a", "f16"), pb = packOperand(be, p.y as unknown as TI, p.s, c.kernel, "b", "f16");
            let kms: number;
            try {
              kms = await webGpuTimer(c, () => { be.disposeData(paddedMatMul(be, pa, pb, p.s, [1, p.s.m, p.s.n], c.kernel, { aPacked: true, bPacked: true }).dataId); }, p.s);
            } finally {
              be.disposeData(pa.dataId);
              be.disposeData(pb.dataId);
            }
            const tflops = gemmFlops(p.s) / ms / 1e9, kernelTflops = gemmFlops(p.s) / kms / 1e9;
            figures[p.name] = { shape: `${p.s.m}x${p.s.n}x${p.s.k}${p.s.transposeB ? " NT" : ""}`, ms: +ms.toFixed(3), tflops: +tflops.toFixed(1),
              kernel_ms: +kms.toFixed(3), kernel_tflops: +kernelTflops.toFixed(1), rel_err: rel };
            (summary[c.name] ??= {})[p.name] = `${tflops.toPrecision(3)}/${kernelTflops.toPrecision(3)}`;
          } catch (e) {
            figures[p.name] = { error: (e as Error).message };
          }
        }
      }
      if (!checks.every((r) => r.ok)) summary[c.name] = { failed: checks.map((r) => `${r.cls}: ${r.reason?.slice(0, 110)}${r.shift != null ? ` (shift ${r.shift})` : ""}`).join("; ") };
      emit("sweep", { kernel: c.name, params: c.params, toggles }, {
        compile_ok: compileOk, max_rel_err: Math.max(...checks.map((r) => r.relErr ?? NaN)),
        checks: checks.map((r) => ({ cls: r.cls, ok: r.ok, rel_err: r.relErr, reason: r.reason, shift: r.shift })), ...figures,
      });
    }
    for (const p of problems) {
      if (left() < reserve) break;
      const ms = await timeIt(() => reference(p.x, p.y, p.s.transposeA, p.s.transposeB), 3);
      emit("sweep_f32", { shape: p.name }, { ms, tflops: gemmFlops(p.s) / ms / 1e9 });
    }
  } finally {
    for (const p of problems) tf.dispose([p.x, p.y, p.ref]);
  }
  setMatmulPrecision("f16");
  for (const cls of a.classes) {
    if (left() < 5) { emit("autotune", { cls }, { skipped: "budget" }); continue; }
    await part("autotune", async () => {
      const ch = await tuner.tune(cls);
      emit("autotune", { cls, toggles }, {
        chosen: ch.candidate?.name ?? "f32 (tfjs)", pinned: ch.pinned,
        ranking: ch.reports.filter((r) => r.ms !== undefined).sort((x, y) => x.ms! - y.ms!).map((r) => ({ kernel: r.name, ms: +r.ms!.toFixed(3), tflops: +r.tflops!.toFixed(1) })),
        skipped: ch.reports.filter((r) => !r.ok).map((r) => ({ kernel: r.name, reason: r.reason, shift: r.shift })),
      });
    });
  }
  setMatmulPrecision("f32");
  emit("sweep_summary", { toggles, figures: "TFLOP/s with both packing passes / kernel alone" }, summary);
  emit("sweep_done", { toggles }, { seconds: (performance.now() - t0) / 1000 });
}

/** Through the registered kernel: tf.matMul with 16-bit products asked for, at the model's shapes. */
async function registry(a: Args): Promise<void> {
  const cases: [string, number, number, number, boolean, boolean][] = [
    ["square", a.size, a.size, a.size, false, false],
    ["x_wT_up", 6144, 4864, 896, false, true], ["x_wT_down", 6144, 896, 4864, false, true],
    ["dX", 6144, 896, 4864, false, false], ["dW", 4864, 896, 6144, true, false],
    ["decode_x_wT", 512, 4864, 896, false, true], ["lm_head_151936", 512, 151936, 896, false, true],
  ];
  for (const [name, m, n, k, ta, tb] of cases) {
    await part(`registry_${name}`, async () => {
      const x = tf.randomNormal(ta ? [k, m] : [m, k], 0, 1, "float32", seed++) as tf.Tensor2D;
      const y = tf.randomNormal(tb ? [n, k] : [k, n], 0, 1, "float32", seed++) as tf.Tensor2D;
      const ref = reference(x, y, ta, tb);
      const f32ms = await timeIt(() => tf.matMul(x, y, ta, tb), 5);
      setMatmulPrecision("f16", a.direct[0] ? { direct: a.direct[0] } : {});
      const before = tensorCoreStats().calls;
      const ms = await timeIt(() => tf.matMul(x, y, ta, tb), a.reps);
      const out = tf.matMul(x, y, ta, tb);
      const used = tensorCoreStats().calls - before;
      const e = await relErr(out, ref);
      const flop = 2 * m * n * k;
      emit("registry", { name, m, n, k, transposeA: ta, transposeB: tb, shape_ok: gemmShape(x.shape, y.shape, ta, tb) !== null },
        { tensor_core_ms: ms, tensor_core_tflops: flop / ms / 1e9, f32_ms: f32ms, f32_tflops: flop / f32ms / 1e9, speedup: f32ms / ms, tensor_core_calls: used, ...e });
      tf.dispose([x, y, ref, out]);
      setMatmulPrecision("f32");
    });
  }
}

/**
 * Split-K (directSplits) at the 0.5B recipe's backward shapes (6,144 token rows): LoRA's factor
 * products and full fine-tuning's small weight gradients, through tf.matMul with 16-bit products,
 * split as the trainer splits them and unsplit (setSplitKCap(1)); ms each, the speed-up, and the
 * split product's error against float32.
 */
async function splitK(a: Args): Promise<void> { // a.reps: repetitions timed
  const cases: [string, number, number, number, boolean, boolean][] = [
    ["lora_dA_qkv", 96, 896, 6144, true, false], ["lora_dB_qkv", 1152, 96, 6144, true, false],
    ["lora_dA_down", 32, 4864, 6144, true, false], ["lora_dB_gate_up", 9728, 64, 6144, true, false],
    ["lora_h_down", 6144, 32, 4864, false, true], ["lora_dH_gate_up", 6144, 64, 9728, false, false],
    ["full_dW_qkv", 1152, 896, 6144, true, false], ["full_dW_o", 896, 896, 6144, true, false], ["full_dW_down", 896, 4864, 6144, true, false],
  ];
  // each case restores the cap and targets it found; each timing sets its own target
  const before = setSplitKCap(undefined), targets0 = setSplitKTargets(a.splitTargets[0]!);
  // DEFAULT_DIRECT_TILE itself stands for the trainer's choice (the thin tile for thin products); a --splitk-tiles tile is kept
  const tileName = (t: DirectTile, s: GemmShape) => {
    const e = effective(t, s), name = `${e.sgM}x${e.sgN}x${e.tm}x${e.tn}x${e.unroll}`;
    return t === DEFAULT_DIRECT_TILE ? `trainer:${name}` : name;
  };
  const effective = (t: DirectTile, s: GemmShape) => (t === DEFAULT_DIRECT_TILE && isThinProduct(s) ? THIN_DIRECT_TILE : t);
  for (const [name, m, n, k, ta, tb] of cases) {
    await part(`splitk_${name}`, async () => {
      const x = tf.randomNormal(ta ? [k, m] : [m, k], 0, 1, "float32", seed++) as tf.Tensor2D;
      const y = tf.randomNormal(tb ? [n, k] : [k, n], 0, 1, "float32", seed++) as tf.Tensor2D;
      const ref = reference(x, y, ta, tb), flop = 2 * m * n * k;
      const s: GemmShape = { batch: 1, m, n, k, transposeA: ta, transposeB: tb, batchA: 1, batchB: 1 };
      try {
        // tfjs's own float32 product on the same operands: what the 16-bit path has to beat
        const f32Ms = await timeIt(() => tf.matMul(x, y, ta, tb), a.reps);
        emit("splitk_f32", { name, m, n, k, transposeA: ta, transposeB: tb }, { f32_ms: f32Ms, f32_tflops: flop / f32Ms / 1e9 });
        for (const tile of a.splitTiles) {
          setMatmulPrecision("f16", { direct: tile });
          setSplitKCap(1);
          const plainMs = await timeIt(() => tf.matMul(x, y, ta, tb), a.reps);
          for (const target of a.splitTargets) {
            setSplitKTargets(target);
            setSplitKCap(before);
            const splits = directSplits(s, { ...effective(tile, s), splitK: true });
            const splitMs = splits > 1 ? await timeIt(() => tf.matMul(x, y, ta, tb), a.reps) : plainMs;
            const out = tf.matMul(x, y, ta, tb), e = await relErr(out, ref);
            emit("splitk", { name, m, n, k, transposeA: ta, transposeB: tb, tile: tileName(tile, s), workgroups: target.workgroups, min_chunk: target.minChunk, splits },
              { split_ms: splitMs, split_tflops: flop / splitMs / 1e9, unsplit_ms: plainMs, unsplit_tflops: flop / plainMs / 1e9, speedup: plainMs / splitMs, ...e });
            tf.dispose(out);
          }
        }
      } finally {
        setSplitKCap(before);
        setSplitKTargets(targets0);
        setMatmulPrecision("f32");
        tf.dispose([x, y, ref]);
      }
    });
  }
}

/**
 * --only compile: what a tensor-core product's pipeline costs to create, one at a time (tfjs's way:
 * createComputePipeline on first use, blocking the host) against all at once through tfjs's
 * compile-only mode (createComputePipelineAsync, awaited together): whether Dawn and the driver
 * compile them in parallel, and so whether a compile-only warm-up pass could shorten a run's first
 * step. Each phase takes `count` products of distinct K and N (distinct baked strides, so distinct
 * pipelines, as a model's weight shapes are); the pipelines made are counted from tfjs's cache, and
 * the parallel phase's products then run for real and are checked against tfjs's float32 product.
 */
async function compileTimes(count: number): Promise<void> {
  const be = tf.backend() as unknown as { pipelineCache: Record<string, unknown>; checkCompileCompletionAsync(): Promise<void> };
  const shapes = (phase: number) => Array.from({ length: count }, (_, i) => ({ m: 512, k: 1024 + 32 * (2 * i + phase), n: 768 + 32 * (2 * i + phase) }));
  const product = ({ m, k, n }: { m: number; k: number; n: number }) => tf.tidy(() => tf.matMul(tf.ones([m, k]), tf.ones([n, k]), false, true));
  setMatmulPrecision("f16");
  try {
    tf.tidy(() => product({ m: 512, k: 512, n: 512 })); // the pack and fill programs, compiled outside both phases
    await sync(); // the warm-up's work done before the clock starts
    const pipelines = () => Object.keys(be.pipelineCache).length;
    let p0 = pipelines(), t0 = performance.now();
    for (const s of shapes(0)) product(s).dispose();
    const syncMs = performance.now() - t0, syncMade = pipelines() - p0;
    tf.env().set("WEBGPU_ENGINE_COMPILE_ONLY", true);
    p0 = pipelines(); t0 = performance.now();
    try {
      for (const s of shapes(1)) product(s).dispose();
      await be.checkCompileCompletionAsync();
    } finally {
      tf.env().set("WEBGPU_ENGINE_COMPILE_ONLY", false);
    }
    const asyncMs = performance.now() - t0, asyncMade = pipelines() - p0;
    // the pipelines made in compile-only mode are the ones the real products now use
    const errs: number[] = [];
    t0 = performance.now();
    for (const s of shapes(1)) {
      const y = product(s), v = await y.data();
      let e = 0;
      for (const x of v) e = Math.max(e, Math.abs(x - s.k) / s.k); // ones times ones: every entry is K
      errs.push(e);
      y.dispose();
    }
    emit("compile", { count, shapes: "512 x K x N (x W^T), K and N distinct per product" },
      { sync_ms: syncMs, sync_pipelines: syncMade, sync_ms_per_pipeline: syncMs / Math.max(1, syncMade),
        parallel_ms: asyncMs, parallel_pipelines: asyncMade, parallel_ms_per_pipeline: asyncMs / Math.max(1, asyncMade),
        speedup: (syncMs / Math.max(1, syncMade)) / (asyncMs / Math.max(1, asyncMade)), run_after_ms: performance.now() - t0, max_rel_err_after: Math.max(...errs) });
  } finally {
    setMatmulPrecision("f32");
  }
}

/** --toggles: the sweep once per toggle set, each in a child process (Dawn's toggles are fixed per process). */
function sweepPerToggles(a: Args, argv: string[]): void {
  const sets = a.toggles!, base = process.env.VERL_DAWN_FLAGS ?? DEFAULT_DAWN_FLAGS;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i += 2) if (argv[i] !== "--toggles" && argv[i] !== "--budget-s") rest.push(argv[i]!, argv[i + 1]!);
  const t0 = performance.now();
  for (let i = 0; i < sets.length; i++) {
    const left = a.budgetS - (performance.now() - t0) / 1000;
    const share = Math.floor(left / (sets.length - i));
    const extra = sets[i] === "default" ? [] : sets[i]!.split("+");
    // the extra toggles join the enable-dawn-features list (splitFlags keeps a toggle list as one flag)
    const flags = extra.length === 0 ? base : base.includes("enable-dawn-features=") ? `${base},${extra.join(",")}` : `${base},enable-dawn-features=${extra.join(",")}`;
    emit("toggles", { set: sets[i], flags }, { budget_s: share });
    const r = spawnSync(process.execPath, [...process.execArgv, process.argv[1]!, ...rest, "--budget-s", String(share)], {
      stdio: "inherit", env: { ...process.env, VERL_DAWN_FLAGS: flags }, timeout: (share + 30) * 1000,
    });
    if (r.status !== 0) emit("toggles", { set: sets[i], flags }, { error: `child exited with ${r.status ?? r.signal}` });
  }
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2), a = parseArgs(argv);
  if (a.toggles) { sweepPerToggles(a, argv); return; }
  await initBackend("webgpu");
  if (a.only.has("adapter")) await part("adapter", adapter);
  if (!tensorCoreSupport.available) { emit("tensor_cores", {}, { skipped: tensorCoreSupport.reason }); process.exit(0); }
  setMatmulPrecision("f16", { tile: DEFAULT_TILE });
  setMatmulPrecision("f32");
  if (a.only.has("validate")) await part("validate", validate);
  if (a.only.has("debug")) await part("debug", debug);
  if (a.only.has("check")) await part("check", check);
  kernelKind = a.kernel;
  if (a.only.has("staged_old")) await part("staged_old", () => stagedOld(a));
  if (a.only.has("sweep")) await part("sweep", () => sweep(a));
  if (a.only.has("direct")) await part("sweep_direct", () => sweepDirect(a));
  if (a.only.has("registry")) await part("registry", () => registry(a));
  if (a.only.has("splitk")) await part("splitk", () => splitK(a));
  if (a.only.has("compile")) await part("compile", () => compileTimes(Number(process.env.COMPILE_COUNT ?? 12)));
  emit("done", {}, { numTensors: tf.memory().numTensors });
}

main().then(() => process.exit(0), (e: unknown) => {
  console.error(`bench/gpu_gemm failed: ${(e as Error).stack ?? String(e)}`);
  process.exit(1);
});
