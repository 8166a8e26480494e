// What a newcomer meets first (issue 28): errors that name the thing in one line, and no false
// "read by nothing" warnings for the quickstart's and docs/extending.md's keys.
import { before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { checkKeyKinds, keyReportWarning, loadConfigDetailed } from "../../src/config/index.js";

const MAIN = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "first-hour-"));

function verl(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number; stderr: string }> {
  return new Promise((res) => execFile(process.execPath, [MAIN, ...args], { cwd: dir, env: { ...process.env, ...env } },
    (err, _o, stderr) => res({ code: err ? Number(err.code) : 0, stderr })));
}

const TINY = [
  "algorithm.adv_estimator=grpo", "data.train_files=d/train.parquet", "data.val_files=d/test.parquet",
  "data.train_batch_size=8", "data.max_prompt_length=16", "data.max_response_length=8", "actor_rollout_ref.rollout.n=2",
  "actor_rollout_ref.model.path=scratch", 'actor_rollout_ref.model.tokenizer_path="char:\\n #+0123456789=?Wahist"',
  "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "trainer.total_training_steps=1", "trainer.n_gpus_per_node=1",
  "trainer.device=wasm", "trainer.logger=[console]",
];

/** The lines of stderr that are not info logs. */
const problems = (stderr: string) => stderr.split("\n").filter((l) => l.trim() && !/^\[\d\d:\d\d:\d\d\] (INFO|WARN):/.test(l) && !l.startsWith("progress: "));

before(async () => {
  const r = await verl(["preprocess", "arithmetic", "--local_save_dir", "d", "--num-train", "64", "--num-test", "16"]);
  assert.equal(r.code, 0, r.stderr);
});

test("a wrong data.prompt_key says the column is missing and lists the columns, in one line", async () => {
  const r = await verl(["train", ...TINY, "data.prompt_key=question"]);
  assert.notEqual(r.code, 0);
  assert.deepEqual(problems(r.stderr), [
    "error: data.train_files: d/train.parquet row 0: data.prompt_key=question is not a column of this file; its columns are data_source, prompt, ability, reward_model, extra_info",
  ]);
});

test("a missing Python reward file is one line, not a traceback", async () => {
  const r = await verl(["train", ...TINY, "custom_reward_function.path=nope.py"]);
  assert.notEqual(r.code, 0);
  assert.deepEqual(problems(r.stderr), [`error: custom_reward_function.path=${join(dir, "nope.py")}: no such file`]);
});

test("trainer.device=webgpu without a GPU (or without Dawn) is one error line with the fix", async () => {
  const r = await verl(["train", ...TINY.filter((a) => !a.startsWith("trainer.device=")), "trainer.device=webgpu"]);
  assert.notEqual(r.code, 0);
  // Dawn itself may print a native warning (no libvulkan); verl-ts's own error is one line.
  const errors = problems(r.stderr).filter((l) => l.startsWith("error:"));
  assert.equal(errors.length, 1, r.stderr);
  assert.match(errors[0]!, /trainer\.device=webgpu(: no GPU adapter found .*use trainer\.device=auto| needs the 'webgpu' package \(Dawn\), installed on request: npm install --no-save webgpu@0\.6\.2 @tensorflow\/tfjs-backend-webgpu@4\.22\.0)/);
  assert.ok(!/\n\s+at (async |file:|node:)/.test(r.stderr), "no JS stack trace");
});

test("the quickstart's +model.override_config.* and docs/extending.md's +policy_loss.kl_beta are not 'read by nothing'", () => {
  const sft = loadConfigDetailed({ configName: "sft_trainer", overrides: ["+model.override_config.hidden_size=64", "+model.override_config.tie_word_embeddings=false"] });
  assert.equal(keyReportWarning(checkKeyKinds(sft.defaults, sft.raw)), undefined);
  const ppo = loadConfigDetailed({ configName: "ppo_trainer", overrides: ["+actor_rollout_ref.actor.policy_loss.kl_beta=0.05", "+actor_rollout_ref.model.override_config.hidden_size=64"] });
  assert.equal(keyReportWarning(checkKeyKinds(ppo.defaults, ppo.raw)), undefined);
  // a key that nothing reads is still reported
  const typo = loadConfigDetailed({ configName: "ppo_trainer", overrides: ["+trainer.totl_training_steps=3"] });
  assert.match(keyReportWarning(checkKeyKinds(typo.defaults, typo.raw)) ?? "", /read by nothing in verl-ts:\n {2}- trainer\.totl_training_steps/);
});

