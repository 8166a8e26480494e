// Issue 23: the fused RMSNorm / SwiGLU / RoPE kernels (src/engine/webgpu_fused*.ts) against the tfjs
// composites, in one process: programs dispatched, host tensors uploaded and wall time per actor update
// (DataParallelPPOActor.updatePolicy, the worker's path) with the kernels on and off, and the
// dispatches of each layer op's forward and backward. Default: a 2-layer tiny Llama, small enough
// for llvmpipe (docs/gpu.md, "Testing WebGPU code without a GPU"); on the H200:
//   bash scripts/gpu-run.sh node dist/bench/gpu_fused_layers.js --shape 0.5b --rows 64 --micro 64 --reps 3
//     [--layers 24] [--prompt 32] [--response 64] [--precision bf16]
// One JSON line per measurement. The layer ops include causal attention at the model's shape
// (src/engine/webgpu_fused_attention.ts; tokenAttention with its transposes when composite).
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { setFusedLayers } from "../src/engine/webgpu_fused.js";
import { parsePrecision, setMatmulPrecision, tensorCoreStats } from "../src/engine/webgpu_kernels.js";
import { makeConfig, numParams } from "../src/models/config.js";
import { rmsNorm, swiGlu } from "../src/models/layers.js";
import { tokenAttention } from "../src/models/attention.js";
import { applyRope } from "../src/models/rope.js";
import { buildActor, deviceModel, qwenHalfB, rolloutBatch } from "./gpu.js";
import { emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain, stats } from "./common.js";

/**
 * Programs the webgpu backend runs (every tfjs kernel and every fused one is one runWebGPUProgram),
 * and tensors made from host values that it uploads (count, bytes): what engine/constants.ts saves.
 */
function dispatchCounter(): { read(): number; uploads(): { n: number; bytes: number } } {
  type Data = { values: unknown; resource: unknown; shape: number[] };
  const be = tf.backend() as unknown as { runWebGPUProgram: (...a: unknown[]) => unknown; uploadToGPU(id: object): void; tensorMap: { get(id: object): Data | undefined } };
  const orig = be.runWebGPUProgram, origUpload = be.uploadToGPU;
  let n = 0, up = 0, bytes = 0;
  be.runWebGPUProgram = function (this: unknown, ...a: unknown[]) { n++; return orig.apply(this, a); };
  be.uploadToGPU = function (this: typeof be, id: object) {
    const d = this.tensorMap.get(id);
    if (d && d.resource == null && d.values) { up++; bytes += 4 * d.shape.reduce((a, b) => a * b, 1); }
    return origUpload.call(this, id);
  };
  return { read: () => n, uploads: () => ({ n: up, bytes }) };
}

/** Waits for the queue: what tfjs has recorded is submitted and done. */
async function drain(): Promise<void> {
  const be = tf.backend() as unknown as { endComputePassEncoder(): void; submitQueue(): void; commandEncoder: unknown; device: { queue: { onSubmittedWorkDone(): Promise<void> } } };
  be.endComputePassEncoder();
  if (be.commandEncoder) be.submitQueue();
  await be.device.queue.onSubmittedWorkDone();
}

