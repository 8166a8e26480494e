// Reading the actor config (snake_case keys from the YAML) for the policy losses,
// with verl's defaults and clear errors for wrongly typed values.
import type * as tf from "@tensorflow/tfjs";
import type { ActorLossConfig, AggLossOptions, PolicyLossArgs, PolicyLossConfig } from "./types.js";
import { aggLossOptionsFromConfig } from "./agg_loss.js";

export function numberKey(obj: Record<string, unknown> | undefined, key: string, fallback: number, where: string): number {
  const v = obj?.[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "number" || Number.isNaN(v)) throw new Error(`${where}.${key} must be a number, got ${JSON.stringify(v)}`);
  return v;
}

export function actorNumber(config: ActorLossConfig, key: string, fallback: number): number {
  return numberKey(config, key, fallback, "actor_rollout_ref.actor");
}

export function policyLossNumber(config: ActorLossConfig, key: keyof PolicyLossConfig & string, fallback: number): number {
  return numberKey(config.policy_loss, key, fallback, "actor_rollout_ref.actor.policy_loss");
}

/** ε_low and ε_high: clip_ratio_low/high, each defaulting to clip_ratio (0.2). */
export function clipRange(config: ActorLossConfig): { low: number; high: number } {
  const base = actorNumber(config, "clip_ratio", 0.2);
  return { low: actorNumber(config, "clip_ratio_low", base), high: actorNumber(config, "clip_ratio_high", base) };
}

export function batchInfo(args: PolicyLossArgs): AggLossOptions {
  return args.globalBatchInfo ?? aggLossOptionsFromConfig(args.config);
}

export function lossAggModeOf(args: PolicyLossArgs): string {
  return args.lossAggMode ?? args.config.loss_agg_mode ?? "token-mean";
}

export function requireConfig(args: PolicyLossArgs, loss: string): void {
  if (!args.config || typeof args.config !== "object") throw new Error(`policy loss '${loss}' needs \`config\` (the actor config)`);
}

/** Check the four [B,T] inputs agree in shape. */
export function checkLossShapes(args: PolicyLossArgs, loss: string): void {
  const ref = args.logProb.shape.join();
  const named: [string, tf.Tensor | null | undefined][] = [
    ["oldLogProb", args.oldLogProb], ["advantages", args.advantages], ["responseMask", args.responseMask], ["rolloutIsWeights", args.rolloutIsWeights],
  ];
  for (const [name, t] of named) {
    if (t && t.shape.join() !== ref) {
      throw new Error(`policy loss '${loss}': ${name} has shape [${t.shape.join(", ")}] but logProb has [${args.logProb.shape.join(", ")}]`);
    }
  }
}
