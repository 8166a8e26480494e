// One data-parallel rank of `verl sft`: a replica of the model (with a LoRA adapter under
// model.lora_rank), its share of each global batch cut into micro-batches (gradient accumulation), the token-mean loss
// normalised by the token count of the whole global batch (summed over ranks), and
// the flat-gradient all-reduce + clip + AdamW step the PPO actor uses.
import * as tf from "@tensorflow/tfjs";
import type { Config } from "../../config/index.js";
import type { LlamaModel, Tokenizer } from "../../models/index.js";
import type { DataProto } from "../../protocol/index.js";
import { Dispatch, heartbeat, register, Worker } from "../../single_controller/index.js";
import { countLossTokens, sftLossSum } from "../../trainer/sft/sft_loss.js";
import { loadSftModel, loadSftTokenizer } from "../../trainer/sft/sft_model.js";
import { isEngineSftLayout, sftMicroBatchSpec, sftModelView } from "../../trainer/sft/sft_layout.js";
import { trainingForward } from "../../models/lora.js";
import { Rng } from "../../utils/rng.js";
import { applyModelMemoryOptions, readModelMemoryOptions } from "../model_options.js";
import { microBatches, type MicroBatchSpec } from "../batching.js";
import { loadRoleCheckpoint, saveRoleCheckpoint } from "../checkpoint.js";
import { ConfigView } from "../config_view.js";
import { DataParallelOptimizer } from "../dp_optimizer.js";
import { optimizerShards } from "../optimizer_sharding.js";
import { importExternalLib } from "../model_source.js";
import { globalTokenNum, initWorkerBackend } from "../worker_setup.js";
import { FlopsCounter } from "../../utils/flops_counter.js";
import { logger } from "../../utils/logger.js";
import { trainingDeviceName } from "../../utils/perf_metrics.js";

export const SFT_LR_SCHEDULERS = ["cosine", "constant"] as const;

export interface SftStepResult {
  /** Global token-mean loss of the step (the same on every rank). */
  loss: number;
  gradNorm: number;
  /** The learning rate the step used. */
  lr: number;
  /** Loss tokens in the global batch. */
  tokens: number;
  /** True when the gradient norm was not finite and the update was skipped. */
  skipped: boolean;
  /** verl's mfu of this rank's step, when the driver sent the batch's global_token_num. */
  mfu?: number;
}

export interface SftEvalResult {
  lossSum: number;
  tokens: number;
}

interface SftState {
  model: LlamaModel;
  tokenizer: Tokenizer;
  optimizer: DataParallelOptimizer;
  spec: MicroBatchSpec;
  flops: FlopsCounter;
  /** Seeds the adapter dropout of each training pass (a loaded peft folder's lora_dropout). */
  dropoutRng: Rng;
}

/**
 * The optim section in the form DataParallelOptimizer reads: sft_trainer_engine's is the shared
 * optim group as it is; legacy sft_trainer's names its schedule lr_scheduler (-> lr_scheduler_type).
 */
function optimView(config: Config): ConfigView {
  if (isEngineSftLayout(config)) return new ConfigView(config, "optim");
  const cfg = new ConfigView(config);
  const scheduler = cfg.str("optim.lr_scheduler", "cosine");
  if (!(SFT_LR_SCHEDULERS as readonly string[]).includes(scheduler)) {
    throw new Error(`optim.lr_scheduler='${scheduler}' is not available in verl-ts; choose ${SFT_LR_SCHEDULERS.join(" or ")}`);
  }
  const warm = cfg.num("optim.lr_warmup_steps_ratio", 0);
  if (!(warm >= 0 && warm <= 1)) throw new Error(`optim.lr_warmup_steps_ratio must lie in [0, 1], got ${warm}`);
  const optim = { ...cfg.section("optim"), lr_scheduler_type: scheduler, lr_warmup_steps: -1 };
  return new ConfigView({ optim }, "optim");
}

/**
 * The engine trainer's optimizer shards come from its engine section (fsdp_size, or Megatron's
 * use_distributed_optimizer); verl's legacy FSDP SFT trainer always shards over every rank (FULL_SHARD).
 */
function sftOptimizerShards(config: Config, worldSize: number): number {
  if (!isEngineSftLayout(config)) return worldSize;
  const engine = new ConfigView(config, "engine");
  return optimizerShards(engine, engine.str("strategy", "fsdp"), worldSize);
}

export class SFTWorker extends Worker {
  private s: SftState | undefined;

  constructor(private readonly config: Config) {
    super();
  }

  /** The replica (undefined before initModel); for in-process callers, not dispatched. */
  get model(): LlamaModel | undefined {
    return this.s?.model;
  }

  private get state(): SftState {
    if (!this.s) throw new Error(`SFT worker rank ${this.rank}: call initModel first`);
    return this.s;
  }

