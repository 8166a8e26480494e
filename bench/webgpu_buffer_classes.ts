// GPU buffers created per actor-update step on the WebGPU backend when the micro-batches' token
// totals vary (remove-padding packs real tokens, dynamic batch size takes micro-batches by token
// budget), full fine-tuning and LoRA, with size classes on or off (VERL_WEBGPU_SIZE_CLASSES,
// src/engine/webgpu_buffer_pool.ts). Each step accumulates the gradients of --micro packed
// micro-batches ([1, T] with T drawn in [--tmin, --tmax], the same draws in every run) and applies
// them with Adam. Figures per variant: buffers created (BufferManager misses) and their MB per step
// after the first (warm-up) step, the peak bytes tfjs holds, and a hash of the final weights' bits
// (equal with classes on and off: the results are bit-identical).
// Counts only: on llvmpipe (no GPU) the times say nothing about a GPU.
// Run: VERL_DAWN_FLAGS=backend=opengl VERL_WEBGPU_FEATURE_LEVEL=compatibility EGL_PLATFORM=surfaceless \
//   [VERL_WEBGPU_SIZE_CLASSES=0] node dist/bench/webgpu_buffer_classes.js [--steps 4] [--micro 4] [--tmin 96] [--tmax 160]
import * as tf from "@tensorflow/tfjs";
import { createHash } from "node:crypto";
import { initBackend } from "../src/engine/backend.js";
import { freePoolStats, sizeClassesEnabled } from "../src/engine/webgpu_buffer_pool.js";
import { makeConfig } from "../src/models/config.js";
import { initModel } from "../src/models/init.js";
import { LoraAdapter } from "../src/models/lora.js";
import { Rng } from "../src/utils/rng.js";
import { emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain } from "./common.js";

const NAME = "webgpu_buffer_classes";

runMain(NAME, async () => {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 1 });
  const steps = intFlag(args, "steps", 4), micro = intFlag(args, "micro", 4), tmin = intFlag(args, "tmin", 96), tmax = intFlag(args, "tmax", 160);
  const layers = intFlag(args, "layers", 2), dim = intFlag(args, "dim", 64), hidden = intFlag(args, "hidden", 172), rank = intFlag(args, "rank", 8);
  await initBackend("webgpu");
  const load0 = loadAvg1m();
  const manager = (tf.backend() as unknown as { bufferManager: { numBytesAllocated: number } }).bufferManager;
  const pool = freePoolStats(manager);
  if (!pool) throw new Error("benchmark: the free-pool wrapper is not installed on the WebGPU backend");
  // every GPUDevice.createBuffer, by kind (the pool's misses plus upload staging, which tfjs never reuses)
  const device = (tf.backend() as unknown as { device: { createBuffer(d: { size: number; usage: number }): unknown } }).device;
  const byUsage = new Map<string, number>(), create = device.createBuffer.bind(device);
  device.createBuffer = (d) => {
    const kind = d.usage & 0x40 ? "uniform" : d.usage & 0x2 ? "upload_staging" : d.usage & 0x1 ? "readback_staging" : "storage";
    byUsage.set(kind, (byUsage.get(kind) ?? 0) + 1);
    return create(d);
  };
  const config = makeConfig({ vocabSize: 512, dim, hiddenDim: hidden, nLayers: layers, nHeads: 8, nKvHeads: 4, tieWordEmbeddings: true, maxSeqLen: 512 });
  const figures: Record<string, unknown> = {};
  for (const variant of ["full_finetune", "lora"]) {
    const m = initModel(config, new Rng(1));
    if (variant === "lora") m.lora = LoraAdapter.init(config, { rank, alpha: 2 * rank, targetModules: "all-linear" }, new Rng(2));
    const opt = tf.train.adam(1e-3), rng = new Rng(3);
    const perStep: { created: number; mb: number }[] = [];
    let kinds: Record<string, number> = {};
    let peak = 0;
    for (let s = 0; s < steps; s++) {
      const c0 = pool.created, b0 = pool.bytesCreated;
      byUsage.clear();
      const vars = m.trainableVariables();
      let acc: tf.NamedTensorMap | null = null;
      for (let k = 0; k < micro; k++) {
        const T = tmin + Math.floor(rng.random() * (tmax - tmin + 1));
        const ids = tf.tensor2d(Int32Array.from({ length: T }, () => Math.floor(rng.random() * config.vocabSize)), [1, T], "int32");
        const pass = () => tf.variableGrads(() => tf.tidy(() => {
          const logits = m.forward(ids).slice([0, 0, 0], [1, T - 1, config.vocabSize]);
          return tf.losses.softmaxCrossEntropy(tf.oneHot(ids.slice([0, 1], [1, T - 1]), config.vocabSize), logits) as tf.Scalar;
        }), vars);
        const { value, grads } = m.lora ? m.lora.trainingPass(s * micro + k, pass) : pass();
        value.dispose();
        ids.dispose();
        if (acc === null) acc = grads;
        else {
          const prev: tf.NamedTensorMap = acc;
          acc = Object.fromEntries(Object.entries(grads).map(([n, g]) => [n, tf.add(prev[n]!, g)]));
          tf.dispose(prev);
          tf.dispose(grads);
        }
        peak = Math.max(peak, manager.numBytesAllocated);
      }
      opt.applyGradients(acc! as unknown as Parameters<typeof opt.applyGradients>[0]);
      tf.dispose(acc!);
      await vars[0]!.data(); // let the queue drain before the next step's count
      peak = Math.max(peak, manager.numBytesAllocated);
      kinds = Object.fromEntries(byUsage); // the last step's
      perStep.push({ created: pool.created - c0, mb: +((pool.bytesCreated - b0) / 2 ** 20).toFixed(3) });
    }
    const hash = createHash("sha256");
    for (const v of m.trainableVariables()) hash.update(Buffer.from((await v.data()).buffer as ArrayBuffer));
    figures[variant] = {
      created_per_step: perStep.map((p) => p.created), created_mb_per_step: perStep.map((p) => p.mb),
      created_after_warmup_mean: perStep.length > 1 ? +(perStep.slice(1).reduce((a, p) => a + p.created, 0) / (perStep.length - 1)).toFixed(1) : null,
      device_creates_last_step: kinds, peak_allocated_mb: +(peak / 2 ** 20).toFixed(3), weights_sha256: hash.digest("hex").slice(0, 16),
    };
    opt.dispose();
    m.dispose();
  }
  emit({
    name: NAME,
    config: { size_classes: sizeClassesEnabled(), layers, dim, hidden, rank, steps, micro, tokens: `${tmin}-${tmax}`, model: "random Llama", target_modules: "all-linear" },
    figures,
    machine: machine("webgpu", load0),
  });
});
