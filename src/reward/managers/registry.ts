// Reward managers by name (reward_model.reward_manager), as verl's
// register(name) / get_reward_manager_cls(name).
import type { RewardManagerClass } from "../types.js";

const managers = new Map<string, RewardManagerClass>();

export function registerRewardManager(name: string, cls: RewardManagerClass): void {
  if (typeof name !== "string" || name.length === 0) throw new Error("registerRewardManager: the name must be a non-empty string");
  if (typeof cls !== "function") throw new Error(`registerRewardManager("${name}"): expected a class`);
  const existing = managers.get(name);
  if (existing && existing !== cls) throw new Error(`reward manager "${name}" is already registered (${existing.name}); pick another name`);
  managers.set(name, cls);
}

export function getRewardManager(name: string): RewardManagerClass {
  const cls = managers.get(name);
  if (!cls) {
    throw new Error(`unknown reward manager "${name}" (reward_model.reward_manager); known: ${[...managers.keys()].sort().join(", ")}. Register one with registerRewardManager(name, class).`);
  }
  return cls;
}

export function knownRewardManagers(): string[] {
  return [...managers.keys()].sort();
}
