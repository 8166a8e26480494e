// Name → function registries for advantage estimators (`algorithm.adv_estimator`) and
// policy losses (`actor_rollout_ref.actor.policy_loss.loss_mode`), seeded with the
// built-ins. Users add their own from a module the trainer imports (docs/extending.md).
// A taken name keeps its function; unknown names list the known ones.
import { NamedRegistry } from "../../../agent_loop/named_registry.js";
import type { AdvEstimatorFn, PolicyLossFn } from "./types.js";
import {
  computeGaeAdvantageReturn, computeReinforcePlusPlusOutcomeAdvantage, computeRemaxOutcomeAdvantage,
} from "./advantage.js";
import {
  computeGpgOutcomeAdvantage, computeGrpoOutcomeAdvantage, computeGrpoPasskOutcomeAdvantage,
  computeGrpoVectorizedOutcomeAdvantage, computeOpoOutcomeAdvantage, computeReinforcePlusPlusBaselineOutcomeAdvantage,
  computeRlooOutcomeAdvantage, computeRlooVectorizedOutcomeAdvantage,
} from "./advantage_group.js";
import { computeOptimalTokenBaselineAdvantage, computeTirOptimalTokenBaselineAdvantage } from "./advantage_otb.js";
import {
  computePolicyLossCispo, computePolicyLossGeoMean, computePolicyLossGpg, computePolicyLossGspo,
  computePolicyLossSapo, computePolicyLossVanilla,
} from "./policy_loss.js";
import { computePolicyLossClipCov, computePolicyLossKlCov } from "./policy_loss_cov.js";
import { computePolicyLossBypassMode } from "./policy_loss_bypass.js";

const advEstimators = new NamedRegistry<AdvEstimatorFn>("advantage estimator");
const policyLosses = new NamedRegistry<PolicyLossFn>("policy loss");

const BUILTIN_ADV_ESTIMATORS: Record<string, AdvEstimatorFn> = {
  gae: computeGaeAdvantageReturn,
  grpo: computeGrpoOutcomeAdvantage,
  grpo_vectorized: computeGrpoVectorizedOutcomeAdvantage,
  grpo_passk: computeGrpoPasskOutcomeAdvantage,
  reinforce_plus_plus: computeReinforcePlusPlusOutcomeAdvantage,
  reinforce_plus_plus_baseline: computeReinforcePlusPlusBaselineOutcomeAdvantage,
  rloo: computeRlooOutcomeAdvantage,
  rloo_vectorized: computeRlooVectorizedOutcomeAdvantage,
  opo: computeOpoOutcomeAdvantage,
  remax: computeRemaxOutcomeAdvantage,
  gpg: computeGpgOutcomeAdvantage,
  optimal_token_baseline: computeOptimalTokenBaselineAdvantage,
  tir_optimal_token_baseline: computeTirOptimalTokenBaselineAdvantage,
};

const BUILTIN_POLICY_LOSSES: Record<string, PolicyLossFn> = {
  vanilla: computePolicyLossVanilla,
  gspo: computePolicyLossGspo,
  sapo: computePolicyLossSapo,
  gpg: computePolicyLossGpg,
  clip_cov: computePolicyLossClipCov,
  kl_cov: computePolicyLossKlCov,
  geo_mean: computePolicyLossGeoMean,
  cispo: computePolicyLossCispo,
  bypass_mode: computePolicyLossBypassMode,
};

for (const [name, fn] of Object.entries(BUILTIN_ADV_ESTIMATORS)) advEstimators.register(name, fn);
for (const [name, fn] of Object.entries(BUILTIN_POLICY_LOSSES)) policyLosses.register(name, fn);

/** Register an advantage estimator under `name` (usable as algorithm.adv_estimator=name). */
export function registerAdvEstimator(name: string, fn: AdvEstimatorFn): AdvEstimatorFn {
  advEstimators.register(name, fn);
  return fn;
}

export function getAdvEstimator(name: string): AdvEstimatorFn {
  return advEstimators.get(name);
}

export function listAdvEstimators(): string[] {
  return advEstimators.names();
}

/** Register a policy loss under `name` (usable as actor_rollout_ref.actor.policy_loss.loss_mode=name). */
export function registerPolicyLoss(name: string, fn: PolicyLossFn): PolicyLossFn {
  policyLosses.register(name, fn);
  return fn;
}

export function getPolicyLoss(name: string): PolicyLossFn {
  return policyLosses.get(name);
}

export function listPolicyLosses(): string[] {
  return policyLosses.names();
}
