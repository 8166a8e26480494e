// The GPU benchmark (issue: train on the lent H200 through WebGPU). It runs on any
// backend so the CPU and GPU figures come from the same code:
//   node dist/bench/gpu.js --backend wasm  [--only matmul,actor,logprob,large,curve,worker] [--model PATH]
//   bash scripts/gpu-run.sh bench --backend webgpu   (on the GPU machine, after scripts/gpu-bundle.sh)
// `worker` times computeLogProb and updateActor through WorkerGroup(ActorRolloutRefWorker) with
// trainer.device set to the backend: the path `verl train` takes.
// Prints one JSON line per measurement. `curve` prints a PPO loss curve for a fixed
// seed and batch, to compare across backends (same seed, same curve within float tolerance).
import * as tf from "@tensorflow/tfjs";
import { existsSync } from "node:fs";
import { cpus } from "node:os";
import { pathToFileURL } from "node:url";
import { initBackend } from "../src/engine/backend.js";
import { loadConfig } from "../src/config/index.js";
import { initModel } from "../src/models/init.js";
import { makeConfig, numParams, type ModelConfig } from "../src/models/config.js";
import { loadLlama2c } from "../src/models/llama2c.js";
import { LlamaModel, parameterShapes, toVariables } from "../src/models/llama.js";
import { DataProto } from "../src/protocol/index.js";
import { tensor } from "../src/protocol/tensor.js";
import { Collective } from "../src/single_controller/collective.js";
import { Rng } from "../src/utils/rng.js";
import { DataParallelPPOActor } from "../src/workers/actor/dp_actor.js";
import { ConfigView } from "../src/workers/config_view.js";
import { DataParallelOptimizer } from "../src/workers/dp_optimizer.js";
import { AdamW } from "../src/engine/optim/adamw.js";
import { responseLogProbs } from "../src/rollout/log_probs.js";
import { getPolicyLoss } from "../src/trainer/ppo/core_algos/index.js";
import { sharedPath } from "../src/utils/paths.js";
import { storiesConfig } from "./common.js";
import { rolloutBatch as workerBatch, withActorGroup } from "./groups.js";

interface Args { backend: string; only: Set<string>; model?: string; reps: number }

function parseArgs(argv: string[]): Args {
  const a: Args = { backend: "wasm", only: new Set(["matmul", "actor", "logprob", "large", "curve", "worker"]), reps: 3 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i], v = argv[i + 1];
    if (k === "--backend" && v) { a.backend = v; i++; }
    else if (k === "--only" && v) { a.only = new Set(v.split(",")); i++; }
    else if (k === "--model" && v) { a.model = v; i++; }
    else if (k === "--reps" && v) { a.reps = Number(v); i++; }
    else throw new Error(`bench/gpu: unknown argument '${k}' (use --backend, --only, --model, --reps)`);
  }
  return a;
}

const machine = () => ({ cpu: cpus()[0]?.model ?? "unknown", cores: cpus().length, node: process.version, backend: tf.getBackend() });
const emit = (name: string, config: object, figures: object) => console.log(JSON.stringify({ name, config, figures, machine: machine() }));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Wait until the backend has finished all queued work (WebGPU runs asynchronously). */
export async function sync(t?: tf.Tensor): Promise<void> {
  const probe = t ?? tf.scalar(0);
  await probe.data();
  if (!t) probe.dispose();
}

async function benchMatmul(reps: number): Promise<void> {
  const sizes = tf.getBackend() === "webgpu" ? [1024, 2048, 4096, 8192] : [256, 512, 1024];
  for (const n of sizes) {
    const a = tf.randomNormal([n, n], 0, 1, "float32", 1), b = tf.randomNormal([n, n], 0, 1, "float32", 2);
    const iters = tf.getBackend() === "webgpu" ? 10 : 3;
    const times: number[] = [];
    for (let r = 0; r < reps + 1; r++) {
      await sync();
      const t0 = performance.now();
      let c: tf.Tensor | undefined;
      for (let i = 0; i < iters; i++) { c?.dispose(); c = tf.matMul(a, b); }
      await sync(c);
      c!.dispose();
      if (r > 0) times.push((performance.now() - t0) / iters);
    }
    const ms = median(times);
    emit("matmul_f32", { n }, { ms, tflops: (2 * n ** 3) / (ms / 1e3) / 1e12 });
    tf.dispose([a, b]);
  }
}

/** The Qwen2.5-0.5B shape of issue 17 (q/k/v biases, tied embedding). */
export function qwenHalfB(vocabSize: number, nLayers = 24): ModelConfig {
  return makeConfig({ vocabSize, dim: 896, hiddenDim: 4864, nLayers, nHeads: 14, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: true, maxSeqLen: 4096, ropeTheta: 1e6, normEps: 1e-6 });
}