test("a run prints its resolved config, saves it as Hydra does (.hydra/config.yaml beside the checkpoints), logs human-readable lines and plain progress when not a terminal", async () => {
  const ckpt = join(dir, "ckpt");
  const r = await new Promise<{ code: number; stdout: string; stderr: string }>((res) =>
    execFile(process.execPath, [MAIN, "train", ...TINY, "trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.test_freq=-1", `trainer.default_local_dir=${ckpt}`, "trainer.save_freq=-1"],
      { cwd: dir, env: { ...process.env, VERL_LOG_FORMAT: "", VERL_PROGRESS_EVERY_STEPS: "1" } },
      (err, stdout, stderr) => res({ code: err ? Number(err.code) : 0, stdout, stderr })));
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^resolved config:\nactor_rollout_ref:\n/m);
  assert.match(r.stdout, new RegExp(`config saved: ${join(ckpt, ".hydra", "config.yaml")}`));
  const saved = readFileSync(join(ckpt, ".hydra", "config.yaml"), "utf8");
  assert.match(saved, /total_training_steps: 2/);
  assert.match(readFileSync(join(ckpt, ".hydra", "overrides.yaml"), "utf8"), /- trainer\.total_training_steps=2/);
  assert.match(r.stderr, /^\[\d\d:\d\d:\d\d\] INFO: training plan/m);
  assert.doesNotMatch(r.stderr, /^\{"level"/m);
  assert.match(r.stderr, /^progress: step 1\/2 \(50%\), \d+\.\d\d s\/step, ETA \d+ s$/m);
  assert.match(r.stderr, /^progress: step 2\/2 \(100%\), \d+\.\d\d s\/step, ETA 0 s$/m);
  assert.match(r.stdout, /^step:2 - /m);
});

test("VERL_LOG_FORMAT=json gives pino's JSON lines; another value is refused naming the variable", async () => {
  const json = await verl(["preprocess", "arithmetic", "--local_save_dir", "j", "--num-train", "8", "--num-test", "4"], { VERL_LOG_FORMAT: "json" });
  assert.equal(json.code, 0, json.stderr);
  const line = json.stderr.split("\n").find((l) => l.includes("train.parquet"))!;
  assert.equal((JSON.parse(line) as { level: number }).level, 30);
  const bad = await verl(["preprocess", "arithmetic", "--local_save_dir", "j", "--num-train", "8", "--num-test", "4"], { VERL_LOG_FORMAT: "xml" });
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /VERL_LOG_FORMAT=xml: use text \(the default\) or json/);
});

test("a saved GRPO policy exports with verl export to a Hugging Face folder that loads with the same weights", async () => {
  const ckpt = join(dir, "grpo_ckpt");
  const t = await verl(["train", ...TINY, "trainer.val_before_train=False", "trainer.test_freq=-1", `trainer.default_local_dir=${ckpt}`, "trainer.save_freq=1000"]);
  assert.equal(t.code, 0, t.stderr);
  const target = join(dir, "my_model");
  const e = await new Promise<{ code: number; stdout: string; stderr: string }>((res) =>
    execFile(process.execPath, [MAIN, "export", ckpt, "--target_dir", target], { cwd: dir }, (err, stdout, stderr) => res({ code: err ? Number(err.code) : 0, stdout, stderr })));
  assert.equal(e.code, 0, e.stderr);
  assert.match(e.stdout, new RegExp(`exported ${join(ckpt, "global_step_1", "actor", "huggingface")} -> ${target}`));
  const { loadHfModel } = await import("../../src/models/index.js");
  const exported = await loadHfModel(target);
  assert.equal(readFileSync(join(target, "model.safetensors")).equals(readFileSync(join(ckpt, "global_step_1", "actor", "huggingface", "model.safetensors"))), true);
  assert.equal(exported.config.dim, 64); // the scratch default hidden_size
  assert.ok(readFileSync(join(target, "config.json"), "utf8").includes("LlamaForCausalLM"));
  const again = await verl(["export", ckpt, "--target_dir", target]);
  assert.match(again.stderr, /verl export: .*my_model exists; give a new folder/);
  const none = await verl(["export", join(dir, "d"), "--target_dir", join(dir, "x")]);
  assert.match(none.stderr, /verl export: no Hugging Face folder \(config\.json \+ model\.safetensors\) in .*\/d; looked in/);
});
