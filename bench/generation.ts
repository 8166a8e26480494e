// Rollout and training throughput for stories260K on one thread. Prints one JSON
// line: generated tokens/s at batch 1 and batch 64 (128 new tokens, temperature 1,
// EOS ignored so every row generates the full length) and training tokens/s for
// an actor update (forward + backward + AdamW) on 64 x 256 tokens.
// Run: node dist/bench/generation.js   (VERL_BENCH_BACKEND=wasm|cpu, VERL_BENCH_QUICK=1 for a short run)
// Medians over repeats, so a busy machine disturbs the figures less; each figure
// also comes per CPU-second of this process (wall time overstates the cost when
// other processes share the cores).
import os from "node:os";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { AdamW } from "../src/engine/optim/index.js";
import { loadLlama2c } from "../src/models/llama2c.js";
import type { LlamaModel } from "../src/models/llama.js";
import { DataProto } from "../src/protocol/data_proto.js";
import { tensor } from "../src/protocol/tensor.js";
import { generate, defaultSamplingParams, leftPadPrompts, responseLogProbs } from "../src/rollout/index.js";
import { sharedPath } from "../src/utils/paths.js";
import { Rng } from "../src/utils/rng.js";

const quick = process.env.VERL_BENCH_QUICK === "1";
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

interface Timing { seconds: number; cpuSeconds: number; work: number }

function timeIt(repeats: number, f: () => number): Timing {
  f(); // warm-up: XNNPACK operators, tfjs kernels
  const runs: Timing[] = [];
  for (let i = 0; i < repeats; i++) {
    const c0 = process.cpuUsage(), t0 = performance.now();
    const work = f();
    const c = process.cpuUsage(c0);
    runs.push({ seconds: (performance.now() - t0) / 1000, cpuSeconds: (c.user + c.system) / 1e6, work });
  }
  const m = median(runs.map((r) => r.seconds));
  return runs.find((r) => r.seconds === m)!;
}

const rate = (t: Timing) => ({ perS: Math.round(t.work / t.seconds), perCpuS: Math.round(t.work / t.cpuSeconds) });

function genThroughput(model: LlamaModel, batch: number, newTokens: number, rng: Rng): Timing {
  // story openings of different lengths (tok512 ids), left-padded
  const openings = [[1, 403, 407, 261, 378], [1, 403], [1, 378, 261, 407], [1, 346, 280]];
  const prompts = Array.from({ length: batch }, (_, i) => openings[i % openings.length]!);
  const data = leftPadPrompts(prompts, 0);
  const params = defaultSamplingParams({ temperature: 1, responseLength: newTokens, eosTokenIds: [2], ignoreEos: true, padTokenId: 0 });
  return timeIt(quick ? 1 : 3, () => {
    const out = generate(model, data, params, rng);
    let n = 0;
    for (const v of out.batch["response_mask"]!.data) n += v;
    return n;
  });
}

function trainThroughput(model: LlamaModel, B: number, T: number, R: number, rng: Rng): Timing {
  const V = model.config.vocabSize, P = T - R;
  const ids = Int32Array.from({ length: B * T }, () => 3 + rng.int(V - 3));
  const micro = new DataProto({
    input_ids: tensor(ids, [B, T], "int32"),
    attention_mask: tensor(new Int32Array(B * T).fill(1), [B, T], "int32"),
    position_ids: tensor(Int32Array.from({ length: B * T }, (_, i) => i % T), [B, T], "int32"),
    responses: tensor(Int32Array.from({ length: B * R }, (_, i) => ids[Math.floor(i / R) * T + P + (i % R)]!), [B, R], "int32"),
  });
  const adv = tf.tensor2d(Float32Array.from({ length: B * R }, () => rng.normal()), [B, R]);
  const vars = model.trainableVariables();
  const opt = new AdamW(vars, { lr: 1e-5, weightDecay: 0.01 });
  try {
    return timeIt(quick ? 1 : 3, () => {
      const { value, grads } = tf.variableGrads(() => {
        const { logProbs } = responseLogProbs(model, micro, { temperature: 1 });
        return tf.mean(tf.mul(logProbs, adv)).neg() as tf.Scalar;
      }, vars);
      const flat = tf.tidy(() => tf.concat(vars.map((v) => grads[v.name]!.reshape([-1]))) as tf.Tensor1D);
      opt.stepFlat(flat);
      tf.dispose([value, flat, ...Object.values(grads)]);
      return B * T;
    });
  } finally {
    opt.dispose();
    adv.dispose();
  }
}

async function main(): Promise<void> {
  const bin = sharedPath("models", "stories260K", "stories260K.bin");
  if (!bin) {
    process.stdout.write(JSON.stringify({ bench: "generation", skipped: "../shared/models/stories260K absent" }) + "\n");
    return;
  }
  const backend = await initBackend(process.env.VERL_BENCH_BACKEND ?? "wasm");
  const model = loadLlama2c(bin);
  const rng = new Rng(0);
  const newTokens = quick ? 32 : 128;
  const b1 = genThroughput(model, 1, newTokens, rng);
  const b64 = genThroughput(model, 64, newTokens, rng);
  const train = trainThroughput(model, quick ? 16 : 64, quick ? 128 : 256, quick ? 64 : 192, rng);
  const [g1, g64, tr] = [rate(b1), rate(b64), rate(train)];
  process.stdout.write(JSON.stringify({
    bench: "generation", model: "stories260K", backend, threads: 1, new_tokens: newTokens,
    gen_tokens_per_s_batch1: g1.perS, gen_tokens_per_cpu_s_batch1: g1.perCpuS,
    gen_tokens_per_s_batch64: g64.perS, gen_tokens_per_cpu_s_batch64: g64.perCpuS,
    train_tokens_per_s: tr.perS, train_tokens_per_cpu_s: tr.perCpuS, train_step_s: Number(train.seconds.toFixed(3)),
    train_batch: quick ? "16x128" : "64x256", load_avg_1m: Number(os.loadavg()[0]!.toFixed(2)),
  }) + "\n");
  model.dispose();
}

await main();
