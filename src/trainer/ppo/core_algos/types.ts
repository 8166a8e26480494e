// Shapes shared by the algorithm modules. Argument objects carry verl's parameter
// names in camelCase so a custom verl estimator or loss ports line by line; config
// objects keep verl's snake_case keys because they come straight from the YAML.
import type * as tf from "@tensorflow/tfjs";
import type { TensorData } from "../../../protocol/tensor.js";
import type { Rng } from "../../../utils/rng.js";

/** What the algorithm layer needs of a DataProto (src/protocol/data_proto.ts satisfies it). */
export interface DataProtoLike {
  batch: Record<string, TensorData>;
  nonTensorBatch: Record<string, unknown[]>;
  metaInfo: Record<string, unknown>;
}

/** The `algorithm` config section (plain object from the YAML). */
export interface AlgoConfig {
  gamma?: number;
  lam?: number;
  adv_estimator?: string;
  norm_adv_by_std_in_grpo?: boolean;
  use_kl_in_reward?: boolean;
  kl_penalty?: string;
  kl_ctrl?: KlCtrlConfig;
  use_pf_ppo?: boolean;
  pf_ppo?: { reweight_method?: string; weight_pow?: number };
  [key: string]: unknown;
}

export interface KlCtrlConfig {
  type?: string;
  kl_coef?: number;
  horizon?: number;
  target_kl?: number;
}

/** Arguments every advantage estimator receives; each reads the ones it needs. */
export interface AdvEstimatorArgs {
  /** [B,T] per-token rewards (scores minus any in-reward KL). */
  tokenLevelRewards: tf.Tensor;
  /** [B,T] 1 where the token is a model token, 0 for padding and tool output. */
  responseMask: tf.Tensor;
  /** [B,T] critic values (gae). */
  values?: tf.Tensor;
  /** Group id of each row (the prompt's `uid`, repeated for its n samples). */
  index?: readonly (string | number)[];
  gamma?: number;
  lam?: number;
  normAdvByStdInGrpo?: boolean;
  /** [B] greedy-rollout rewards (remax). */
  rewardBaselines?: tf.Tensor;
  /** [B,T] the actor's log-probs of the sampled tokens (optimal_token_baseline). */
  oldLogProbs?: tf.Tensor;
  /** [B,T] Σ_v π(v)² at each response position (actor.calculate_sum_pi_squared; optimal_token_baseline). */
  sumPiSquared?: tf.Tensor;
  /** [B,T] rollout-correction IS weights, when rollout_is is on (optimal_token_baseline scales by their square). */
  rolloutIsWeights?: tf.Tensor;
  epsilon?: number;
  config?: AlgoConfig;
  /** The whole batch, for custom estimators that need more columns. */
  data?: DataProtoLike;
}

export interface AdvEstimatorOutput {
  advantages: tf.Tensor2D;
  returns: tf.Tensor2D;
}

export type AdvEstimatorFn = (args: AdvEstimatorArgs) => AdvEstimatorOutput;

/** `actor_rollout_ref.actor.policy_loss`. */
export interface PolicyLossConfig {
  loss_mode?: string;
  clip_cov_ratio?: number | null;
  clip_cov_lb?: number | null;
  clip_cov_ub?: number | null;
  kl_cov_ratio?: number | null;
  ppo_kl_coef?: number | null;
  [key: string]: unknown;
}

/** The slice of `actor_rollout_ref.actor` the losses read (snake_case, as in the YAML). */
export interface ActorLossConfig {
  clip_ratio?: number;
  clip_ratio_low?: number | null;
  clip_ratio_high?: number | null;
  clip_ratio_c?: number;
  tau_pos?: number;
  tau_neg?: number;
  loss_agg_mode?: string;
  loss_scale_factor?: number | null;
  policy_loss?: PolicyLossConfig;
  /** verl's runtime field: set per mini-batch by the worker (see aggLoss). */
  global_batch_info?: GlobalBatchInfoConfig;
  [key: string]: unknown;
}

export interface GlobalBatchInfoConfig {
  dp_size?: number;
  batch_num_tokens?: number | null;
  global_batch_size?: number | null;
  loss_scale_factor?: number | null;
}

/** Global normalisation for aggLoss (see agg_loss.ts for how a worker fills it). */
export interface AggLossOptions {
  dpSize?: number;
  batchNumTokens?: number | null;
  globalBatchSize?: number | null;
  lossScaleFactor?: number | null;
}

export interface PolicyLossArgs {
  oldLogProb: tf.Tensor;
  logProb: tf.Tensor;
  advantages: tf.Tensor;
  responseMask: tf.Tensor;
  lossAggMode?: string;
  config: ActorLossConfig;
  rolloutIsWeights?: tf.Tensor | null;
  /** Overrides `config.global_batch_info`. */
  globalBatchInfo?: AggLossOptions;
  /** Needed by losses that draw random numbers (clip_cov). */
  rng?: Rng;
}

/**
 * Metric values are scalar tensors (or plain numbers). They are created inside the
 * gradient tape; keep them with `keepMetrics` there and read them after with `readMetrics`.
 */
export type LossMetrics = Record<string, tf.Scalar | number>;

export interface PolicyLossOutput {
  pgLoss: tf.Scalar;
  metrics: LossMetrics;
}

export type PolicyLossFn = (args: PolicyLossArgs) => PolicyLossOutput;