/**
 * Fresh weights made on the device: slices of one normal(0, 0.02) pool at varying offsets
 * (the figures do not depend on the values, and drawing 358M normals in JS takes seconds).
 */
export function deviceModel(cfg: ModelConfig, seed: number): LlamaModel {
  const POOL = 1 << 24, pool = tf.randomNormal([POOL], 0, 0.02, "float32", seed);
  const t = new Map<string, tf.Tensor>();
  let at = 0;
  for (const [name, shape] of parameterShapes(cfg)) {
    const n = shape.reduce((x, y) => x * y, 1);
    if (name.endsWith("norm.weight")) { t.set(name, tf.ones(shape)); continue; }
    if (name.endsWith(".bias")) { t.set(name, tf.zeros(shape)); continue; }
    t.set(name, tf.tidy(() => {
      const parts: tf.Tensor[] = [];
      for (let left = n; left > 0;) {
        const take = Math.min(left, POOL - at);
        parts.push(pool.slice(at, take));
        left -= take;
        at = (at + take + 7919) % (POOL - 8192);
      }
      return tf.concat(parts).reshape(shape);
    }));
  }
  const model = new LlamaModel(cfg, toVariables(t));
  tf.dispose([...t.values(), pool]);
  return model;
}

/** A synthetic rollout batch in verl's layout: B rows, prompts of P (left-padded), responses of R. */
export function rolloutBatch(B: number, P: number, R: number, vocab: number, seed: number): DataProto {
  const rng = new Rng(seed), T = P + R;
  const ids = new Int32Array(B * T), att = new Int32Array(B * T), pos = new Int32Array(B * T);
  const resp = new Int32Array(B * R), rmask = new Int32Array(B * R), adv = new Float32Array(B * R);
  for (let b = 0; b < B; b++) {
    const pLen = Math.max(1, P - rng.int(P / 2)), rLen = Math.max(1, R - rng.int(R / 4));
    let p = 0;
    for (let j = 0; j < T; j++) {
      const valid = j < P ? j >= P - pLen : j - P < rLen;
      const id = valid ? 3 + rng.int(vocab - 3) : 0;
      ids[b * T + j] = id; att[b * T + j] = valid ? 1 : 0; pos[b * T + j] = valid ? p++ : 0;
      if (j >= P) { resp[b * R + j - P] = id; rmask[b * R + j - P] = valid ? 1 : 0; }
    }
    const a = rng.normal();
    for (let t = 0; t < R; t++) adv[b * R + t] = rmask[b * R + t] ? a : 0;
  }
  return DataProto.fromDict({
    input_ids: tensor(ids, [B, T], "int32"), attention_mask: tensor(att, [B, T], "int32"), position_ids: tensor(pos, [B, T], "int32"),
    responses: tensor(resp, [B, R], "int32"), response_mask: tensor(rmask, [B, R], "int32"), advantages: tensor(adv, [B, R], "float32"),
    prompts: tensor(ids.filter((_, i) => i % T < P), [B, P], "int32"),
  }, {}, { temperature: 1.0 });
}

export function buildActor(model: LlamaModel, rows: number, micro: number, lr = 1e-4, extra: string[] = [], optimizerOnDevice?: boolean): DataParallelPPOActor {
  const cfg = loadConfig({ configName: "ppo_trainer", overrides: [`actor_rollout_ref.actor.optim.lr=${lr}`, "actor_rollout_ref.actor.grad_clip=1.0", ...extra] });
  const view = new ConfigView(cfg, "actor_rollout_ref.actor");
  const opt = new DataParallelOptimizer(model.trainableVariables(), view.at("optim"), 1000, Collective.single(), view.num("grad_clip"), { onDevice: optimizerOnDevice });
  return new DataParallelPPOActor(model, opt, { config: view, miniBatchPerRank: rows, microBatchPerRank: micro, seed: 1 });
}

/**
 * One PPO update kept on the device: forward, vanilla clipped loss, backward, global
 * norm clip and a fused AdamW, with no host read but the loss at the end. The worker
 * path (DataParallelPPOActor) reads the flat gradient back once per mini-batch for the
 * cross-rank all-reduce and clips on the host; this shows what staying on the device gives.
 */
