// verl's Megatron LoRA keys (model.lora.*) on the PEFT-layout adapters: the module-name
// translation, A's initialisation, the refusals by key, and a megatron-config run end to end.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { loadConfig } from "../../src/config/index.js";
import { initBackend } from "../../src/engine/backend.js";
import { makeConfig } from "../../src/models/config.js";
import { LoraAdapter } from "../../src/models/lora.js";
import { readSafetensors } from "../../src/models/safetensors.js";
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
  assert.deepEqual(leaves(megatronLoraTargets(model, canon).targets), [0, 1].flatMap((i) =>
    ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"].map((m) => `${i}.${m}`)));

  const unfused = lora([`${M}.lora.rank=4`, `${M}.lora.target_modules=[linear_proj,linear_fc2]`])!;
  assert.deepEqual(leaves(megatronLoraTargets(model, unfused).targets), ["0.self_attn.o_proj", "0.mlp.down_proj", "1.self_attn.o_proj", "1.mlp.down_proj"]);

  const wild = lora([`${M}.lora.rank=2`, `${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=['*.layers.1.*.linear_q','*.linear_fc2']`])!;
  assert.deepEqual(leaves(megatronLoraTargets(model, wild).targets), ["0.mlp.down_proj", "1.self_attn.q_proj", "1.mlp.down_proj"]);

  const excl = lora([`${M}.lora.rank=2`, `${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=[]`, `${M}.lora.exclude_modules=[linear_fc1_up,linear_fc1_gate,linear_fc2]`])!;
  assert.deepEqual(leaves(megatronLoraTargets(model, excl).targets), [0, 1].flatMap((i) => ["q_proj", "k_proj", "v_proj", "o_proj"].map((m) => `${i}.self_attn.${m}`)));

  // type=lora (verl's default) on the fused modules: every part adapted, A shared per fused module
  const fused = megatronLoraTargets(model, lora([`${M}.lora.rank=4`])!);
  assert.equal(fused.targets.length, 14);
  assert.deepEqual(fused.tiedA.map(leaves), [0, 1].flatMap((i) => [
    [`${i}.self_attn.q_proj`, `${i}.self_attn.k_proj`, `${i}.self_attn.v_proj`], [`${i}.mlp.gate_proj`, `${i}.mlp.up_proj`]]));
  const wild0 = megatronLoraTargets(model, lora([`${M}.lora.rank=4`, `${M}.lora.target_modules=['*.layers.1.self_attention.linear_qkv']`])!);
  assert.deepEqual(wild0.tiedA.map(leaves), [["1.self_attn.q_proj", "1.self_attn.k_proj", "1.self_attn.v_proj"]]);
  // the critic's section reads the same way
  assert.equal(lora(["critic.model.lora.rank=8", "critic.model.lora.alpha=16", "critic.model.lora.target_modules=[linear_proj]"], "critic.model")!.alpha, 16);
});

