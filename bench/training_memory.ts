// Training memory and speed of the model keys verl offers for it, on a small but
// not tiny policy (default 6 layers, hidden 384, ffn 1024, 10.6M parameters) on
// wasm: one actor training step (forward + backward of the response log-probs,
// as the PPO update takes them) under
//   - full fine-tuning vs LoRA (lora_rank 16, all-linear),
//   - with and without gradient checkpointing (enable_gradient_checkpointing),
// each in its own process (the wasm heap never shrinks, so its size is that
// case's peak), reporting the step's peak tensor bytes (tf.profile's peakBytes),
// the wasm heap, the bytes the optimizer would hold state for, and seconds; then
//   - padded vs packed (use_remove_padding) on variable-length rows: step seconds.
// Run: node dist/bench/training_memory.js [--reps 2] [--layers 6] [--hidden 384] [--batch 8]
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { makeConfig } from "../src/models/config.js";
import { initModel } from "../src/models/init.js";
import type { LlamaModel } from "../src/models/llama.js";
import { LoraAdapter } from "../src/models/lora.js";
import { DataProto } from "../src/protocol/index.js";
import { tensor } from "../src/protocol/tensor.js";
import { responseLogProbs } from "../src/rollout/log_probs.js";
import { Rng } from "../src/utils/rng.js";
import { emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain, stats, type BenchArgs } from "./common.js";

const NAME = "training_memory";
const MiB = 2 ** 20;
const CASES = ["full", "full_ckpt", "lora", "lora_ckpt", "packing"] as const;
type Case = (typeof CASES)[number];

function modelConfig(args: BenchArgs) {
  const dim = intFlag(args, "hidden", 384);
  return makeConfig({ vocabSize: 1024, dim, hiddenDim: intFlag(args, "ffn", Math.round((8 * dim) / 3 / 64) * 64), nLayers: intFlag(args, "layers", 6), nHeads: dim / 64, nKvHeads: dim / 64 / 2 });
}

/** B rows: prompts left-padded to P, responses right-padded to R; lengths uniform in [min, max] (fixed = all full). */
function batch(B: number, P: number, R: number, variable: boolean, seed: number): DataProto {
  const rng = new Rng(seed), T = P + R;
  const ids = new Int32Array(B * T), mask = new Int32Array(B * T), pos = new Int32Array(B * T), res = new Int32Array(B * R);
  const adv = new Float32Array(B * R), rmask = new Int32Array(B * R);
  for (let b = 0; b < B; b++) {
    const p = variable ? 8 + rng.int(P - 7) : P, r = variable ? 8 + rng.int(R - 7) : R;
    let c = 0;
    for (let t = 0; t < T; t++) {
      const real = t < P ? t >= P - p : t - P < r;
      if (!real) continue;
      ids[b * T + t] = 1 + rng.int(1023); mask[b * T + t] = 1; pos[b * T + t] = c++;
      if (t >= P) { res[b * R + t - P] = ids[b * T + t]!; rmask[b * R + t - P] = 1; adv[b * R + t - P] = rng.normal(); }
    }
  }
  return new DataProto({
    input_ids: tensor(ids, [B, T], "int32"), attention_mask: tensor(mask, [B, T], "int32"), position_ids: tensor(pos, [B, T], "int32"),
    responses: tensor(res, [B, R], "int32"), response_mask: tensor(rmask, [B, R], "int32"), advantages: tensor(adv, [B, R], "float32"),
  }, {}, {});
}

/** One training step's gradients (disposed); the loss weighs each log-prob by its advantage. */
function trainStep(m: LlamaModel, d: DataProto, removePadding: boolean): void {
  const { value, grads } = tf.variableGrads(() => {
    const { logProbs } = responseLogProbs(m, d, { removePadding });
    const w = tf.tensor(d.batch.advantages!.data as Float32Array, logProbs.shape);
    return tf.sum(tf.mul(logProbs, w)) as tf.Scalar;
  }, m.trainableVariables());
  tf.dispose([value, ...Object.values(grads)]);
}

function wasmHeapMiB(): number {
  const be = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
  return Number(((be.wasm?.HEAPU8?.buffer.byteLength ?? 0) / MiB).toFixed(1));
}

