// Public surface of the workers layer: the per-rank roles the trainer drives
// (verl's fsdp_workers, data-parallel over threads) and their building blocks.
export { ActorRolloutRefWorker, type ActorRole } from "./actor_rollout_ref_worker.js";
export { CriticWorker } from "./critic_worker.js";
export { RewardModelWorker } from "./reward_model_worker.js";
export { DataParallelPPOActor, type DpActorOptions, type MetricLists } from "./actor/dp_actor.js";
export { DataParallelPPOCritic, type DpCriticOptions } from "./critic/dp_critic.js";
export { DataParallelOptimizer, type DpOptimizerState, type AllReducer } from "./dp_optimizer.js";
export { ConfigView } from "./config_view.js";
export { SCRATCH, loadModelTokenizer, loadPolicy, loadValueModel, importExternalLib, modelKind, scratchConfig, expandHome } from "./model_source.js";
export { saveRoleCheckpoint, loadRoleCheckpoint, CHECKPOINT_FORMAT } from "./checkpoint.js";
export { microBatches, miniBatches, seqLens, type MicroBatchSpec } from "./batching.js";