export class DeviceStep {
  private readonly vars: tf.Variable[];
  private readonly opt: AdamW;
  private readonly actorCfg = { clip_ratio: 0.2, clip_ratio_low: 0.2, clip_ratio_high: 0.2, clip_ratio_c: 3.0, loss_agg_mode: "token-mean" };
  constructor(private readonly model: LlamaModel, lr: number, private readonly gradClip = 1.0) {
    this.vars = model.trainableVariables();
    this.opt = new AdamW(this.vars, { lr, weightDecay: 0.01 });
  }
  /** old log-probs for `data` (no gradient), left on the device. */
  oldLogProbs(data: DataProto): tf.Tensor2D {
    return tf.tidy(() => responseLogProbs(this.model, data, { temperature: 1 }).logProbs);
  }
  async step(data: DataProto, old: tf.Tensor2D): Promise<{ loss: number; gradNorm: number }> {
    const lossFn = getPolicyLoss("vanilla");
    const mask = tf.tensor2d(data.batch.response_mask!.data as Int32Array, data.batch.response_mask!.shape as [number, number], "int32").toFloat() as tf.Tensor2D;
    const adv = tf.tensor2d(data.batch.advantages!.data as Float32Array, data.batch.advantages!.shape as [number, number]);
    const { value, grads } = tf.variableGrads(() => {
      const logProb = responseLogProbs(this.model, data, { temperature: 1 }).logProbs;
      return lossFn({ oldLogProb: old, logProb, advantages: adv, responseMask: mask, lossAggMode: "token-mean", config: this.actorCfg }).pgLoss as tf.Scalar;
    }, this.vars);
    const norm = tf.tidy(() => {
      const flat = tf.concat(this.vars.map((v) => grads[v.name]!.reshape([-1]))) as tf.Tensor1D;
      const n = flat.square().sum().sqrt();
      const coef = tf.minimum(tf.scalar(1), tf.scalar(this.gradClip).div(n.add(1e-6)));
      this.opt.stepFlat(flat.mul(coef) as tf.Tensor1D);
      return n;
    });
    const [loss, gradNorm] = [(await value.data())[0]!, (await norm.data())[0]!];
    tf.dispose([value, norm, mask, adv, ...Object.values(grads)]);
    return { loss, gradNorm };
  }
}

async function benchDeviceStep(name: string, model: LlamaModel, B: number, P: number, R: number, reps: number): Promise<void> {
  const stepper = new DeviceStep(model, 1e-4);
  const data = rolloutBatch(B, P, R, model.config.vocabSize, 7);
  const old = stepper.oldLogProbs(data);
  const times: number[] = [];
  for (let r = 0; r < reps + 1; r++) {
    await sync();
    const t0 = performance.now();
    await stepper.step(data, old);
    if (r > 0) times.push(performance.now() - t0);
  }
  old.dispose();
  const ms = median(times);
  emit(name, { B, P, R, params: numParams(model.config), path: "device" }, { ms_per_update: ms, tokens_per_s: (B * (P + R)) / (ms / 1e3), min_ms: Math.min(...times), max_ms: Math.max(...times), numTensors: tf.memory().numTensors });
}

async function benchUpdate(name: string, model: LlamaModel, B: number, P: number, R: number, micro: number, reps: number): Promise<void> {
  const actor = buildActor(model, B, micro);
  const data = rolloutBatch(B, P, R, model.config.vocabSize, 7);
  data.batch.old_log_probs = (await actor.computeLogProb(data, { microBatchSize: micro, maxTokenLen: null }, 1.0, false)).logProbs;
  const tokens = B * (P + R);
  const times: number[] = [];
  for (let r = 0; r < reps + 1; r++) {
    await sync();
    const t0 = performance.now();
    await actor.updatePolicy(data);
    await sync();
    if (r > 0) times.push(performance.now() - t0);
  }
  const ms = median(times);
  emit(name, { B, P, R, micro, params: numParams(model.config) }, { ms_per_update: ms, tokens_per_s: tokens / (ms / 1e3), min_ms: Math.min(...times), max_ms: Math.max(...times), numTensors: tf.memory().numTensors });
}

async function benchLogProb(model: LlamaModel, reps: number): Promise<void> {
  const actor = buildActor(model, 64, 64);
  const data = rolloutBatch(64, 32, 224, model.config.vocabSize, 9);
  const times: number[] = [];
  for (let r = 0; r < reps + 1; r++) {
    const t0 = performance.now();
    await actor.computeLogProb(data, { microBatchSize: 64, maxTokenLen: null }, 1.0, false);
    if (r > 0) times.push(performance.now() - t0);
  }
  const ms = median(times);
  emit("logprob_stories260K", { B: 64, T: 256 }, { ms, tokens_per_s: (64 * 256) / (ms / 1e3) });
}