async function timed(reps: number, f: () => void): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    f();
    out.push((performance.now() - t0) / 1000);
  }
  return out;
}

async function runCase(name: Case, args: BenchArgs): Promise<Record<string, unknown>> {
  await initBackend("wasm");
  const config = modelConfig(args), B = intFlag(args, "batch", 8);
  const m = initModel(config, new Rng(1));
  const paramMiB = [...m.params.values()].reduce((a, v) => a + v.size * 4, 0) / MiB;
  if (name === "packing") {
    const d = batch(2 * B, 64, 128, true, 7);
    const real = Array.from(d.batch.attention_mask!.data).reduce((a, x) => a + x, 0);
    trainStep(m, d, false); // warm-up (kernels, heap growth)
    const padded = await timed(args.reps, () => trainStep(m, d, false));
    trainStep(m, d, true);
    const packed = await timed(args.reps, () => trainStep(m, d, true));
    const sp = stats(padded), sk = stats(packed);
    return {
      rows: 2 * B, padded_tokens: d.batch.input_ids!.data.length, real_tokens: real,
      step_s_padded: sp, step_s_packed: sk, speedup: Number((sp.median / sk.median).toFixed(2)),
    };
  }
  const lora = name.startsWith("lora");
  if (lora) m.lora = LoraAdapter.init(config, { rank: 16, alpha: 32, targetModules: "all-linear" }, new Rng(2));
  m.gradientCheckpointing = name.endsWith("_ckpt");
  const d = batch(B, 64, 128, false, 7);
  const before = tf.memory().numBytes;
  const prof = await tf.profile(() => trainStep(m, d, false));
  const times = await timed(args.reps, () => trainStep(m, d, false));
  const trainableMiB = m.trainableVariables().reduce((a, v) => a + v.size * 4, 0) / MiB;
  return {
    tokens: B * 192,
    weights_MiB: Number(paramMiB.toFixed(1)),
    trainable_MiB: Number(trainableMiB.toFixed(2)),
    // AdamW keeps two moments per trainable float
    optimizer_state_MiB: Number((2 * trainableMiB).toFixed(2)),
    step_peak_tensor_MiB: Number((prof.peakBytes / MiB).toFixed(1)),
    step_peak_above_weights_MiB: Number(((prof.peakBytes - before) / MiB).toFixed(1)),
    wasm_heap_MiB: wasmHeapMiB(),
    step_s: stats(times),
  };
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  const args = parseBenchArgs(argv, { reps: 2 });
  const one = args.extra.get("case");
  if (one) {
    if (!(CASES as readonly string[]).includes(one)) throw new Error(`--case must be one of ${CASES.join(", ")}`);
    process.stdout.write(JSON.stringify(await runCase(one as Case, args)) + "\n");
    return;
  }
  const load0 = loadAvg1m();
  const figures: Record<string, unknown> = {};
  const script = fileURLToPath(import.meta.url);
  for (const c of CASES) {
    const r = spawnSync(process.execPath, [script, ...argv, "--case", c], { encoding: "utf8", maxBuffer: 1 << 24 });
    if (r.status !== 0) throw new Error(`case ${c} failed: ${r.stderr.slice(-2000)}`);
    figures[c] = JSON.parse(r.stdout.trim().split("\n").pop()!);
  }
  const c = modelConfig(args);
  emit({
    name: NAME,
    config: {
      model: { layers: c.nLayers, hidden: c.dim, ffn: c.hiddenDim, heads: c.nHeads, kv_heads: c.nKvHeads, vocab: c.vocabSize },
      step: "forward + backward of response log-probs (advantage-weighted sum), one process per case",
      memory_cases: `${intFlag(args, "batch", 8)} rows x (64 prompt + 128 response) tokens, all real`,
      packing_case: `${2 * intFlag(args, "batch", 8)} rows, prompts 8-64 left-padded to 64, responses 8-128 right-padded to 128`,
      lora: { rank: 16, alpha: 32, target_modules: "all-linear" },
      reps: args.reps,
    },
    figures,
    machine: machine("wasm", load0),
  });
}

runMain(NAME, main);
