// loadRewardManager: verl's load_reward_manager (or, with reward_model.reward_loop_source=importlib,
// the user's reward loop class: reward_loop.ts). Picks the manager class by
// reward_model.reward_manager (or reward_manager.{source: importlib, module.path, name}
// for a class in the user's own module) and hands it the custom reward
// function when custom_reward_function.path is set (else, with reward_model.sandbox_fusion.url,
// the built-in scorers with the code data sources sent to the sandbox: sandbox_fusion.ts).
import { getPath, type Config } from "../config/index.js";
import type { Tokenizer } from "../models/tokenizer.js";
import { asRecord, loadCustomRewardFunction, loadExport } from "./custom.js";
import { getRewardManager } from "./managers/index.js";
import { sandboxDefaultComputeScore, sandboxSettings } from "./sandbox_fusion.js";
import { RewardLoopRewardManager, rewardLoopSource } from "./reward_loop.js";
import { containmentOptions } from "./timeout.js";
import type { RewardManager, RewardManagerClass } from "./types.js";
import type { ServedRewardModelRef } from "./served_reward_model.js";

async function managerClass(config: Config): Promise<RewardManagerClass> {
  const source = getPath(config, "reward_manager.source") ?? "register";
  if (source === "importlib") {
    const path = getPath(config, "reward_manager.module.path");
    const name = getPath(config, "reward_manager.name");
    if (typeof path !== "string" || typeof name !== "string") {
      throw new Error("reward_manager.source=importlib needs reward_manager.module.path and reward_manager.name");
    }
    const cls = await loadExport(path, name);
    if (typeof cls !== "function") throw new Error(`reward manager module ${path}: export '${name}' is not a class`);
    return cls as RewardManagerClass;
  }
  if (source !== "register") throw new Error(`reward_manager.source must be "register" or "importlib", got ${JSON.stringify(source)}`);
  // reward_manager.name defaults to reward_model.reward_manager, so reading it first honours both spellings.
  const name = getPath(config, "reward_manager.name") ?? getPath(config, "reward_model.reward_manager") ?? "naive";
  if (typeof name !== "string") throw new Error(`reward_model.reward_manager must be a string, got ${JSON.stringify(name)}`);
  return getRewardManager(name);
}

export interface LoadRewardManagerOptions {
  /** Samples per data source to log per call (verl: 0 in training, 1 in validation). */
  numExamine: number;
  /** Extra manager options; override reward_model.reward_kwargs. */
  rewardKwargs?: Record<string, unknown>;
  /** The generative reward model served for the run (reward_model_server.ts): the reward function (or loop class) gets its address and tokenizer. */
  servedRewardModel?: ServedRewardModelRef;
}

export async function loadRewardManager(config: Config, tokenizer: Tokenizer, opts: LoadRewardManagerOptions): Promise<RewardManager> {
  // verl's reward loop (use_reward_loop, its default) builds the user's class in place of the manager.
  const loop = rewardLoopSource(config, opts.servedRewardModel);
  const rewardKwargs = { ...asRecord(getPath(config, "reward_model.reward_kwargs"), "reward_model.reward_kwargs"), ...(opts.rewardKwargs ?? {}) };
  if (loop) return new RewardLoopRewardManager(loop, containmentOptions(rewardKwargs));
  const custom = await loadCustomRewardFunction(config, opts.servedRewardModel);
  const cls = await managerClass(config);
  // verl binds the sandbox into its default scorer only when no custom reward function is set.
  const sandbox = custom ? null : sandboxSettings(config);
  const sandboxFns = sandbox ? sandboxDefaultComputeScore(sandbox) : null;
  const rewardFnKey = getPath(config, "data.reward_fn_key") ?? "data_source";
  if (typeof rewardFnKey !== "string") throw new Error(`data.reward_fn_key must be a string, got ${JSON.stringify(rewardFnKey)}`);
  return new cls({
    tokenizer,
    numExamine: opts.numExamine,
    computeScore: custom?.computeScore ?? sandboxFns?.computeScore,
    computeBatch: custom?.computeBatch ?? sandboxFns?.computeBatch,
    ...(sandboxFns ? { computeScoreInDriver: true } : {}),
    computeScoreSource: custom?.source,
    rewardFnKey,
    rewardKwargs,
    config,
  });
}
