// verl's batch-size arithmetic, checked before any work starts so a bad
// combination fails in a second with the keys named, not minutes into a run.
// Sizes count prompts (train_batch_size, ppo_mini_batch_size) or sequences
// (micro batches); a mini-batch of prompts becomes mini*n sequences, split over
// the world of ranks (trainer.n_gpus_per_node * trainer.nnodes worker threads).
import type { BackendName } from "../engine/backend.js";
import { ConfigError } from "./errors.js";
import { getPath, type Config } from "./tree.js";

export const LOSS_AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] as const;

/** Per-rank sizes the workers use, derived from the config the way verl's workers normalise them. */
export interface PpoBatchPlan {
  worldSize: number;
  rolloutN: number;
  /** Sequences per rank per actor mini-batch (ppo_mini_batch_size * n / world). */
  actorMiniBatchPerRank: number;
  /** Sequences per actor forward/backward pass on a rank (null with dynamic batch size). */
  actorMicroBatchPerRank: number | null;
  criticMiniBatchPerRank: number | null;
  criticMicroBatchPerRank: number | null;
  needCritic: boolean;
  needReference: boolean;
}

function num(cfg: Config, key: string, errors: string[]): number | null {
  const v = getPath(cfg, key);
  if (v === null || v === undefined) return null;
  if (typeof v !== "number" || !Number.isFinite(v)) {
    errors.push(`${key} must be a number, got ${JSON.stringify(v)}`);
    return null;
  }
  return v;
}

function posInt(cfg: Config, key: string, errors: string[]): number | null {
  const v = num(cfg, key, errors);
  if (v === null) return null;
  if (!Number.isInteger(v) || v <= 0) {
    errors.push(`${key} must be a positive integer, got ${v}`);
    return null;
  }
  return v;
}

function flag(cfg: Config, key: string): boolean {
  return getPath(cfg, key) === true;
}

/**
 * The micro-batch size per rank for one role: exactly one of `<prefix>micro_batch_size` (global, deprecated)
 * and `<prefix>micro_batch_size_per_gpu` must be set unless dynamic batch size is on.
 */
function microPerRank(cfg: Config, role: string, prefix: string, dynamicKey: string, world: number, errors: string[]): number | null {
  const globalKey = `${role}.${prefix}micro_batch_size`, perKey = `${role}.${prefix}micro_batch_size_per_gpu`;
  const g = posInt(cfg, globalKey, errors), p = posInt(cfg, perKey, errors);
  const dynamic = flag(cfg, `${role}.${dynamicKey}`);
  if (g !== null && p !== null) {
    errors.push(`${globalKey} (${g}) and ${perKey} (${p}) are both set: set only ${perKey} (${globalKey} is deprecated)`);
    return null;
  }
  if (g === null && p === null) {
    if (!dynamic) errors.push(`neither ${globalKey} nor ${perKey} is set: set ${perKey} (sequences per rank per forward pass), or ${role}.${dynamicKey}=true`);
    return null;
  }
  if (p !== null) return p;
  if (g! % world !== 0 || g! < world) {
    errors.push(`${globalKey} (${g}) must be a multiple of the world size ${world}; it is split evenly over ranks (or set ${perKey})`);
    return null;
  }
  return g! / world;
}

/** Mini-batch arithmetic for the actor or the critic; returns sequences per rank per mini-batch. */
function miniBatch(cfg: Config, role: string, trainBatch: number | null, n: number, world: number, micro: number | null, errors: string[]): number | null {
  const key = `${role}.ppo_mini_batch_size`;
  const mini = posInt(cfg, key, errors);
  if (mini === null || trainBatch === null) return null;
  if (trainBatch < mini) {
    errors.push(`data.train_batch_size (${trainBatch}) must be >= ${key} (${mini}): lower ${key} by ${mini - trainBatch} or raise data.train_batch_size`);
    return null;
  }
  const sequences = mini * n;
  if (sequences % world !== 0) {
    errors.push(`${key} * rollout.n (${mini} * ${n} = ${sequences}) must be divisible by the world size ${world} (trainer.n_gpus_per_node * trainer.nnodes); remainder ${sequences % world}`);
    return null;
  }
  const perRank = sequences / world;
  if (micro !== null && perRank % micro !== 0) {
    errors.push(
      `${key} * rollout.n / world = ${mini} * ${n} / ${world} = ${perRank} sequences per rank must be divisible by the micro-batch size ${micro} (${role}.ppo_micro_batch_size_per_gpu); remainder ${perRank % micro}`,
    );
  }
  return perRank;
}

