// The names and sampling ranges a PPO config dispatches on, checked against the registries once
// external_lib has registered its own and before any worker thread starts, so a typo fails in a
// second with every valid name listed instead of at step 1 after a full rollout.
import { ConfigError, getPath, STRATEGIES, type Config } from "../../config/index.js";
import { rolloutEngineNames } from "../../rollout/engines/index.js";
import { knownRewardManagers } from "../../reward/managers/index.js";
import { KL_PENALTY_KINDS } from "./core_algos/kl.js";
import { listAdvEstimators, listPolicyLosses } from "./core_algos/registry.js";
import { ConfigView } from "../../workers/config_view.js";
import { isAdamW } from "../../workers/dp_optimizer.js";
import { readMegatronLora } from "../../workers/megatron_lora.js";
import { readRolloutQuantization } from "../../rollout/fp8.js";

const KL_CTRL_TYPES = ["fixed", "adaptive"];
const KL_NAMES = [...KL_PENALTY_KINDS, ...KL_PENALTY_KINDS.map((k) => `${k}+`)];

function oneOf(cfg: Config, key: string, names: readonly string[], errors: string[]): void {
  const v = getPath(cfg, key);
  if (v === undefined || v === null) return;
  if (typeof v !== "string" || !names.includes(v)) errors.push(`${key} is ${JSON.stringify(v)}; choose one of ${names.join(", ")}`);
}

function inRange(cfg: Config, key: string, ok: (x: number) => boolean, want: string, errors: string[]): void {
  const v = getPath(cfg, key);
  if (v === undefined || v === null) return;
  if (typeof v !== "number" || !ok(v)) errors.push(`${key} is ${JSON.stringify(v)}; it must be ${want}`);
}

/** The optimizer of one role: verl-ts implements AdamW (under torch's or Megatron's name). */
function optimizerName(cfg: Config, key: string, errors: string[]): void {
  const v = getPath(cfg, key);
  if (v === undefined || v === null) return;
  if (typeof v !== "string" || !isAdamW(v)) errors.push(`${key} is ${JSON.stringify(v)}; verl-ts implements AdamW (AdamW, or Megatron's adam)`);
}

/** Sampling parameters of one rollout section (or its val_kwargs). */
function samplingRanges(cfg: Config, at: string, errors: string[]): void {
  inRange(cfg, `${at}.temperature`, (x) => x >= 0, "a number >= 0 (0 = greedy)", errors);
  inRange(cfg, `${at}.top_p`, (x) => x > 0 && x <= 1, "in (0, 1]", errors);
  inRange(cfg, `${at}.top_k`, (x) => Number.isInteger(x) && (x === -1 || x > 0), "-1 (off) or a positive integer", errors);
  inRange(cfg, `${at}.n`, (x) => Number.isInteger(x) && x >= 1, "a positive integer", errors);
}

/** Columns an estimator or mode needs that another setting must produce (verl asserts these at step 1). */
function algorithmInputs(cfg: Config, errors: string[]): void {
  const A = "actor_rollout_ref.actor", RC = "algorithm.rollout_correction";
  const est = getPath(cfg, "algorithm.adv_estimator");
  const bypass = getPath(cfg, `${RC}.bypass_mode`) === true;
  if (est === "optimal_token_baseline" || est === "tir_optimal_token_baseline") {
    if (getPath(cfg, `${A}.calculate_sum_pi_squared`) !== true) errors.push(`algorithm.adv_estimator=${est} needs sum_pi_squared: set ${A}.calculate_sum_pi_squared=True`);
    if (bypass) errors.push(`algorithm.adv_estimator=${est} needs the actor's log-prob pass (it gives sum_pi_squared), which ${RC}.bypass_mode=true skips`);
  }
  if (bypass) {
    if (getPath(cfg, "actor_rollout_ref.rollout.calculate_log_probs") !== true) errors.push(`${RC}.bypass_mode=true takes old_log_probs from the rollout: set actor_rollout_ref.rollout.calculate_log_probs=True`);
    oneOf(cfg, `${RC}.loss_type`, ["ppo_clip", "reinforce"], errors);
  }
}

/** Throws one ConfigError (exit 2) listing every bad name or range. */
export function validatePpoNames(cfg: Config): void {
  const errors: string[] = [];
  const A = "actor_rollout_ref.actor", R = "actor_rollout_ref.rollout";
  oneOf(cfg, "algorithm.adv_estimator", listAdvEstimators(), errors);
  oneOf(cfg, `${A}.policy_loss.loss_mode`, listPolicyLosses(), errors);
  oneOf(cfg, "reward_manager.name", knownRewardManagers(), errors);
  oneOf(cfg, "reward_model.reward_manager", knownRewardManagers(), errors);
  oneOf(cfg, "algorithm.kl_ctrl.type", KL_CTRL_TYPES, errors);
  oneOf(cfg, `${A}.kl_loss_type`, KL_NAMES, errors);
  oneOf(cfg, "algorithm.kl_penalty", KL_NAMES, errors);
  oneOf(cfg, `${R}.name`, rolloutEngineNames(), errors);
  for (const role of [A, "critic", "actor_rollout_ref.ref", "reward_model"]) oneOf(cfg, `${role}.strategy`, STRATEGIES, errors);
  optimizerName(cfg, `${A}.optim.optimizer`, errors);
  optimizerName(cfg, "critic.optim.optimizer", errors);
  samplingRanges(cfg, R, errors);
  samplingRanges(cfg, `${R}.val_kwargs`, errors);
  algorithmInputs(cfg, errors);
  // Megatron's LoRA keys: what has no PEFT equivalent fails here rather than in a worker
  for (const m of ["actor_rollout_ref.model", "critic.model"]) {
    try {
      readMegatronLora(new ConfigView(cfg, m));
    } catch (e) {
      errors.push((e as Error).message);
    }
  }
  // rollout.quantization: fp8 and torchao's built schemes pass; other schemes and names verl refuses fail here, not in a worker
  try {
    readRolloutQuantization(new ConfigView(cfg, R));
  } catch (e) {
    errors.push((e as Error).message);
  }
  if (errors.length > 0) throw new ConfigError(`invalid names or ranges in the config:\n  - ${errors.join("\n  - ")}`);
}
