// `verl train`: build everything a PPO run needs from the composed config (verl's
// main_ppo TaskRunner), run the fit loop, and always tear the worker threads down.
import { validatePpoConfig, type Config } from "../config/index.js";
import { createRLDataloaders, loadCustomDatasetClass, loadSamplerClass } from "../data/index.js";
import { initBackend } from "../engine/backend.js";
import { loadRewardManager, type RewardManager } from "../reward/index.js";
import { RewardModelServer } from "../reward/reward_model_server.js";
import { loadToolsFromConfig } from "../tools/index.js";
import { logger } from "../utils/logger.js";
import { Tracking } from "../utils/tracking.js";
import { ConfigView } from "../workers/config_view.js";
import { expandHome, importExternalLib, loadModelTokenizer } from "../workers/model_source.js";
import { PPOTrainer, type FitResult } from "./ppo/ppo_trainer.js";
import { validatePpoNames } from "./ppo/validate_names.js";
import { initWorkers, type PpoWorkers } from "./ppo/resources.js";
import { checkpointManagerFor } from "./ppo/trainer_checkpoint.js";

/** The step count the run trains for: trainer.total_training_steps, else batches per epoch x total_epochs. */
export function totalTrainingSteps(cfg: ConfigView, batchesPerEpoch: number): number {
  const explicit = cfg.optInt("trainer.total_training_steps");
  if (explicit !== null) {
    if (explicit < 1) throw new Error(`trainer.total_training_steps must be a positive integer, got ${explicit}`);
    return explicit;
  }
  return batchesPerEpoch * cfg.int("trainer.total_epochs", 1);
}

/** A copy of the config with the schedule lengths the workers need filled in (as verl injects them). */
function withTotalSteps(config: Config, total: number): Config {
  const copy = structuredClone(config) as Record<string, Record<string, Record<string, Record<string, unknown>>>>;
  copy.actor_rollout_ref!.actor!.optim!.total_training_steps = total;
  if (copy.critic?.optim) (copy.critic.optim as Record<string, unknown>).total_training_steps = total;
  return copy as unknown as Config;
}

export async function runPpo(config: Config): Promise<FitResult> {
  const plan = validatePpoConfig(config);
  const cfg = new ConfigView(config);
  // The driver's own tensor work (advantages, KL penalty) is small host math.
  await initBackend("cpu");
  await importExternalLib(cfg.optStr("actor_rollout_ref.model.external_lib"), "actor_rollout_ref.model.external_lib");
  validatePpoNames(config);
  const tokenizer = await loadModelTokenizer(cfg.at("actor_rollout_ref.model"));
  // data.tool_config_path: tool schemas rendered into the prompts' chat template.
  const toolPath = cfg.optStr("data.tool_config_path");
  const tools = toolPath ? (await loadToolsFromConfig(toolPath)).map((t) => t.toolSchema) : undefined;
  const datasetClass = await loadCustomDatasetClass(cfg.section("data"));
  const samplerClass = await loadSamplerClass(cfg.section("data"));
  // a Python data.custom_cls is built with the model's Hugging Face tokenizer, as verl's main_ppo builds it
  const modelPath = cfg.optStr("actor_rollout_ref.model.path");
  const hfTokenizer = { path: modelPath === null ? null : expandHome(modelPath), trustRemoteCode: cfg.section("data").trust_remote_code === true };
  const loaders = createRLDataloaders(cfg.section("data"), tokenizer, { ...(tools ? { tools } : {}), datasetClass, samplerClass, hfTokenizer });
  const total = totalTrainingSteps(cfg, loaders.train.length);
  logger().info({ steps: total, batchesPerEpoch: loaders.train.length, prompts: loaders.trainDataset.length }, "training plan");
  // a generative reward model is served for the whole run; it closes in the finally below, also on failure
  const rmServer = await RewardModelServer.startIfConfigured(config);
  let rewardFn: RewardManager | undefined, valRewardFn: RewardManager | undefined, tracking: Tracking | undefined;
  let workers: PpoWorkers | undefined;
  try {
    const served = rmServer ? { servedRewardModel: rmServer.ref } : {};
    rewardFn = await loadRewardManager(config, tokenizer, { numExamine: 0, ...served });
    valRewardFn = await loadRewardManager(config, tokenizer, { numExamine: 1, ...served });
    tracking = new Tracking({
      projectName: cfg.str("trainer.project_name"), experimentName: cfg.str("trainer.experiment_name"),
      backends: cfg.raw("trainer.logger"), config, totalSteps: total,
    });
    workers = await initWorkers(withTotalSteps(config, total), plan);
    const trainer = new PPOTrainer({
      cfg, plan, tokenizer, rewardFn, valRewardFn, trainLoader: loaders.train, valLoader: loaders.val,
      workers, tracking, checkpoints: checkpointManagerFor(cfg), totalTrainingSteps: total,
    });
    const result = await trainer.fit();
    // Hosts of a run spanning hosts exit 0 only when told the run succeeded (docs/distributed.md).
    workers.pool.markRunSucceeded();
    return result;
  } finally {
    // each closes even when one before it throws: a served reward model's port must not stay open
    try {
      tracking?.finish();
      await workers?.shutdown();
      await rewardFn?.close?.();
      await valRewardFn?.close?.();
    } finally {
      loaders.close();
      await rmServer?.close();
    }
  }
}
