import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigError, loadConfig, validateDevice, validatePpoConfig } from "../../src/config/index.js";
import { generativeRewardModel } from "../../src/config/validate.js";

// A GRPO config that passes: 8 prompts x 4 responses over 2 ranks, mini-batch 4 prompts.
const GOOD = [
  "algorithm.adv_estimator=grpo",
  "data.train_batch_size=8",
  "actor_rollout_ref.rollout.n=4",
  "trainer.n_gpus_per_node=2",
  "actor_rollout_ref.actor.ppo_mini_batch_size=4",
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
];
const ppo = (...extra: string[]) => loadConfig({ configName: "ppo_trainer", overrides: [...GOOD, ...extra] });

function rejects(extra: string[], pattern: RegExp): void {
  assert.throws(() => validatePpoConfig(ppo(...extra)), (e: unknown) => {
    assert.ok(e instanceof ConfigError, String(e));
    assert.equal(e.exitCode, 2);
    assert.match(e.message, pattern);
    return true;
  });
}

test("a consistent config passes and yields the per-rank sizes", () => {
  const plan = validatePpoConfig(ppo());
  assert.deepEqual(plan, {
    worldSize: 2,
    rolloutN: 4,
    actorMiniBatchPerRank: 8,
    actorMicroBatchPerRank: 2,
    criticMiniBatchPerRank: null,
    criticMicroBatchPerRank: null,
    needCritic: false,
    needReference: false,
  });
});

test("train_batch_size must cover the mini-batch", () => {
  rejects(["data.train_batch_size=2"], /data\.train_batch_size \(2\) must be >= actor_rollout_ref\.actor\.ppo_mini_batch_size \(4\): lower .* by 2/);
});

test("train_batch_size * n must split over the world", () => {
  rejects(["trainer.n_gpus_per_node=3", "actor_rollout_ref.rollout.n=1", "data.train_batch_size=8"], /data\.train_batch_size \* rollout\.n \(8 \* 1 = 8\) must be divisible by the world size 3 .*remainder 2/);
  rejects(["trainer.nnodes=2", "trainer.n_gpus_per_node=3"], /world size 6 \(trainer\.n_gpus_per_node 3 \* trainer\.nnodes 2\)/);
});

test("the mini-batch per rank must split into micro-batches", () => {
  rejects(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], /4 \* 4 \/ 2 = 8 sequences per rank must be divisible by the micro-batch size 3 .*remainder 2/);
  rejects(["actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.rollout.n=1", "data.train_batch_size=2"], /ppo_mini_batch_size \* rollout\.n \(1 \* 1 = 1\) must be divisible by the world size 2/);
});

