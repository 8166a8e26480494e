// Shared reward types. A score is a number (booleans count as 0/1) or a dict
// whose `score` is the reward and whose other fields reach the metrics as
// reward_extra_info, as in verl.
import type { DataProto } from "../protocol/data_proto.js";
import type { TensorData } from "../protocol/tensor.js";
import type { Tokenizer } from "../models/tokenizer.js";
import type { Config } from "../config/index.js";
import type { ServedRewardModelRef } from "./served_reward_model.js";

export interface ScoreDict {
  score: number;
  [key: string]: unknown;
}
export type ScoreValue = number | boolean | ScoreDict;
export type MaybePromise<T> = T | Promise<T>;

/** A scorer for one data source: verl's `<module>.compute_score(solution_str, ground_truth)`. */
export type ScorerFn = (solutionStr: string, groundTruth: unknown, extraInfo?: Record<string, unknown> | null) => MaybePromise<ScoreValue>;

/** verl's compute_score(data_source, solution_str, ground_truth, extra_info); JS passes reward kwargs as a 5th argument. */
export type ComputeScoreFn = (
  dataSource: string,
  solutionStr: string,
  groundTruth: unknown,
  extraInfo?: Record<string, unknown> | null,
  kwargs?: Record<string, unknown>,
) => MaybePromise<unknown>;

/** The batch manager's form: one call with the lists of the whole batch. */
export type BatchComputeScoreFn = (
  dataSources: string[],
  solutionStrs: string[],
  groundTruths: unknown[],
  extraInfos: (Record<string, unknown> | null)[],
  kwargs?: Record<string, unknown>,
) => MaybePromise<unknown>;

/** Where a reward function lives, so worker threads (prime manager) can load it themselves. */
export interface RewardFnSource {
  path: string;
  name: string;
  kwargs: Record<string, unknown>;
  /** A generative reward model served for the run: each call also gets reward_router_address and reward_model_tokenizer. */
  servedRewardModel?: ServedRewardModelRef;
}

export interface RewardResult {
  /** [B, R] float32: the score sits at each row's last valid response token. */
  rewardTensor: TensorData;
  rewardExtraInfo: Record<string, unknown[]>;
  metrics?: Record<string, number>;
}

export interface RewardManager {
  compute(data: DataProto): Promise<RewardResult>;
  /** Release threads or other resources (the prime manager's worker pool). */
  close?(): Promise<void>;
}

export interface RewardManagerOptions {
  tokenizer: Tokenizer;
  /** Samples per data source printed through the logger on each call (verl: 0 for training, 1 for validation). */
  numExamine: number;
  /** The user's compute_score (per-sample form; the batch manager calls it in batch form), or undefined for the built-in scorers. */
  computeScore?: (...args: never[]) => unknown;
  /** The same function in batch form, where it differs (a Python function is called with keywords); the batch manager prefers it. */
  computeBatch?: BatchComputeScoreFn;
  /**
   * computeScore waits on a service rather than computing (Sandbox Fusion): the prime manager then calls it in
   * this thread, all rows at once under its timeout, instead of refusing a function its threads cannot receive.
   */
  computeScoreInDriver?: boolean;
  /** Where computeScore came from (set by loadRewardManager); the prime manager needs it to load the function in its workers. */
  computeScoreSource?: RewardFnSource;
  /** Non-tensor key holding the data source (data.reward_fn_key). */
  rewardFnKey: string;
  /** reward_model.reward_kwargs: manager options / extra kwargs (batch manager). */
  rewardKwargs: Record<string, unknown>;
  /** The whole config, for managers that read more keys (dapo: overlong_buffer, max_response_length). */
  config?: Config;
}

export type RewardManagerClass = new (opts: RewardManagerOptions) => RewardManager;
