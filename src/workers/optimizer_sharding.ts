// How many ranks share one copy of a role's optimizer state (ZeRO-1 shards,
// DataParallelOptimizer's `shards`), from the verl keys that say it for the role's
// strategy. verl's FSDP always shards optimizer state: over all ranks (FULL_SHARD) when
// fsdp_size is -1 or at least the world size, otherwise over groups of fsdp_size
// ranks, replicated across the groups (HYBRID_SHARD; fsdp_size=1 is plain data
// parallelism). Megatron shards it over the data-parallel ranks when
// use_distributed_optimizer is true and replicates it when false.
import type { ConfigView } from "./config_view.js";

/**
 * `engine`: the section with the role's engine keys (an FSDP role's fsdp_config, a Megatron
 * role's megatron section, the engine SFT trainer's engine); `strategy`: the role's strategy.
 */
export function optimizerShards(engine: ConfigView, strategy: string, worldSize: number): number {
  if (strategy === "megatron") return engine.bool("use_distributed_optimizer", true) ? worldSize : 1;
  const size = engine.int("fsdp_size", -1);
  if (size < 0 || size >= worldSize) return worldSize;
  if (size === 0 || worldSize % size !== 0) {
    throw new Error(`${engine.key("fsdp_size")}=${size} must divide the world size ${worldSize} (verl's device mesh is world_size // fsdp_size x fsdp_size), or be -1 for all ranks`);
  }
  return size;
}

/** The actor's or critic's shards: `role` is actor_rollout_ref.actor or critic, `fsdpConfig` its fsdp_config path. */
export function roleOptimizerShards(role: ConfigView, fsdpConfig: string, worldSize: number): number {
  const strategy = role.str("strategy", "fsdp");
  return optimizerShards(strategy === "megatron" ? role.at("megatron") : role.at(fsdpConfig), strategy, worldSize);
}