test("Megatron LoRA options without an equivalent here are refused naming the key (vlm_lora, bad dropout, unknown inits, adapter checkpoints)", () => {
  const bad: [string[], RegExp][] = [
    [[`${M}.lora.type=vlm_lora`], /vision-language models are not built/],
    [[`${M}.lora.dropout=1.0`], /actor_rollout_ref\.model\.lora\.dropout must be in \[0, 1\), got 1/],
    [[`${M}.lora.dropout_position=middle`], /lora\.dropout_position is "middle"; choose pre or post/],
    [[`${M}.lora.type=dora`, `${M}.lora.dropout=0.1`, `${M}.lora.dropout_position=post`], /dropout_position=post: DoRA applies dropout before the adapter only/],
    [[`${M}.lora.lora_B_init_method=orthogonal`], /lora_B_init_method is "orthogonal"; choose one of zero, xavier, kaiming, normal/],
    [[`${M}.lora.lora_A_init_method=orthogonal`], /lora_A_init_method is "orthogonal"; choose one of xavier, kaiming, normal/],
    [[`${M}.lora.type=canonical_lora`], /target_modules names 'linear_qkv', not a module of lora\.type=canonical_lora/],
    [[`${M}.lora.exclude_modules=[linear_fc2]`], /exclude_modules needs actor_rollout_ref\.model\.lora\.target_modules empty/],
    [[`++${M}.lora.adapter_path=/nonexistent-adapter`], /lora\.adapter_path=\/nonexistent-adapter does not exist .*mp_rank_00_adapter\.pt.*actor_rollout_ref\.model\.lora_adapter_path/],
  ];
  for (const [o, re] of bad) assert.throws(() => lora([`${M}.lora.rank=4`, ...o]), re, o.join(" "));
  const typo = lora([`${M}.lora.rank=4`, `${M}.lora.type=canonical_lora`, `${M}.lora.target_modules=['*.layers.7.*.linear_q']`])!;
  assert.throws(() => megatronLoraTargets(model, typo), /names '\*\.layers\.7\.\*\.linear_q', which matches no linear module/);
  // before any worker starts: validatePpoNames lists it (exit 2)
  const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides: [`${M}.lora.rank=4`, `${M}.lora.type=vlm_lora`] });
  assert.throws(() => validatePpoNames(cfg), /invalid names or ranges[\s\S]*vision-language models are not built/);
  // what verl's dropout and DoRA keys read as
  const d = lora([`${M}.lora.rank=4`, `${M}.lora.type=dora`, `${M}.lora.dropout=0.1`])!;
  assert.deepEqual([d.type, d.dropout, d.dropoutPosition], ["dora", 0.1, "pre"]);
  assert.equal(lora([`${M}.lora.rank=4`, `${M}.lora.dropout=0.2`, `${M}.lora.dropout_position=post`])!.dropoutPosition, "post");
  assert.equal(megatronLoraTargets(model, d).tiedA.length, 4, "type=dora adapts the fused modules as type=lora does");
});

