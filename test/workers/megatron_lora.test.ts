// verl's Megatron LoRA keys (model.lora.*) on the PEFT-layout adapters: the module-name
// translation, A's initialisation, the refusals by key, and a megatron-config run end to end.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { LoraAdapter } from "../../src/models/lora.js";
import { validatePpoNames } from "../../src/trainer/ppo/validate_names.js";
import { Rng } from "../../src/utils/rng.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { megatronLoraTargets, readMegatronLora } from "../../src/workers/megatron_lora.js";
import { makeWorkspace, runTrain, scratchModel } from "../trainer/ppo/trainer/fixtures.js";

const M = "actor_rollout_ref.model";
const model = makeConfig({ vocabSize: 40, dim: 16, hiddenDim: 24, nLayers: 2, nHeads: 4, nKvHeads: 2, tieWordEmbeddings: false, maxSeqLen: 64 });

function lora(overrides: string[], at = M) {
  const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides });
  return readMegatronLora(new ConfigView(cfg, at));
}

const CANONICAL = `${M}.lora.target_modules=[linear_q,linear_k,linear_v,linear_proj,linear_fc1_up,linear_fc1_gate,linear_fc2]`;

test("Megatron LoRA names map onto the HF modules: canonical_lora, unfused type=lora modules, wildcards, exclude_modules", () => {
  assert.equal(lora([]), null, "rank 0 (verl's default) is off");
  const canon = lora([`${M}.lora.rank=4`, `${M}.lora.type=canonical_lora`, CANONICAL])!;
  assert.deepEqual({ rank: canon.rank, alpha: canon.alpha, initA: canon.initA }, { rank: 4, alpha: 32, initA: "xavier" }, "verl's megatron defaults: alpha 32, xavier A");
  const leaves = (names: string[]) => names.map((n) => n.replace(/^model\.layers\.(\d+)\./, "$1."));
  assert.deepEqual(leaves(megatronLoraTargets(model, canon)), [0, 1].flatMap((i) =>
    ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"].map((m) => `${i}.${m}`)));

  const unfused = lora([`${M}.lora.rank=4`, `${M}.lora.target_modules=[linear_proj,linear_fc2]`])!;
  assert.deepEqual(leaves(megatronLoraTargets(model, unfused)), ["0.self_attn.o_proj", "0.mlp.down_proj", "1.self_attn.o_proj", "1.mlp.down_proj"]);

  const wild = lora([`${M}.lora.rank=2`, `${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=['*.layers.1.*.linear_q','*.linear_fc2']`])!;
  assert.deepEqual(leaves(megatronLoraTargets(model, wild)), ["0.mlp.down_proj", "1.self_attn.q_proj", "1.mlp.down_proj"]);

  const excl = lora([`${M}.lora.rank=2`, `${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=[]`, `${M}.lora.exclude_modules=[linear_fc1_up,linear_fc1_gate,linear_fc2]`])!;
  assert.deepEqual(leaves(megatronLoraTargets(model, excl)), [0, 1].flatMap((i) => ["q_proj", "k_proj", "v_proj", "o_proj"].map((m) => `${i}.self_attn.${m}`)));

  // the critic's section reads the same way
  assert.equal(lora(["critic.model.lora.rank=8", "critic.model.lora.alpha=16", "critic.model.lora.target_modules=[linear_proj]"], "critic.model")!.alpha, 16);
});

test("Megatron LoRA options without a PEFT equivalent are refused naming the key (fused qkv/fc1, dora, dropout, B init, adapter checkpoints)", () => {
  // verl's default targets: linear_qkv, linear_proj, linear_fc1, linear_fc2
  assert.throws(() => lora([`${M}.lora.rank=4`]), /actor_rollout_ref\.model\.lora\.target_modules: lora\.type=lora adapts linear_qkv as one fused module .*canonical_lora/);
  assert.throws(() => lora([`${M}.lora.rank=4`, `${M}.lora.target_modules=[]`, `${M}.lora.exclude_modules=[linear_qkv]`]), /lora\.exclude_modules: lora\.type=lora adapts linear_fc1 as one fused module/);
  // a wildcard whose leaf is no fused name is only resolved against the model, and refused there
  const wild = lora([`${M}.lora.rank=4`, `${M}.lora.target_modules=['*.layers.0.*']`])!;
  assert.throws(() => megatronLoraTargets(model, wild), /lora\.type=lora adapts linear_qkv as one fused module/);
  const bad: [string[], RegExp][] = [
    [[`${M}.lora.type=dora`], /lora\.type=dora: DoRA/],
    [[`${M}.lora.type=vlm_lora`], /vision-language models are not built/],
    [[`${M}.lora.dropout=0.1`], /actor_rollout_ref\.model\.lora\.dropout=0\.1: LoRA dropout is not built/],
    [[`${M}.lora.lora_B_init_method=normal`], /lora_B_init_method=normal: only zero is built/],
    [[`${M}.lora.lora_A_init_method=orthogonal`], /lora_A_init_method is "orthogonal"; choose one of xavier, kaiming, normal/],
    [[`${M}.lora.type=canonical_lora`], /target_modules names 'linear_qkv', not a module of lora\.type=canonical_lora/],
    [[`${M}.lora.exclude_modules=[linear_fc2]`], /exclude_modules needs actor_rollout_ref\.model\.lora\.target_modules empty/],
    [[`++${M}.lora.adapter_path=/x`], /lora\.adapter_path: Megatron-Bridge adapter checkpoints cannot be read here; .*lora_adapter_path/],
  ];
  for (const [o, re] of bad) assert.throws(() => lora([`${M}.lora.rank=4`, ...o]), re, o.join(" "));
  const typo = lora([`${M}.lora.rank=4`, `${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=['*.layers.7.*.linear_q']`])!;
  assert.throws(() => megatronLoraTargets(model, typo), /names '\*\.layers\.7\.\*\.linear_q', which matches no linear module/);
  // before any worker starts: validatePpoNames lists it (exit 2)
  const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides: [`${M}.lora.rank=4`, `${M}.lora.dropout=0.05`] });
  assert.throws(() => validatePpoNames(cfg), /invalid names or ranges[\s\S]*LoRA dropout is not built/);
});

