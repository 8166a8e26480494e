// Kernel dispatches and wall time of one LoRA update (forward, backward, AdamW step) on a random
// Llama of stories260K's shape (dim 64, 5 layers, 8 heads / 4 kv heads, hidden 172, vocab 512),
// all-linear adapters: the per-block LoRA product (loraLinear's "blocks" form) against the batched
// one ("auto"), without dropout, with post-dropout and with pre-dropout on tied q/k/v A's; and full
// fine-tuning's update beside them.
// On a GPU the update is bound by the host's cost per kernel dispatch, so the kernel count is the
// figure that carries over; wall ms here is the wasm backend's (bound by arithmetic instead).
// --backend cpu counts as a GPU backend dispatches: products read w^T in place there, where wasm
// transposes explicitly (extra Transpose kernels) and keeps stacked pre-dropout per block.
// Figures per form: kernels per update (all, and without the data-free Reshape/Identity), the
// products (BatchMatMul), the concats of frozen weights (what a per-version cache would remove),
// median/min/max ms.
// Run: node dist/bench/lora_update.js [--reps 5] [--batch 4] [--seq 64] [--rank 8] [--layers 5] [--dim 64] [--hidden 172] [--backend wasm|cpu]
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { makeConfig } from "../src/models/config.js";
import { initModel } from "../src/models/init.js";
import { LoraAdapter, type LoraSettings } from "../src/models/lora.js";
import { setLoraPath, type LoraPath } from "../src/models/lora_linear.js";
import { Rng } from "../src/utils/rng.js";
import { emit, intFlag, loadAvg1m, machine, parseBenchArgs, runMain, stats } from "./common.js";

const NAME = "lora_update";

runMain(NAME, async () => {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 5, warmup: 1 });
  const B = intFlag(args, "batch", 4), T = intFlag(args, "seq", 64), rank = intFlag(args, "rank", 8), layers = intFlag(args, "layers", 5);
  const dim = intFlag(args, "dim", 64), hidden = intFlag(args, "hidden", 172);
  const backend = args.extra.get("backend") ?? "wasm";
  if (backend !== "wasm" && backend !== "cpu") throw new Error(`benchmark: --backend must be wasm or cpu, got '${backend}'`);
  await initBackend(backend);
  const load0 = loadAvg1m();
  const config = makeConfig({ vocabSize: 512, dim, hiddenDim: hidden, nLayers: layers, nHeads: 8, nKvHeads: 4, tieWordEmbeddings: true, maxSeqLen: 512 });
  const tiedA = Array.from({ length: layers }, (_, i) => ["q_proj", "k_proj", "v_proj"].map((m) => `model.layers.${i}.self_attn.${m}`));
  // full fine-tuning (no adapter) is issue 23's yardstick: a LoRA update should cost no more
  const variants: Record<string, Partial<LoraSettings> | null> = {
    full_finetune: null,
    plain: {},
    dropout_post: { dropout: 0.1, dropoutPosition: "post" },
    dropout_pre_tied_qkv: { dropout: 0.1, dropoutPosition: "pre", tiedA },
  };
  const rng = new Rng(3), idsData = Int32Array.from({ length: B * T }, () => Math.floor(rng.random() * config.vocabSize));
  const figures: Record<string, unknown> = {};
  for (const [variant, extra] of Object.entries(variants)) {
    const m = initModel(config, new Rng(1));
    if (extra) m.lora = LoraAdapter.init(config, { rank, alpha: 2 * rank, targetModules: "all-linear", ...extra }, new Rng(2));
    const opt = tf.train.adam(1e-3);
    const ids = tf.tensor2d(idsData, [B, T], "int32");
    let seed = 0;
    // a next-token loss over the batch (the update's shape; the PPO terms add no LoRA work)
    const update = () => {
      const vars = m.trainableVariables();
      const step = () => opt.minimize(() => tf.tidy(() => {
        const logits = m.forward(ids).slice([0, 0, 0], [B, T - 1, config.vocabSize]);
        const target = tf.oneHot(ids.slice([0, 1], [B, T - 1]), config.vocabSize);
        return tf.losses.softmaxCrossEntropy(target, logits) as tf.Scalar;
      }), false, vars);
      if (m.lora) m.lora.trainingPass(seed++, step);
      else step();
    };
    const row: Record<string, Record<string, unknown>> = {};
    const forms: [string, LoraPath][] = extra ? [["per_block", "blocks"], ["batched", "auto"]] : [["no_adapter", "auto"]];
    const inForm = <T>(path: LoraPath, fn: () => T): T => {
      const prev = setLoraPath(path);
      try {
        return fn();
      } finally {
        setLoraPath(prev);
      }
    };
    for (const [form, path] of forms) {
      for (let i = 0; i < args.warmup; i++) inForm(path, update);
      const live = tf.memory().numTensors;
      const info = await tf.profile(() => inForm(path, update));
      const names = info.kernels.map((k) => k.name);
      row[form] = {
        kernels: names.length,
        kernels_dispatching: names.filter((n) => n !== "Reshape" && n !== "Identity").length,
        products: names.filter((n) => n === "BatchMatMul").length,
        frozen_weight_concats: info.kernels.filter((k) => k.name === "Concat" && k.inputShapes.length > 1 &&
          k.inputShapes.every((s) => s.length === 2 && s[1] === config.dim && s[0]! > rank)).length,
        live_tensor_growth: tf.memory().numTensors - live,
      };
    }
    // the forms' repetitions alternate, so a shared machine's load drifts over both alike
    const ms = forms.map((): number[] => []);
    for (let i = 0; i < args.reps; i++) {
      forms.forEach(([, path], f) => {
        const t0 = performance.now();
        inForm(path, update);
        ms[f]!.push(performance.now() - t0);
      });
    }
    forms.forEach(([form], f) => { row[form]!.ms = stats(ms[f]!); });
    figures[variant] = row;
    ids.dispose();
    opt.dispose();
    m.dispose();
  }
  emit({
    name: NAME,
    config: { model: dim === 64 && hidden === 172 ? "random Llama, stories260K shape" : "random Llama", layers, dim, hidden, batch: B, seq: T, rank, target_modules: "all-linear", optimizer: "adam(1e-3)", reps: args.reps },
    figures,
    machine: machine(backend, load0),
  });
});