/**
 * The worker path of `verl train`: computeLogProb and updateActor (vanilla PPO, token-mean,
 * AdamW, grad clip) through a one-rank WorkerGroup whose thread runs `backend`, over B
 * sequences of P + R tokens. tokens/s counts every sequence token, as bench/actor_update does.
 */
async function benchWorkerPath(backend: string, modelPath: string, reps: number, B = 64, P = 32, R = 224, micro = 64): Promise<void> {
  const config = storiesConfig(modelPath, 1, [
    `trainer.device=${backend}`, `data.train_batch_size=${B}`, `data.max_prompt_length=${P}`, `data.max_response_length=${R}`,
    `actor_rollout_ref.actor.ppo_mini_batch_size=${B}`, `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${micro}`,
    `actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${micro}`, "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.grad_clip=1.0",
  ]);
  await withActorGroup(config, "actor_rollout", async (g) => {
    const data = workerBatch(B, P, R, 512, 7);
    const batch = data.union((await g.proto("computeLogProb", data)).select(["old_log_probs"]));
    for (const [method, input] of [["computeLogProb", data], ["updateActor", batch]] as const) {
      const times: number[] = [];
      for (let r = 0; r < reps + 1; r++) {
        const t0 = performance.now();
        await g.proto(method, input);
        if (r > 0) times.push(performance.now() - t0);
      }
      const ms = median(times);
      emit(`worker_${method}_stories260K`, { B, P, R, micro, ranks: 1, path: `WorkerGroup(ActorRolloutRefWorker).${method}`, worker_backend: g.backend },
        { ms, tokens_per_s: (B * (P + R)) / (ms / 1e3), min_ms: Math.min(...times), max_ms: Math.max(...times) });
    }
  });
}

/** A fixed-seed PPO loss curve: the same numbers on every backend, within float tolerance. */
async function lossCurve(model: LlamaModel): Promise<void> {
  const stepper = new DeviceStep(model, 3e-4);
  const data = rolloutBatch(16, 16, 48, model.config.vocabSize, 21);
  const old = stepper.oldLogProbs(data);
  const loss: number[] = [], norms: number[] = [];
  for (let s = 0; s < 10; s++) {
    const r = await stepper.step(data, old);
    loss.push(r.loss);
    norms.push(r.gradNorm);
  }
  old.dispose();
  let checksum = 0;
  for (const v of model.trainableVariables()) {
    const t = v.abs().sum();
    checksum += (await t.data())[0]!;
    t.dispose();
  }
  emit("ppo_loss_curve", { steps: 10, B: 16, T: 64, seed: 21 }, { pg_loss: loss, grad_norm: norms, weight_abs_sum: checksum });
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const name = await initBackend(args.backend);
  console.error(`bench/gpu: backend ${name}`);
  const modelPath = args.model ?? sharedPath("models", "stories260K", "stories260K.bin") ?? ".gpu/stories260K/stories260K.bin";
  const haveModel = existsSync(modelPath);
  if (args.only.has("matmul")) await benchMatmul(args.reps);
  if (haveModel) {
    const model = loadLlama2c(modelPath);
    if (args.only.has("curve")) await lossCurve(loadLlama2c(modelPath));
    const gpu = tf.getBackend() === "webgpu";
    if (args.only.has("worker")) await benchWorkerPath(name, modelPath, args.reps);
    if (args.only.has("logprob")) await benchLogProb(model, args.reps);
    if (args.only.has("actor")) {
      await benchDeviceStep("actor_update_stories260K_device", model, 64, 32, 224, args.reps);
      await benchUpdate("actor_update_stories260K_worker_path", loadLlama2c(modelPath), 64, 32, 224, 64, args.reps);
    }
  } else {
    emit("stories260K", {}, { skipped: `model not found at ${modelPath}` });
  }
  if (args.only.has("large")) {
    // ~60M parameters from a fresh config: where the GPU should win by far.
    const cfg: ModelConfig = makeConfig({ vocabSize: 4096, dim: 640, hiddenDim: 1728, nLayers: 12, nHeads: 10, nKvHeads: 10, maxSeqLen: 512 });
    const big = initModel(cfg, new Rng(0));
    const gpu = tf.getBackend() === "webgpu";
    await benchDeviceStep("actor_update_60M_device", big, gpu ? 32 : 2, 32, 224, gpu ? args.reps : 1);
    big.dispose();
  }
}

// bench/gpu_decode.ts imports the batch and actor builders: run only as the entry point
if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main().catch((e: unknown) => {
    console.error(`bench/gpu failed: ${(e as Error).stack ?? String(e)}`);
    process.exit(1);
  });
}