test("lora.adapter_path: verl's mp_rank_00_adapter.pt, a torch_dist folder (or a Megatron checkpoint root) are located; several ranks, a peft folder and others are refused naming what the path holds", () => {
  const dir = mkdtempSync(join(tmpdir(), "mlora-ckpt-"));
  try {
    const at = (name: string, files: string[]) => {
      mkdirSync(join(dir, name), { recursive: true });
      for (const f of files) writeFileSync(join(dir, name, f), "");
      return () => lora([`${M}.lora.rank=4`, `++${M}.lora.adapter_path=${join(dir, name)}`]);
    };
    assert.deepEqual(at("verl", ["mp_rank_00_adapter.pt"])()!.adapter, { kind: "pt", file: join(dir, "verl", "mp_rank_00_adapter.pt") });
    assert.deepEqual(at("dist", ["__0_0.distcp", ".metadata", "common.pt"])()!.adapter, { kind: "dcp", dir: join(dir, "dist") });
    at("root/iter_0000020", [".metadata", "__0_0.distcp"]);
    writeFileSync(join(dir, "root", "latest_checkpointed_iteration.txt"), "20\n");
    assert.deepEqual(at("root", [])()!.adapter, { kind: "dcp", dir: join(dir, "root", "iter_0000020") });
    assert.throws(at("pp2", ["mp_rank_00_000_adapter.pt", "mp_rank_00_001_adapter.pt"]), /holds verl's Megatron adapter checkpoint of several model-parallel ranks \(mp_rank_00_000_adapter\.pt, mp_rank_00_001_adapter\.pt\).*actor_rollout_ref\.model\.lora_adapter_path/);
    assert.throws(at("peft", ["adapter_config.json", "adapter_model.safetensors"]), /is a peft folder \(adapter_config\.json\): .*give a peft folder as actor_rollout_ref\.model\.lora_adapter_path, with lora\.rank left 0/);
    assert.throws(at("other", ["notes.txt"]), /holds neither mp_rank_00_adapter\.pt, a torch_dist folder \(\.metadata \+ \.distcp shards\) nor a peft folder \(it holds notes\.txt\)/);
    // an empty path is verl's "train from scratch", as null
    assert.equal(lora([`${M}.lora.rank=4`, `++${M}.lora.adapter_path=''`])!.adapter, null);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
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

test("lora_B_init_method: zero by default; xavier draws B [out, r] ~ N(0, 2 / (r + out)), so a fresh adapter already moves the policy off the adapter-off reference (as in verl's Megatron worker)", async () => {
  await initBackend("cpu");
  assert.equal(lora([`${M}.lora.rank=4`])!.initB, "zero");
  const s = lora([`${M}.lora.rank=4`, `${M}.lora.lora_B_init_method=xavier`])!;
  assert.equal(s.initB, "xavier");
  const big = makeConfig({ vocabSize: 40, dim: 64, hiddenDim: 64, nLayers: 1, nHeads: 4, nKvHeads: 4, tieWordEmbeddings: false, maxSeqLen: 16 });
  const target = ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj"], r = 8;
  const zeroB = LoraAdapter.init(big, { rank: r, alpha: 16, targetModules: target, initA: "xavier" }, new Rng(3));
  const drawnB = LoraAdapter.init(big, { rank: r, alpha: 16, targetModules: target, initA: "xavier", initB: "xavier" }, new Rng(3));
  try {
    const a0 = zeroB.modules.get(target[0]!)!, a1 = drawnB.modules.get(target[0]!)!;
    for (const name of target) {
      assert.deepEqual(Array.from(drawnB.modules.get(name)!.a.dataSync()), Array.from(zeroB.modules.get(name)!.a.dataSync()), `${name}: every A is drawn before any B, so B's init leaves it unchanged`);
    }
    assert.ok(a0.b.dataSync().every((x) => x === 0));
    const b = a1.b.dataSync(), out = a1.outFeatures;
    let s2 = 0;
    for (const x of b) s2 += x * x;
    const want = Math.sqrt(2 / (r + out)), std = Math.sqrt(s2 / b.length);
    assert.ok(Math.abs(std - want) / want < 0.1, `B std ${std} vs ${want}`);
    const mod = drawnB.modules.get(target[0]!)!;
    const norm = tf.tidy(() => drawnB.mergedWeight(target[0]!, tf.zeros([mod.outFeatures, mod.inFeatures])).abs().max().dataSync()[0]!);
    assert.ok(norm > 0, "a non-zero B changes the merged weight from the start");
  } finally {
    zeroB.dispose();
    drawnB.dispose();
  }
});

test("fused LoRA (type=lora): q, k, v share one A, trained once with the summed gradient; same logits and gradients as the untied adapter with copies of A", async () => {
  await initBackend("cpu");
  const { initModel } = await import("../../src/models/init.js");
  const { saveLoraAdapter } = await import("../../src/models/peft.js");
  const s = lora([`${M}.lora.rank=4`, `${M}.lora.alpha=8`])!;
  const { targets, tiedA } = megatronLoraTargets(model, s);
  const base = initModel(model, new Rng(1));
  const tied = LoraAdapter.init(model, { rank: 4, alpha: 8, targetModules: targets, tiedA, initA: "xavier" }, new Rng(2));
  const q = "model.layers.0.self_attn.q_proj", k = "model.layers.0.self_attn.k_proj";
  assert.equal(tied.modules.get(q)!.a, tied.modules.get(k)!.a, "one A variable");
  assert.ok(tied.namedParams().has(`${q}.lora_A.weight`) && !tied.namedParams().has(`${k}.lora_A.weight`), "trained once, under the owner's name");
  assert.equal(tied.namedParams().size, 14 + 2 * 2 + 2 * 2, "14 B, one A per fused module (qkv, fc1) and per o_proj, down_proj");
  let seed = 20;
  for (const m of tied.modules.values()) m.b.assign(tf.randomNormal(m.b.shape, 0, 0.3, "float32", seed++));
  // the same values untied: every module its own copy of A
  const untied = new LoraAdapter({ rank: 4, alpha: 8, targetModules: targets }, model,
    new Map([...tied.modules].map(([n, m]) => [n, { a: m.a.clone(), b: m.b.clone() }])));
  const ids = tf.tensor2d([[1, 5, 9, 13, 2, 7], [3, 3, 8, 21, 30, 4]], [2, 6], "int32");
  const weights = tf.randomNormal([2, 6, 40], 0, 1, "float32", 7);
  const run = (adapter: LoraAdapter, checkpointing: boolean) => {
    base.lora = adapter;
    base.gradientCheckpointing = checkpointing;
    const vars = [...adapter.namedParams().values()];
    const { value, grads } = tf.variableGrads(() => base.forward(ids).mul(weights).sum() as tf.Scalar, vars);
    const byName = new Map([...adapter.namedParams()].map(([n, v]) => [n, grads[v.name]!.dataSync() as Float32Array]));
    return { loss: value.dataSync()[0]!, byName };
  };
  for (const ckpt of [false, true]) {
    const t = run(tied, ckpt), u = run(untied, ckpt);
    assert.ok(Math.abs(t.loss - u.loss) < 1e-4, `same loss (${ckpt ? "with" : "without"} gradient checkpointing)`);
    const sum = [q, k, "model.layers.0.self_attn.v_proj"].map((n) => u.byName.get(`${n}.lora_A.weight`)!)
      .reduce((acc, g) => acc.map((x, i) => x + g[i]!), new Float32Array(u.byName.get(`${q}.lora_A.weight`)!.length));
    const got = t.byName.get(`${q}.lora_A.weight`)!;
    const err = Math.max(...got.map((x, i) => Math.abs(x - sum[i]!)));
    assert.ok(err < 1e-4 * Math.max(1, ...sum.map(Math.abs)), `dA of the shared A = dA_q + dA_k + dA_v (max err ${err})`);
    const gb = t.byName.get(`${k}.lora_B.weight`)!, ub = u.byName.get(`${k}.lora_B.weight`)!;
    assert.ok(Math.max(...gb.map((x, i) => Math.abs(x - ub[i]!))) < 1e-4, "B gradients unchanged by the tying");
  }
  // peft has no tying: the folder holds the shared A under each part
  const dir = mkdtempSync(join(tmpdir(), "fused-lora-"));
  try {
    await saveLoraAdapter(tied, dir);
    const { tensors } = readSafetensors(join(dir, "adapter_model.safetensors"));
    const a = (n: string) => [...tensors.get(`base_model.model.${n}.lora_A.weight`)!.data];
    assert.deepEqual(a(k), a(q));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  base.lora = undefined;
  tied.dispose(); untied.dispose();
});

test("verl train --config-name ppo_megatron_trainer with lora.*: verl's default fused LoRA and canonical_lora train and checkpoint peft folders", async () => {
  const ws = await makeWorkspace();
  try {
    const base = [...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
      `${M}.lora.rank=4`, `${M}.lora.alpha=8`];
    const fused = await runTrain(["--config-name", "ppo_megatron_trainer", ...base, "trainer.save_freq=1", `trainer.default_local_dir=${ws.dir}/c0`], {});
    assert.equal(fused.code, 0, fused.stderr);
    const saved = readSafetensors(join(ws.dir, "c0/global_step_1/actor/model.safetensors")).tensors;
    assert.ok(saved.has("model.layers.0.self_attn.q_proj.lora_A.weight") && !saved.has("model.layers.0.self_attn.k_proj.lora_A.weight"), "the checkpoint trains one A per fused module");
    const peft = readSafetensors(join(ws.dir, "c0/global_step_1/actor/lora_adapter/adapter_model.safetensors")).tensors;
    const pa = (n: string) => [...peft.get(`base_model.model.model.layers.0.${n}.lora_A.weight`)!.data];
    assert.deepEqual(pa("self_attn.v_proj"), pa("self_attn.q_proj"));
    assert.deepEqual(pa("mlp.up_proj"), pa("mlp.gate_proj"));
    assert.notDeepEqual(pa("mlp.gate_proj"), pa("self_attn.q_proj"));

    const ok = await runTrain(["--config-name", "ppo_megatron_trainer", ...base, `${M}.lora.type=canonical_lora`, CANONICAL,
      "trainer.save_freq=1", `trainer.default_local_dir=${ws.dir}/c1`], {});
    assert.equal(ok.code, 0, ok.stderr);
    const adapter = JSON.parse(readFileSync(join(ws.dir, "c1/global_step_1/actor/lora_adapter/adapter_config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(adapter.r, 4);
    assert.equal(adapter.lora_alpha, 8);
    assert.deepEqual(adapter.target_modules, ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]);

    // a drawn B: the fresh policy is off the adapter-off reference from the first step, so the KL loss is not 0
    const kl = async (initB: string) => {
      const r = await runTrain(["--config-name", "ppo_megatron_trainer", ...base, `${M}.lora.lora_B_init_method=${initB}`,
        "actor_rollout_ref.actor.use_kl_loss=True", `trainer.default_local_dir=${ws.dir}/kl-${initB}`], {});
      assert.equal(r.code, 0, r.stderr);
      const m = /actor\/kl_loss:([-0-9.e]+)/.exec(r.stdout);
      assert.ok(m, `no actor/kl_loss in\n${r.stdout.slice(-2000)}`);
      return Number(m[1]);
    };
    assert.equal(await kl("zero"), 0);
    assert.ok((await kl("xavier")) > 0);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("lora.dropout through the actor: the log-prob pass (eval mode, as verl's) is unaffected, the update is not; the same seed gives the same update", async () => {
  await initBackend("cpu");
  const { initModel } = await import("../../src/models/init.js");
  const { Collective } = await import("../../src/single_controller/collective.js");
  const { DataParallelPPOActor } = await import("../../src/workers/actor/dp_actor.js");
  const { DataParallelOptimizer } = await import("../../src/workers/dp_optimizer.js");
  const { applyModelMemoryOptions, readModelMemoryOptions } = await import("../../src/workers/model_options.js");
  const { syntheticBatch, tinyConfig } = await import("./helpers.js");
  const build = (extra: string[]) => {
    // a drawn B: the adapter branch contributes from the start, so dropping it shows in the loss
    const cfg = loadConfig({ configName: "ppo_megatron_trainer", overrides: [`${M}.lora.rank=4`, `${M}.lora.lora_B_init_method=xavier`, ...extra,
      "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.entropy_coeff=0.01"] });
    const modelView = new ConfigView(cfg, M), view = new ConfigView(cfg, "actor_rollout_ref.actor");
    const llama = initModel(tinyConfig(), new Rng(3));
    applyModelMemoryOptions(llama, readModelMemoryOptions(modelView), modelView, 1);
    const opt = new DataParallelOptimizer(llama.trainableVariables(), view.at("optim"), 10, Collective.single(), view.num("grad_clip"));
    return { llama, actor: new DataParallelPPOActor(llama, opt, { config: view, miniBatchPerRank: 4, microBatchPerRank: 2, seed: 1 }) };
  };
  const spec = { microBatchSize: 2, maxTokenLen: null };
  const flat = (m: { trainableVariables(): tf.Variable[] }) => m.trainableVariables().flatMap((v) => Array.from(v.dataSync()));
  for (const position of ["pre", "post"]) {
    const plain = build([]), drop = build([`${M}.lora.dropout=0.3`, `${M}.lora.dropout_position=${position}`]), twin = build([`${M}.lora.dropout=0.3`, `${M}.lora.dropout_position=${position}`]);
    const data = syntheticBatch(4, 4, 4, 32, 9);
    const lp = await plain.actor.computeLogProb(data, spec, 1.0, true), ld = await drop.actor.computeLogProb(data, spec, 1.0, true);
    assert.deepEqual(Array.from(ld.logProbs.data), Array.from(lp.logProbs.data), `${position}: old log-probs without dropout`);
    assert.deepEqual(Array.from(ld.entropy!.data), Array.from(lp.entropy!.data));
    data.batch.old_log_probs = lp.logProbs;
    const mp = await plain.actor.updatePolicy(data), md = await drop.actor.updatePolicy(data), mt = await twin.actor.updatePolicy(data);
    assert.notEqual(md["actor/entropy"]![0], mp["actor/entropy"]![0], `${position}: the update's forward drops adapter units`);
    assert.notEqual(md["actor/grad_norm"]![0], mp["actor/grad_norm"]![0]);
    assert.deepEqual([md["actor/pg_loss"], md["actor/grad_norm"], md["actor/entropy"]], [mt["actor/pg_loss"], mt["actor/grad_norm"], mt["actor/entropy"]], `${position}: same seed, same update`);
    assert.deepEqual(flat(drop.llama), flat(twin.llama));
    for (const b of [plain, drop, twin]) b.llama.dispose();
  }
});

test("verl train --config-name ppo_megatron_trainer with lora.type=dora and lora.dropout: 2 GRPO steps; the checkpoint holds m, the peft folder use_dora and lora_magnitude_vector, and reloads", async () => {
  const ws = await makeWorkspace();
  try {
    const args = ["--config-name", "ppo_megatron_trainer", ...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo",
      "trainer.total_training_steps=2", "trainer.save_freq=2", `trainer.default_local_dir=${ws.dir}/c`,
      `${M}.lora.rank=4`, `${M}.lora.alpha=8`, `${M}.lora.type=dora`, `${M}.lora.dropout=0.1`];
    const r = await runTrain(args, {});
    assert.equal(r.code, 0, r.stderr);
    const steps = [...r.stdout.matchAll(/actor\/pg_loss:/g)].length;
    assert.ok(steps >= 2, `two steps logged (${steps})\n${r.stdout.slice(-1500)}`);
    const saved = readSafetensors(join(ws.dir, "c/global_step_2/actor/model.safetensors")).tensors;
    // the same seed and config again: the same dropout masks, so the same trained adapter
    const again = await runTrain(args.map((a) => a.replace(`${ws.dir}/c`, `${ws.dir}/c2`)), {});
    assert.equal(again.code, 0, again.stderr);
    const saved2 = readSafetensors(join(ws.dir, "c2/global_step_2/actor/model.safetensors")).tensors;
    assert.deepEqual([...saved2.keys()], [...saved.keys()]);
    for (const [k, t] of saved) assert.deepEqual([...saved2.get(k)!.data], [...t.data], `${k}: same seed, same run`);
    const m = saved.get("model.layers.0.self_attn.o_proj.lora_magnitude_vector");
    assert.ok(m && m.shape[0] === 16, "the trained magnitude is checkpointed");
    const dir = join(ws.dir, "c/global_step_2/actor/lora_adapter");
    const cfg = JSON.parse(readFileSync(join(dir, "adapter_config.json"), "utf8")) as Record<string, unknown>;
    assert.equal(cfg.use_dora, true);
    assert.equal(cfg.lora_dropout, 0.1);
    const peft = readSafetensors(join(dir, "adapter_model.safetensors")).tensors;
    assert.deepEqual([...peft.get("base_model.model.model.layers.0.self_attn.o_proj.lora_magnitude_vector")!.data], [...m.data]);
    assert.ok(peft.has("base_model.model.model.layers.0.self_attn.v_proj.lora_magnitude_vector"));
    // the HF export is merged: W' = m (W + s B A) / ||W + s B A||, whose row norms are m
    const { loadHfModel } = await import("../../src/models/hf.js");
    const { loadLoraAdapter } = await import("../../src/models/peft.js");
    await initBackend("cpu");
    const merged = await loadHfModel(join(ws.dir, "c/global_step_2/actor/huggingface"));
    const rowNorms = tf.tidy(() => Array.from(tf.norm(merged.p("model.layers.0.self_attn.o_proj.weight"), "euclidean", 1).dataSync()));
    assert.ok(rowNorms.every((v, i) => Math.abs(v - m.data[i]!) < 1e-4 * Math.max(1, m.data[i]!)), `merged row norms ${rowNorms} vs m ${[...m.data]}`);
    // the peft folder reloads (onto a model of that shape) as DoRA
    const back = loadLoraAdapter(dir, merged.config);
    assert.equal(back.settings.useDora, true);
    assert.equal(back.settings.dropout, 0.1);
    assert.deepEqual([...back.modules.get("model.layers.0.self_attn.o_proj")!.magnitude!.dataSync()], [...m.data]);
    back.dispose(); merged.dispose();
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