/** Check the PPO config's sizes and modes; throws one ConfigError listing every problem. */
export function validatePpoConfig(cfg: Config): PpoBatchPlan {
  const errors: string[] = [];
  const A = "actor_rollout_ref.actor", R = "actor_rollout_ref.rollout", REF = "actor_rollout_ref.ref";
  const nodes = posInt(cfg, "trainer.nnodes", errors) ?? 1;
  const perNode = posInt(cfg, "trainer.n_gpus_per_node", errors) ?? 1;
  const world = nodes * perNode;
  const n = posInt(cfg, `${R}.n`, errors) ?? 1;
  const trainBatch = posInt(cfg, "data.train_batch_size", errors);
  const actorDynamic = flag(cfg, `${A}.use_dynamic_bsz`);

  if (trainBatch !== null && !actorDynamic && (trainBatch * n) % world !== 0) {
    errors.push(
      `data.train_batch_size * rollout.n (${trainBatch} * ${n} = ${trainBatch * n}) must be divisible by the world size ${world} (trainer.n_gpus_per_node ${perNode} * trainer.nnodes ${nodes}); remainder ${(trainBatch * n) % world}`,
    );
  }

  const actorMicro = microPerRank(cfg, A, "ppo_", "use_dynamic_bsz", world, errors);
  const actorMini = miniBatch(cfg, A, trainBatch, n, world, actorDynamic ? null : actorMicro, errors);
  microPerRank(cfg, R, "log_prob_", "log_prob_use_dynamic_bsz", world, errors);

  const needReference = flag(cfg, "algorithm.use_kl_in_reward") || flag(cfg, `${A}.use_kl_loss`);
  if (needReference) microPerRank(cfg, REF, "log_prob_", "log_prob_use_dynamic_bsz", world, errors);

  const criticEnable = getPath(cfg, "critic.enable");
  const needCritic = criticEnable === null || criticEnable === undefined ? getPath(cfg, "algorithm.adv_estimator") === "gae" : criticEnable === true;
  let criticMini: number | null = null, criticMicro: number | null = null;
  if (needCritic) {
    criticMicro = microPerRank(cfg, "critic", "ppo_", "use_dynamic_bsz", world, errors);
    criticMini = miniBatch(cfg, "critic", trainBatch, n, world, flag(cfg, "critic.use_dynamic_bsz") ? null : criticMicro, errors);
  }
  if (flag(cfg, "reward_model.enable")) {
    // a generative reward model is served, not run in micro-batches
    if (generativeRewardModel(cfg) === null) microPerRank(cfg, "reward_model", "", "use_dynamic_bsz", world, errors);
    const served = servedRewardModel(cfg);
    if (served !== null && !(SERVED_RM_ENGINES as readonly string[]).includes(served)) {
      errors.push(`reward_model.rollout.name is ${JSON.stringify(served)}; verl's reward loop serves a reward model with ${SERVED_RM_ENGINES.join(" or ")} (TensorRT-LLM does not support reward models)`);
    }
    const custom = getPath(cfg, "custom_reward_function.path");
    if (generativeRewardModel(cfg) !== null && typeof custom === "string" && (custom.startsWith("pkg://") || /\.py$/i.test(custom))) {
      errors.push(
        `reward_model.rollout.name=${served} with custom_reward_function.path=${custom}: verl hands the function the reward model's Hugging Face ` +
          "tokenizer (reward_model_tokenizer), which a Python process here cannot have (verl-ts runs no transformers); write the function in JS/TS, " +
          "where it gets the reward model's verl-ts tokenizer and the server's address (docs/rewards.md)",
      );
    }
  }

  for (const key of [`${A}.loss_agg_mode`, ...(needCritic ? ["critic.loss_agg_mode"] : [])]) {
    const mode = getPath(cfg, key);
    if (!(LOSS_AGG_MODES as readonly unknown[]).includes(mode)) errors.push(`${key} is ${JSON.stringify(mode)}; it must be one of ${LOSS_AGG_MODES.join(", ")}`);
  }
  const c = num(cfg, `${A}.clip_ratio_c`, errors);
  if (c !== null && !(c > 1)) errors.push(`${A}.clip_ratio_c must be greater than 1.0 (it bounds the dual clip for negative advantages), got ${c}`);
  // A negative clip range turns [1 - eps, 1 + eps] inside out: every ratio would be clipped (or none), silently.
  for (const key of [`${A}.clip_ratio`, `${A}.clip_ratio_low`, `${A}.clip_ratio_high`, ...(needCritic ? ["critic.cliprange_value"] : [])]) {
    const eps = num(cfg, key, errors);
    if (eps !== null && eps < 0) errors.push(`${key} must be >= 0 (the clip range is [1 - eps, 1 + eps]), got ${eps}`);
  }
  const temperature = num(cfg, `${R}.temperature`, errors);
  if (temperature !== null && !(temperature > 0)) {
    errors.push(`${R}.temperature must be > 0 for training (the actor scores the sampled responses at logits / temperature), got ${temperature}; `
      + `greedy decoding is for validation: ${R}.val_kwargs.do_sample=false or ${R}.val_kwargs.temperature=0`);
  }

  if (errors.length > 0) throw new ConfigError(`invalid PPO config:\n  - ${errors.join("\n  - ")}`);
  return {
    worldSize: world,
    rolloutN: n,
    actorMiniBatchPerRank: actorMini!,
    actorMicroBatchPerRank: actorDynamic ? null : actorMicro,
    criticMiniBatchPerRank: criticMini,
    criticMicroBatchPerRank: criticMicro,
    needCritic,
    needReference,
  };
}

