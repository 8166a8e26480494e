// How long user reward code may run, and in how many scoring threads or processes:
// reward_model.reward_kwargs.{timeout_s,num_workers}, read the same way by every
// manager and for JS and Python reward files alike.
import { availableParallelism } from "node:os";
import { getPath, type Config } from "../config/index.js";

export interface ContainmentOptions {
  /** Scoring threads (reward_model.reward_kwargs.num_workers; default the number of cores, at most 64). */
  numWorkers: number;
  /** Seconds one sample (or one batch call) may take (reward_model.reward_kwargs.timeout_s; default DEFAULT_REWARD_TIMEOUT_S). */
  timeoutS: number;
}

function positiveNumber(v: unknown, key: string, fallback: number): number {
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "number" || !(v > 0)) throw new Error(`reward_model.reward_kwargs.${key} must be a positive number, got ${JSON.stringify(v)}`);
  return v;
}

/**
 * Default reward_model.reward_kwargs.timeout_s: a hung reward fails the step within a minute under
 * naive, dapo and batch (which have no timeout in verl, so no verl default to keep); prime keeps
 * verl's 300 s, since there a sample past it only scores 0.
 */
export const DEFAULT_REWARD_TIMEOUT_S = { default: 60, prime: 300 } as const;

/** num_workers and timeout_s from reward_model.reward_kwargs (verl's prime defaults: 64 workers, 300 s). */
export function containmentOptions(rewardKwargs: Record<string, unknown>, manager: "prime" | "default" = "default"): ContainmentOptions {
  return {
    numWorkers: Math.floor(positiveNumber(rewardKwargs.num_workers, "num_workers", Math.min(64, availableParallelism()))),
    timeoutS: positiveNumber(rewardKwargs.timeout_s, "timeout_s", DEFAULT_REWARD_TIMEOUT_S[manager]),
  };
}

/** timeout_s (seconds) for the manager a composed config names: the limit on each Python call and on its import. */
export function rewardTimeoutFromConfig(config: Config): number {
  const kwargs = getPath(config, "reward_model.reward_kwargs");
  const manager = getPath(config, "reward_manager.name") ?? getPath(config, "reward_model.reward_manager");
  const kw = typeof kwargs === "object" && kwargs !== null && !Array.isArray(kwargs) ? (kwargs as Record<string, unknown>) : {};
  return containmentOptions(kw, manager === "prime" ? "prime" : "default").timeoutS;
}