  /** Load the model and build the optimizer whose schedule spans `totalSteps`. */
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async initModel(totalSteps: number): Promise<{ backend: string; numParams: number }> {
    const cfg = new ConfigView(this.config);
    const backend = await initWorkerBackend(cfg.str("trainer.device", "auto"));
    await importExternalLib(cfg.optStr("model.external_lib"), "model.external_lib");
    const spec = sftMicroBatchSpec(this.config);
    const tokenizer = await loadSftTokenizer(this.config);
    const seed = cfg.int("trainer.seed", 1);
    const model = await loadSftModel(this.config, tokenizer, seed);
    const modelView = sftModelView(this.config);
    if (model.config.vocabSize < tokenizer.vocabSize) {
      throw new Error(`${modelView.key("path")}: the model's vocabulary (${model.config.vocabSize}) is smaller than the tokenizer's (${tokenizer.vocabSize})`);
    }
    // LoRA (model.lora_rank / lora_alpha / target_modules / lora_adapter_path) and gradient
    // checkpointing with the PPO actor's keys and peft layout: only the adapter trains
    applyModelMemoryOptions(model, readModelMemoryOptions(modelView, { removePadding: false }), modelView, seed);
    const vars = model.trainableVariables();
    const optimizer = new DataParallelOptimizer(vars, optimView(this.config), totalSteps, this.collective, cfg.optNum("optim.clip_grad"), { shards: sftOptimizerShards(this.config, this.worldSize) });
    // train/mfu is the engine trainer's metric: only its layout warns about a model_type without an estimate
    const warn = this.rank === 0 && isEngineSftLayout(this.config) ? (line: string) => logger().warn(line) : undefined;
    const flops = new FlopsCounter(model.config, trainingDeviceName(backend), warn);
    this.s = { model, tokenizer, optimizer, spec, flops, dropoutRng: new Rng(seed + 7907 * (this.rank + 1)) };
    return { backend, numParams: vars.reduce((a, v) => a + v.size, 0) };
  }

  /** One optimizer step on this rank's rows of the global batch (every rank must be called, even with no rows). */
  @register({ dispatchMode: Dispatch.DP_COMPUTE_METRIC })
  async trainStep(data: DataProto): Promise<SftStepResult> {
    const { model, optimizer, spec, flops, dropoutRng } = this.state;
    const t0 = performance.now();
    const counts = Float64Array.of(countLossTokens(data));
    optimizer.allReduceSum(counts);
    const norm = counts[0]! + 1e-8;
    let lossSum = 0;
    for (const micro of microBatches(data, spec).batches) {
      heartbeat();
      const { value, grads } = tf.variableGrads(() => tf.div(trainingForward(model.lora, dropoutRng, () => sftLossSum(model, micro)), norm) as tf.Scalar, optimizer.vars);
      optimizer.accumulate(grads);
      lossSum += (await value.data())[0]!;
      tf.dispose([value, ...Object.values(grads)]);
    }
    const res = await optimizer.step([lossSum]);
    // verl times the engine's train_batch (forward, backward, optimizer step), not the scheduler step
    const seconds = (performance.now() - t0) / 1000;
    optimizer.scheduler.step();
    const seqlens = globalTokenNum(data);
    const mfu = seqlens ? flops.mfu(seqlens, seconds, { worldSize: this.worldSize }) : undefined;
    // verl logs the scheduler's rate after its step (get_last_lr): the next step's
    return { loss: res.scalars[0]!, gradNorm: res.gradNorm, lr: optimizer.lr, tokens: counts[0]!, skipped: res.skipped, ...(mfu === undefined ? {} : { mfu }) };
  }

  /** Summed loss and token count of this rank's rows (no gradients, no collectives). */
  @register({ dispatchMode: Dispatch.DP_COMPUTE_METRIC })
  async evalLoss(data: DataProto): Promise<SftEvalResult> {
    const { model, spec } = this.state;
    let lossSum = 0;
    for (const micro of microBatches(data, spec).batches) {
      heartbeat();
      const t = tf.tidy(() => sftLossSum(model, micro));
      lossSum += (await t.data())[0]!;
      t.dispose();
    }
    return { lossSum, tokens: countLossTokens(data) };
  }

  /** Weights, optimizer, scheduler (and the Hugging Face export on rank 0) into `dir`. */
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async saveCheckpoint(dir: string): Promise<void> {
    const { model, tokenizer, optimizer } = this.state;
    await saveRoleCheckpoint(dir, {
      rank: this.rank, worldSize: this.worldSize, params: model.trainableParams(), optimizer, rngs: this.checkpointRngs(), hf: { model, tokenizer },
    });
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async loadCheckpoint(dir: string): Promise<void> {
    const { model, optimizer } = this.state;
    await loadRoleCheckpoint(dir, { rank: this.rank, worldSize: this.worldSize, params: model.trainableParams(), optimizer, rngs: this.checkpointRngs() });
  }

  /** The streams a resumed run must continue: the dropout seeds, only where the adapter has dropout (older checkpoints have none). */
  private checkpointRngs(): Record<string, Rng> {
    return this.state.model.lora?.dropout ? { lora_dropout: this.state.dropoutRng } : {};
  }

  /** Live tensors in this rank's engine (tests check they stay flat across steps). */
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  numTensors(): number {
    return tf.memory().numTensors;
  }
}
