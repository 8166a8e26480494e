// critic.model's memory keys: LoRA on the value trunk (adapters + score head train,
// the base stays), remove-padding and gradient checkpointing through the critic update.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.js";
import { loadConfig } from "../../../src/config/index.js";
import { ValueHeadModel } from "../../../src/models/index.js";
import { tensor } from "../../../src/protocol/tensor.js";
import { Collective } from "../../../src/single_controller/collective.js";
import { Rng } from "../../../src/utils/rng.js";
import { DataParallelPPOCritic } from "../../../src/workers/critic/dp_critic.js";
import { ConfigView } from "../../../src/workers/config_view.js";
import { DataParallelOptimizer } from "../../../src/workers/dp_optimizer.js";
import { applyModelMemoryOptions, readModelMemoryOptions } from "../../../src/workers/model_options.js";
import { syntheticBatch, tinyConfig } from "../helpers.js";

test("critic.model LoRA + remove-padding + checkpointing: adapters and score head train, base weights do not, vf_loss falls", async () => {
  await initBackend("wasm");
  const cfg = loadConfig({
    configName: "ppo_trainer",
    overrides: ["critic.optim.lr=0.02", "critic.optim.weight_decay=0.0", "critic.cliprange_value=100.0",
      "critic.model.lora_rank=4", "++critic.model.target_modules=[q_proj,v_proj,down_proj]", "critic.model.use_remove_padding=true"],
  });
  const view = new ConfigView(cfg, "critic");
  const opts = readModelMemoryOptions(view.at("model"), { removePadding: false });
  assert.equal(opts.removePadding, true);
  assert.equal(opts.gradientCheckpointing, true, "verl's default");
  const model = ValueHeadModel.init(tinyConfig(), new Rng(4));
  applyModelMemoryOptions(model.trunk, opts, view.at("model"), 1);
  const names = [...model.trainableParams().keys()];
  assert.equal(names.length, 2 * 3 * 2 + 2);
  assert.ok(names.includes("score.weight") && names.includes("score.bias"));
  const base = model.params.get("model.layers.0.mlp.up_proj.weight")!.dataSync().slice();
  const opt = new DataParallelOptimizer(model.trainableVariables(), view.at("optim"), 10, Collective.single(), 1.0);
  const critic = new DataParallelPPOCritic(model, opt, { config: view, miniBatchPerRank: 4, microBatchPerRank: 2, forwardSpec: { microBatchSize: 2, maxTokenLen: null }, seed: 1, removePadding: opts.removePadding });
  const data = syntheticBatch(4, 4, 5, 32, 8);
  const mask = data.batch.response_mask!.data;
  data.batch.returns = tensor(Float32Array.from(mask, (m, i) => (m ? 0.5 + 0.1 * (i % 3) : 0)), [4, 5], "float32");
  const losses: number[] = [];
  for (let i = 0; i < 8; i++) {
    data.batch.values = await critic.computeValues(data);
    losses.push((await critic.updateCritic(data))["critic/vf_loss"]![0]!);
  }
  assert.ok(losses[7]! < 0.5 * losses[0]!, `vf_loss should fall: ${losses.map((l) => l.toFixed(4)).join(" ")}`);
  assert.deepEqual(Array.from(model.params.get("model.layers.0.mlp.up_proj.weight")!.dataSync()), Array.from(base), "the frozen base is untouched");
  model.dispose();
  opt.dispose();
  assert.throws(() => readModelMemoryOptions(new ConfigView(loadConfig({ configName: "ppo_trainer", overrides: ["critic.model.lora_rank=-1"] }), "critic.model")), /critic\.model\.lora_rank must be 0/);
});

test("critic.model.lora.dropout and type=dora (Megatron's keys): values (eval) are unaffected by dropout, the update is not; the same seed gives the same update", async () => {
  await initBackend("cpu");
  const build = (extra: string[]) => {
    const cfg = loadConfig({
      configName: "ppo_megatron_trainer",
      overrides: ["critic.optim.lr=0.02", "critic.model.lora.rank=4", "critic.model.lora.type=dora", "critic.model.lora.lora_B_init_method=xavier", ...extra],
    });
    const view = new ConfigView(cfg, "critic");
    const model = ValueHeadModel.init(tinyConfig(), new Rng(4));
    applyModelMemoryOptions(model.trunk, readModelMemoryOptions(view.at("model"), { removePadding: false }), view.at("model"), 1);
    const opt = new DataParallelOptimizer(model.trainableVariables(), view.at("optim"), 10, Collective.single(), 1.0);
    const critic = new DataParallelPPOCritic(model, opt, {
      config: view, miniBatchPerRank: 4, microBatchPerRank: 2, forwardSpec: { microBatchSize: 2, maxTokenLen: null }, seed: 1, adapter: model.trunk.lora,
    });
    return { model, opt, critic };
  };
  const plain = build([]), drop = build(["critic.model.lora.dropout=0.3"]), twin = build(["critic.model.lora.dropout=0.3"]);
  assert.ok(plain.model.trainableParams().has("model.layers.0.self_attn.q_proj.lora_magnitude_vector"), "DoRA trains m on the value trunk");
  const data = syntheticBatch(4, 4, 5, 32, 8);
  const mask = data.batch.response_mask!.data;
  data.batch.returns = tensor(Float32Array.from(mask, (m, i) => (m ? 0.5 + 0.1 * (i % 3) : 0)), [4, 5], "float32");
  const vp = await plain.critic.computeValues(data), vd = await drop.critic.computeValues(data);
  assert.deepEqual(Array.from(vd.data), Array.from(vp.data), "values are computed without dropout");
  data.batch.values = vp;
  const mp = await plain.critic.updateCritic(data), md = await drop.critic.updateCritic(data), mt = await twin.critic.updateCritic(data);
  assert.notEqual(md["critic/vf_loss"]![0], mp["critic/vf_loss"]![0], "the update's forward drops adapter units");
  assert.deepEqual([md["critic/vf_loss"], md["critic/grad_norm"]], [mt["critic/vf_loss"], mt["critic/grad_norm"]], "same seed, same update");
  for (const b of [plain, drop, twin]) { b.model.dispose(); b.opt.dispose(); }
});
