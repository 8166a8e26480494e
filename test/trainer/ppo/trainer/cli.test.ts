// `verl train` as users run it: validation before training, checkpoint layout with
// a Hugging Face export, rollout dumps, a user's estimator loaded through
// external_lib (driver and workers), a worker error failing the run fast, and
// verl's tracking backends (service ones replaced by file, tensorboard event files).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { initBackend } from "../../../../src/engine/backend.js";
import { loadHfModel, readSafetensors } from "../../../../src/models/index.js";
import { readEventFile } from "../../../../src/utils/tensorboard/event_file.js";
import { makeWorkspace, metricsByStep, runTrain, scratchModel, type Workspace } from "./fixtures.js";

const CORE_ALGOS = new URL("../../../../src/trainer/ppo/core_algos/index.js", import.meta.url).href;

function scratch(ws: Workspace): string[] {
  return [...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console"];
}

function writeExtension(dir: string): string {
  const path = join(dir, "ext.mjs");
  writeFileSync(path, [
    `import { registerAdvEstimator, registerPolicyLoss } from ${JSON.stringify(CORE_ALGOS)};`,
    "// every model token gets advantage 1: easy to see in critic/advantages/mean",
    "registerAdvEstimator('all_ones', (args) => ({ advantages: args.responseMask.toFloat(), returns: args.responseMask.toFloat() }));",
    "registerPolicyLoss('boom', () => { throw new Error('boom from the user loss'); });",
  ].join("\n"));
  return path;
}

test("one GRPO-style step with a user estimator: validation, checkpoint with HF export, rollout dump", async () => {
  const ws = await makeWorkspace();
  try {
    const ext = writeExtension(ws.dir);
    const ckpt = join(ws.dir, "ckpt"), dump = join(ws.dir, "dump");
    const run = await runTrain([...scratch(ws), `actor_rollout_ref.model.external_lib=${ext}`, "algorithm.adv_estimator=all_ones",
      "trainer.total_training_steps=1", "trainer.save_freq=1", "trainer.val_before_train=true", `trainer.rollout_data_dir=${dump}`,
      `trainer.default_local_dir=${ckpt}`], {});
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stdout, /^step:0 - val-core\/stories\/reward\/mean@1:/m, "validation before training logs at step 0");
    const line = /^step:1 .*$/m.exec(run.stdout)![0];
    assert.match(line, / - critic\/advantages\/mean:1 - /);

    const step = join(ckpt, "global_step_1");
    for (const f of ["data.json", "trainer_state.json", "actor/model.safetensors", "actor/optim.safetensors",
      "actor/extra_state_world_size_1_rank_0.json", "actor/checkpoint_meta.json", "actor/huggingface/config.json", "actor/huggingface/model.safetensors"]) {
      assert.ok(existsSync(join(step, f)), `checkpoint has ${f}`);
    }
    assert.equal(readFileSync(join(ckpt, "latest_checkpointed_iteration.txt"), "utf8").trim(), "1");
    const hfConfig = JSON.parse(readFileSync(join(step, "actor/huggingface/config.json"), "utf8")) as { architectures: string[]; hidden_size: number };
    assert.deepEqual(hfConfig.architectures, ["LlamaForCausalLM"]);
    assert.equal(hfConfig.hidden_size, 16);
    // The export holds the trained weights: it loads back equal to the checkpoint's model.safetensors.
    await initBackend("cpu");
    const hf = await loadHfModel(join(step, "actor/huggingface"));
    const saved = readSafetensors(join(step, "actor/model.safetensors")).tensors;
    for (const [name, v] of hf.params) assert.deepEqual([...v.dataSync()], [...saved.get(name)!.data], name);
    hf.dispose();

    const rows = readFileSync(join(dump, "1.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.equal(rows.length, 8, "4 prompts x n=2");
    for (const k of ["input", "output", "gts", "score", "step"]) assert.ok(k in rows[0]!, `rollout dump has ${k}`);
    assert.equal(rows[0]!.step, 1);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("ReMax: a greedy baseline generation per prompt (gen_max) and the in-reward KL penalty", async () => {
  const ws = await makeWorkspace();
  try {
    const run = await runTrain([...scratch(ws), "algorithm.adv_estimator=remax", "algorithm.use_kl_in_reward=true",
      "trainer.total_training_steps=1", `trainer.default_local_dir=${ws.dir}/c`], {});
    assert.equal(run.code, 0, run.stderr);
    const line = /^step:1 .*$/m.exec(run.stdout)![0];
    for (const k of ["timing_s/gen_max", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "critic/advantages/mean"]) {
      assert.match(line, new RegExp(` - ${k}:-?[0-9]`), k);
    }
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("a worker error fails the run fast with the worker's message, and the process exits", async () => {
  const ws = await makeWorkspace();
  try {
    const ext = writeExtension(ws.dir);
    const t0 = Date.now();
    const run = await runTrain([...scratch(ws), `actor_rollout_ref.model.external_lib=${ext}`, "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.actor.policy_loss.loss_mode=boom", "trainer.total_training_steps=2", `trainer.default_local_dir=${ws.dir}/c`], {});
    assert.equal(run.code, 1);
    assert.match(run.stderr, /updateActor failed on rank 0: Error: boom from the user loss/);
    assert.ok(Date.now() - t0 < 60_000);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("trainer.logger as in verl's scripts: wandb warns once and is replaced by file, tensorboard writes event files", async () => {
  const ws = await makeWorkspace();
  try {
    const tbDir = join(ws.dir, "tb"), jsonl = join(ws.dir, "metrics.jsonl");
    const run = await runTrain([...scratch(ws), "trainer.logger=[console,wandb,tensorboard]", "algorithm.adv_estimator=grpo",
      "trainer.total_training_steps=1"], { TENSORBOARD_DIR: tbDir, VERL_FILE_LOGGER_PATH: jsonl });
    assert.equal(run.code, 0, run.stderr);
    assert.equal(run.stderr.match(/not available in verl-ts/g)?.length, 1, "one warning");
    assert.match(run.stderr, /trainer.logger: wandb not available in verl-ts .* go to the 'file' backend .* with: console, tensorboard, file/);
    const fromFile = metricsByStep(readFileSync(jsonl, "utf8")).get(1)!;
    const files = readdirSync(tbDir).filter((f) => f.startsWith("events.out.tfevents."));
    assert.equal(files.length, 1);
    const events = readEventFile(join(tbDir, files[0]!));
    assert.equal(events[0]!.fileVersion, "brain.Event:2");
    const step1 = new Map(events.filter((e) => e.step === 1).flatMap((e) => e.scalars ?? []).map((s) => [s.tag, s.value]));
    assert.ok(step1.size > 10, `step 1 has scalars (${step1.size})`);
    for (const [tag, v] of Object.entries(fromFile)) {
      if (typeof v === "number") assert.equal(step1.get(tag), Math.fround(v), tag);
    }
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

const noPython = spawnSync("python3", ["--version"]).status === 0 ? false : "python3 is not installed here";

test("a verl Python reward file drives training: compute_score by keyword, reward_kwargs, the dict's score", { skip: noPython }, async () => {
  const ws = await makeWorkspace();
  try {
    const py = join(ws.dir, "my_reward.py");
    writeFileSync(py, [
      "def compute_score(data_source, solution_str, ground_truth, extra_info=None, base=0.0):",
      "    assert isinstance(solution_str, str) and isinstance(extra_info, dict)",
      "    return {'score': base, 'chars': len(solution_str)}",
      "",
    ].join("\n"));
    const run = await runTrain([...scratch(ws), "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
      `custom_reward_function.path=${py}`, "+custom_reward_function.reward_kwargs.base=0.25"], {});
    assert.equal(run.code, 0, run.stderr);
    const line = /^step:1 .*$/m.exec(run.stdout)![0];
    assert.match(line, / - critic\/score\/mean:0\.25 - /);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