// The engine's backend names; a type-only import keeps tfjs out of config loading.
const DEVICES = ["auto", "wasm", "cpu", "tensorflow", "webgpu"] as const satisfies readonly BackendName[];

/** trainer.device must name an engine backend (verl scripts often say `cuda`). */
export function validateDevice(cfg: Config): void {
  const device = getPath(cfg, "trainer.device");
  if (device === undefined || device === null) return;
  if (!(DEVICES as readonly unknown[]).includes(device)) {
    throw new ConfigError(
      `trainer.device is ${JSON.stringify(device)}; verl-ts runs on the tensor backends ${DEVICES.join(", ")} (for an NVIDIA GPU: tensorflow with @tensorflow/tfjs-node-gpu, or webgpu)`,
    );
  }
}

/** Engines verl's reward loop serves a discriminative reward model with (its classify / embeddings endpoints). */
export const SERVED_RM_ENGINES = ["vllm", "sglang"] as const;

/**
 * reward_model.rollout.name when verl's reward loop would serve the reward model (use_reward_loop, its default),
 * else null ('???', verl's unset mandatory value, counts as unset).
 */
export function servedRewardModel(cfg: Config): string | null {
  const name = getPath(cfg, "reward_model.rollout.name");
  if (name === undefined || name === null || name === "???" || getPath(cfg, "reward_model.use_reward_loop") === false) return null;
  return String(name);
}

/**
 * The serving engine's name when the reward model is generative, as verl's reward loop tells it: the
 * model is served (reward_model.enable with rollout.name) and custom_reward_function.path is set, so the
 * function receives the server's address and queries it; else null (a served model without a function
 * is discriminative: its score head rates each response).
 */
export function generativeRewardModel(cfg: Config): string | null {
  const custom = getPath(cfg, "custom_reward_function.path");
  if (getPath(cfg, "reward_model.enable") !== true || custom === undefined || custom === null || custom === "") return null;
  return servedRewardModel(cfg);
}
