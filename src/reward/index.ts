// Rewards: rule-based scorers by data_source, custom reward functions, reward managers.
export type {
  BatchComputeScoreFn, ComputeScoreFn, RewardFnSource, RewardManager, RewardManagerClass, RewardManagerOptions,
  RewardResult, ScoreDict, ScoreValue, ScorerFn,
} from "./types.js";
export { defaultComputeScore, getScorer, knownDataSources, normalizeScore, registerScorer, type RegisterScorerOptions } from "./scorers/registry.js";
export { extractGsm8kSolution, gsm8kComputeScore } from "./scorers/gsm8k.js";
export { isEquiv, lastBoxedOnlyString, mathComputeScore, removeBoxed, stripString } from "./scorers/math.js";
export { loadCustomRewardFunction, type CustomRewardFunction } from "./custom.js";
export {
  BatchRewardManager, DapoRewardManager, NaiveRewardManager, PrimeRewardManager,
  getRewardManager, knownRewardManagers, registerRewardManager,
} from "./managers/index.js";
export { loadRewardManager, type LoadRewardManagerOptions } from "./load.js";
export { ScoringPool, type ScoreOutcome } from "./scoring_pool.js";
export { evaluateGenerations, type EvalColumns } from "./evaluate.js";