test("lora_A_init_method: xavier draws A ~ N(0, 2 / (in + r)) (Megatron-Bridge's), kaiming is peft's uniform; B starts at zero", async () => {
  await initBackend("cpu");
  const big = makeConfig({ vocabSize: 40, dim: 256, hiddenDim: 64, nLayers: 1, nHeads: 4, nKvHeads: 4, tieWordEmbeddings: false, maxSeqLen: 16 });
  const target = ["model.layers.0.self_attn.q_proj"], r = 8;
  const stats = (init: "xavier" | "kaiming") => {
    const a = LoraAdapter.init(big, { rank: r, alpha: 16, targetModules: target, initA: init }, new Rng(3));
    const m = a.modules.get(target[0]!)!;
    const v = m.a.dataSync(), b = m.b.dataSync();
    let s2 = 0, max = 0;
    for (const x of v) { s2 += x * x; max = Math.max(max, Math.abs(x)); }
    const out = { std: Math.sqrt(s2 / v.length), max, bZero: b.every((x) => x === 0) };
    a.dispose();
    return out;
  };
  const x = stats("xavier"), k = stats("kaiming");
  const want = Math.sqrt(2 / (256 + r));
  assert.ok(Math.abs(x.std - want) / want < 0.05, `xavier std ${x.std} vs ${want}`);
  assert.ok(x.max > 1 / Math.sqrt(256), "normal draws exceed kaiming's uniform bound");
  assert.ok(k.max <= 1 / Math.sqrt(256) && Math.abs(k.std - 1 / Math.sqrt(3 * 256)) / k.std < 0.05, `kaiming uniform ${k.std}`);
  assert.ok(x.bZero && k.bZero);
});

test("verl train --config-name ppo_megatron_trainer with lora.*: trains the adapter and checkpoints it as a peft folder; the fused default stops at start", async () => {
  const ws = await makeWorkspace();
  try {
    const base = [...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
      `${M}.lora.rank=4`, `${M}.lora.alpha=8`];
    const fused = await runTrain(["--config-name", "ppo_megatron_trainer", ...base, `trainer.default_local_dir=${ws.dir}/c0`], {});
    assert.equal(fused.code, 2, fused.stderr);
    assert.match(fused.stderr, /lora\.type=lora adapts linear_qkv as one fused module/);

    const ok = await runTrain(["--config-name", "ppo_megatron_trainer", ...base, `${M}.lora.type=canonical_lora`, CANONICAL,
      "trainer.save_freq=1", `trainer.default_local_dir=${ws.dir}/c1`], {});
    assert.equal(ok.code, 0, ok.stderr);
    const adapter = JSON.parse(readFileSync(join(ws.dir, "c1/global_step_1/actor/lora_adapter/adapter_config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(adapter.r, 4);
    assert.equal(adapter.lora_alpha, 8);
    assert.deepEqual(adapter.target_modules, ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
