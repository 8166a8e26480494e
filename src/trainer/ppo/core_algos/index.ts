// Public surface of the algorithm layer (re-exported from the package root).
export type * from "./types.js";
export {
  registerAdvEstimator, getAdvEstimator, listAdvEstimators,
  registerPolicyLoss, getPolicyLoss, listPolicyLosses,
} from "./registry.js";
export {
  computeGaeAdvantageReturn, computeReinforcePlusPlusOutcomeAdvantage, computeRemaxOutcomeAdvantage,
} from "./advantage.js";
export {
  computeGrpoOutcomeAdvantage, computeGrpoVectorizedOutcomeAdvantage, computeGrpoPasskOutcomeAdvantage,
  computeReinforcePlusPlusBaselineOutcomeAdvantage, computeRlooOutcomeAdvantage, computeRlooVectorizedOutcomeAdvantage,
  computeOpoOutcomeAdvantage, computeGpgOutcomeAdvantage,
} from "./advantage_group.js";
export { computeOptimalTokenBaselineAdvantage, computeTirOptimalTokenBaselineAdvantage } from "./advantage_otb.js";
export {
  computePolicyLossVanilla, computePolicyLossGspo, computePolicyLossSapo, computePolicyLossGpg,
  computePolicyLossGeoMean, computePolicyLossCispo,
} from "./policy_loss.js";
export { computePolicyLossClipCov, computePolicyLossKlCov, selectTopK } from "./policy_loss_cov.js";
export { computePolicyLossBypassMode, computePolicyLossReinforce, bypassIsWeights, bypassRejectionMask } from "./policy_loss_bypass.js";
export { aggLoss, aggLossOptionsFromConfig, checkLossAggMode, LOSS_AGG_MODES, type LossAggMode } from "./agg_loss.js";
export {
  klPenalty, klPenaltyForward, KL_PENALTY_KINDS, FixedKLController, AdaptiveKLController, getKlController, type KlController,
} from "./kl.js";
export { computeValueLoss, type ValueLossArgs } from "./value_loss.js";
export {
  stopGradient, detached, toFloatMask, maskedSum, maskedMean, maskedVar, maskedWhiten, getResponseMask,
} from "./functional.js";
export { entropyFromLogits } from "../../../rollout/log_probs.js";
export {
  getLrSchedule, constantScheduleWithWarmup, cosineScheduleWithWarmup,
  type LrSchedule, type OptimScheduleConfig, type CosineScheduleOptions,
} from "./lr_schedule.js";
export {
  computeAdvantage, applyKlPenalty, computeResponseMask, pfPpoSampleIndices, type ComputeAdvantageOptions,
} from "./batch_ops.js";
export { keepMetrics, readMetrics } from "./loss_metrics.js";
// Step metrics and sequence balancing live beside core_algos (as in verl); exported
// here too so the package root needs one import for the whole algorithm layer.
export {
  computeDataMetrics, computeTimingMetrics, computeThroughputMetrics, computeResponseInfo,
  reduceMetrics, Metric, appendToDict, processValidationMetrics, validationMetricsToDict, bootstrapMetric, calcMajVal, genNs,
  type Aggregation,
} from "../metric_utils.js";
export {
  calculateWorkload, karmarkarKarp, getSeqlenBalancedPartitions, logSeqlenUnbalance, balanceBatchOrder,
  rearrangeMicroBatches, numMicroBatchesFor, getReverseIdx, ceildiv, roundupDivisible,
  type BalanceBatchOptions, type RearrangeOptions,
} from "../seqlen_balancing.js";