runMain("gpu_fused_layers", async () => {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 2 });
  const shape = args.extra.get("shape") ?? "tiny", start = loadAvg1m();
  const backend = await initBackend("webgpu");
  const precision = parsePrecision(args.extra.get("precision") ?? "fp32", "--precision");
  if (precision !== "f32" && !setMatmulPrecision(precision)) throw new Error(`--precision ${precision}: no tensor-core kernel on this adapter`);
  const cfg = shape === "0.5b" ? qwenHalfB(intFlag(args, "vocab", 512), intFlag(args, "layers", 24))
    : makeConfig({ vocabSize: 256, dim: 64, hiddenDim: 176, nLayers: intFlag(args, "layers", 2), nHeads: 4, nKvHeads: 2, maxSeqLen: 64 });
  const rows = intFlag(args, "rows", 4), micro = intFlag(args, "micro", rows), P = intFlag(args, "prompt", 8), R = intFlag(args, "response", 8);
  const counter = dispatchCounter();
  const config = { shape, layers: cfg.nLayers, dim: cfg.dim, hidden: cfg.hiddenDim, params: numParams(cfg), rows, micro, prompt: P, response: R, matmul: precision };

  // each layer op alone, at this model's row count
  const N = rows * (P + R), ops: Record<string, number> = {};
  const x = tf.randomNormal([N, cfg.dim], 0, 1, "float32", 1), w = tf.ones([cfg.dim]), gu = tf.randomNormal([N, 2 * cfg.hiddenDim], 0, 1, "float32", 2);
  // attention as a decoder layer runs it: rows sequences of P + R tokens, no padding (keyStart 0)
  const H = cfg.nHeads, K = cfg.nKvHeads, hd = cfg.headDim, T = P + R, att = { batch: rows, seqLen: T, kvHeads: K, group: H / K, scale: 1 / Math.sqrt(hd) };
  const qk = tf.randomNormal([N, H + K, hd], 0, 1, "float32", 3) as tf.Tensor3D, v = tf.randomNormal([N, K, hd], 0, 1, "float32", 4) as tf.Tensor3D;
  const bias = tf.tensor(Float32Array.from({ length: T * T }, (_, i) => (i % T <= Math.floor(i / T) ? 0 : -1e9)), [1, 1, T, 1, T]), keyStart = new Int32Array(rows);
  const cs = tf.randomNormal([N, 1, cfg.headDim], 0, 1, "float32", 6), rot = tf.randomNormal([cfg.headDim, cfg.headDim], 0, 1, "float32", 7) as tf.Tensor2D;
  for (const fused of [false, true]) {
    setFusedLayers(fused);
    const tag = fused ? "fused" : "composite";
    const count = (name: string, fn: () => tf.Tensor | tf.Tensor[]) => {
      const n0 = counter.read();
      tf.dispose(fn());
      ops[`${name}_${tag}`] = counter.read() - n0;
    };
    count("rmsnorm_forward", () => rmsNorm(x, w, cfg.normEps));
    count("rmsnorm_forward_backward", () => tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsNorm(a, b, cfg.normEps))([x, w], tf.onesLike(x)));
    count("swiglu_forward", () => swiGlu(gu as tf.Tensor2D));
    count("swiglu_forward_backward", () => tf.grads((a: tf.Tensor) => swiGlu(a as tf.Tensor2D))([gu], tf.ones([N, cfg.hiddenDim])));
    count("attention_forward", () => tokenAttention(qk, v, bias, att, keyStart));
    count("attention_forward_backward", () => tf.grads((a: tf.Tensor, b: tf.Tensor) => tokenAttention(a as tf.Tensor3D, b as tf.Tensor3D, bias, att, keyStart))([qk, v], tf.ones([N, H * hd])));
    count("rope_forward_backward", () => tf.grads((a: tf.Tensor) => applyRope(a, cs, cs, rot))([qk], tf.onesLike(qk)));
  }
  tf.dispose([x, w, gu, qk, v, bias, cs, rot]);
  emit({ name: "gpu_fused_layers_ops", config: { rows: N, dim: cfg.dim, hidden: cfg.hiddenDim }, figures: ops, machine: machine(backend, start) });

  const model = deviceModel(cfg, 5);
  const data = rolloutBatch(rows, P, R, cfg.vocabSize, 7);
  const figures: Record<string, unknown> = {};
  for (const fused of [false, true]) {
    setFusedLayers(fused);
    const actor = buildActor(model, rows, micro);
    data.batch.old_log_probs = (await actor.computeLogProb(data, { microBatchSize: micro, maxTokenLen: null }, 1.0, false)).logProbs;
    await actor.updatePolicy(data); // warm-up: shaders, optimizer state
    await drain();
    const ms: number[] = [], host: number[] = [], counts: number[] = [], ups: { n: number; bytes: number }[] = [];
    const tensors = tf.memory().numTensors;
    for (let i = 0; i < args.reps; i++) {
      const n0 = counter.read(), u0 = counter.uploads(), t0 = performance.now();
      await actor.updatePolicy(data);
      counts.push(counter.read() - n0);
      ups.push({ n: counter.uploads().n - u0.n, bytes: counter.uploads().bytes - u0.bytes });
      host.push(performance.now() - t0);
      await drain();
      ms.push(performance.now() - t0);
    }
    const tag = fused ? "fused" : "composite";
    figures[`${tag}_dispatches_per_update`] = counts[0];
    figures[`${tag}_uploads_per_update`] = ups[0]!.n;
    figures[`${tag}_upload_bytes_per_update`] = ups[0]!.bytes;
    figures[`${tag}_ms`] = stats(ms);
    figures[`${tag}_host_ms`] = stats(host);
    figures[`${tag}_tensors_leaked`] = tf.memory().numTensors - tensors;
    actor.optimizer?.dispose();
  }
  setFusedLayers(true);
  figures.tensor_core_calls = tensorCoreStats().calls;
  emit({ name: "gpu_fused_layers_update", config, figures, machine: machine(backend, start) });
  model.dispose();
});
