import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigError, loadConfig } from "../../../src/config/index.js";
import { validatePpoNames } from "../../../src/trainer/ppo/validate_names.js";

const cfg = (...overrides: string[]) => loadConfig({ configName: "ppo_trainer", overrides });

test("the defaults and verl's usual names pass", () => {
  validatePpoNames(cfg());
  validatePpoNames(cfg("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "reward_model.reward_manager=dapo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.strategy=fsdp2", "algorithm.kl_penalty=low_var_kl+"));
});

test("every bad name and range is listed in one error (exit 2) with the valid names", () => {
  assert.throws(
    () => validatePpoNames(cfg("algorithm.adv_estimator=grpoo", "actor_rollout_ref.actor.policy_loss.loss_mode=vanila", "reward_model.reward_manager=nope", "algorithm.kl_ctrl.type=fixd", "actor_rollout_ref.actor.kl_loss_type=k9", "actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_k=0", "actor_rollout_ref.rollout.val_kwargs.n=0", "actor_rollout_ref.rollout.name=trt")),
    (e: unknown) => {
      const m = (e as Error).message;
      assert.ok(e instanceof ConfigError && e.exitCode === 2);
      for (const want of [/adv_estimator is "grpoo"; choose one of gae, grpo/, /loss_mode is "vanila"; choose one of vanilla/, /reward_manager is "nope".*naive/, /kl_ctrl\.type is "fixd"; choose one of fixed, adaptive/, /kl_loss_type is "k9"/, /temperature is -1/, /top_p is 1\.5/, /top_k is 0/, /val_kwargs\.n is 0/, /rollout\.name is "trt"; choose one of tfjs, hf, naive, llama_cpp, webgpu, vllm, sglang/]) assert.match(m, want);
      return true;
    },
  );
});

test("the optimizer: AdamW under torch's name or Megatron's adam (verl's Megatron default) passes; others fail before any worker", () => {
  validatePpoNames(loadConfig({ configName: "ppo_megatron_trainer", overrides: [] }));
  validatePpoNames(cfg("actor_rollout_ref.actor.optim.optimizer=adamw", "critic.optim.optimizer=adam"));
  assert.throws(
    () => validatePpoNames(cfg("actor_rollout_ref.actor.optim.optimizer=SGD", "critic.optim.optimizer=Adam8bit")),
    /actor\.optim\.optimizer is "SGD"; verl-ts implements AdamW[\s\S]*critic\.optim\.optimizer is "Adam8bit"/,
  );
});