test("micro_batch_size and micro_batch_size_per_gpu: exactly one, unless dynamic batch size", () => {
  rejects(["actor_rollout_ref.actor.ppo_micro_batch_size=4"], /actor\.ppo_micro_batch_size \(4\) and actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu \(2\) are both set/);
  rejects(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"], /neither actor_rollout_ref\.actor\.ppo_micro_batch_size nor .*_per_gpu is set/);
  rejects(["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null"], /neither actor_rollout_ref\.rollout\.log_prob_micro_batch_size nor/);
  // dynamic batch size needs neither (and the ref/rollout inherit the actor's switch through interpolation)
  validatePpoConfig(ppo("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null", "actor_rollout_ref.actor.use_dynamic_bsz=true"));
  // the deprecated global form is split over ranks
  const plan = validatePpoConfig(ppo("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null", "actor_rollout_ref.actor.ppo_micro_batch_size=4"));
  assert.equal(plan.actorMicroBatchPerRank, 2);
});

test("the reference and the critic are checked only when used", () => {
  rejects(["actor_rollout_ref.actor.use_kl_loss=true"], /neither actor_rollout_ref\.ref\.log_prob_micro_batch_size nor/);
  validatePpoConfig(ppo("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"));
  rejects(["algorithm.adv_estimator=gae"], /neither critic\.ppo_micro_batch_size nor critic\.ppo_micro_batch_size_per_gpu is set/);
  rejects(["critic.enable=true"], /critic\.ppo_micro_batch_size_per_gpu/);
  const plan = validatePpoConfig(ppo("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4"));
  assert.equal(plan.needCritic, true);
  assert.equal(plan.criticMiniBatchPerRank, 8, "critic.ppo_mini_batch_size follows the actor's");
  rejects(["reward_model.enable=true"], /neither reward_model\.micro_batch_size nor reward_model\.micro_batch_size_per_gpu/);
});

test("loss_agg_mode and clip_ratio_c are checked", () => {
  rejects(["actor_rollout_ref.actor.loss_agg_mode=seq-mean"], /actor_rollout_ref\.actor\.loss_agg_mode is "seq-mean"; it must be one of token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm/);
  rejects(["actor_rollout_ref.actor.clip_ratio_c=1.0"], /clip_ratio_c must be greater than 1\.0 .*got 1$/m);
});

test("negative clip ratios are refused naming the key", () => {
  for (const key of ["actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low", "actor_rollout_ref.actor.clip_ratio_high"]) {
    rejects([`${key}=-0.2`], new RegExp(`${key.replace(/\./g, "\\.")} must be >= 0 \\(the clip range is \\[1 - eps, 1 \\+ eps\\]\\), got -0\\.2$`, "m"));
  }
  rejects(["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2", "critic.cliprange_value=-1"], /critic\.cliprange_value must be >= 0 .*got -1$/m);
  assert.doesNotThrow(() => validatePpoConfig(ppo("critic.cliprange_value=-1")), "the critic's range is not checked when there is no critic");
  assert.doesNotThrow(() => validatePpoConfig(ppo("actor_rollout_ref.actor.clip_ratio_low=0", "actor_rollout_ref.actor.clip_ratio_high=0.28")));
});

test("a training temperature of 0 is refused up front (greedy is for validation)", () => {
  rejects(["actor_rollout_ref.rollout.temperature=0"], /actor_rollout_ref\.rollout\.temperature must be > 0 for training .*got 0; greedy decoding is for validation: actor_rollout_ref\.rollout\.val_kwargs\.do_sample=false/);
  rejects(["actor_rollout_ref.rollout.temperature=-1"], /temperature must be > 0 for training .*got -1/);
  assert.doesNotThrow(() => validatePpoConfig(ppo("actor_rollout_ref.rollout.val_kwargs.temperature=0", "actor_rollout_ref.rollout.val_kwargs.do_sample=false")));
});

test("all problems are reported at once", () => {
  assert.throws(
    () => validatePpoConfig(ppo("actor_rollout_ref.actor.clip_ratio_c=0.5", "actor_rollout_ref.actor.loss_agg_mode=x", "data.train_batch_size=2")),
    (e: unknown) => e instanceof ConfigError && e.message.split("\n  - ").length === 4,
  );
});

test("trainer.device must name a tensor backend", () => {
  validateDevice(ppo("trainer.device=wasm"));
  validateDevice(loadConfig({ configName: "evaluation" }));
  assert.throws(() => validateDevice(ppo("trainer.device=cuda")), (e: unknown) => e instanceof ConfigError && /trainer\.device is "cuda"; verl-ts runs on the tensor backends auto, wasm, cpu, tensorflow, webgpu/.test(e.message));
});

test("a served reward model (reward_model.rollout.name): vllm/sglang only; with a custom reward function it is generative, and the function must be JS/TS", () => {
  const base = ["reward_model.enable=true", "reward_model.micro_batch_size_per_gpu=4"];
  const plan = (o: string[]) => validatePpoConfig(ppo(...base, ...o));
  assert.doesNotThrow(() => plan(["reward_model.rollout.name=vllm"]));
  assert.throws(() => plan(["reward_model.rollout.name=trtllm"]), /reward_model\.rollout\.name is "trtllm"; verl's reward loop serves a reward model with vllm or sglang/);
  assert.doesNotThrow(() => plan(["reward_model.rollout.name=sglang", "custom_reward_function.path=r.mjs"]));
  assert.equal(generativeRewardModel(ppo(...base, "reward_model.rollout.name=sglang", "custom_reward_function.path=r.mjs")), "sglang");
  assert.equal(generativeRewardModel(ppo(...base, "reward_model.rollout.name=vllm")), null);
  assert.throws(() => plan(["reward_model.rollout.name=vllm", "custom_reward_function.path=genrm.py"]), /reward_model\.rollout\.name=vllm with custom_reward_function\.path=genrm\.py: .*reward_model_tokenizer.*write the function in JS\/TS/);
  // verl's legacy reward path (use_reward_loop=false) never reads reward_model.rollout
  assert.doesNotThrow(() => plan(["reward_model.rollout.name=sglang", "custom_reward_function.path=r.mjs", "reward_model.use_reward_loop=false"]));
});
