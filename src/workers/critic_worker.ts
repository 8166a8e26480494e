// verl's CriticWorker for one rank: the value model (a ValueHeadModel built from
// critic.model.path's trunk with a fresh score head), trained with the clipped
// value loss.
import type { Config } from "../config/index.js";
import type { ValueHeadModel } from "../models/index.js";
import { DataProto } from "../protocol/index.js";
import { Dispatch, register, Worker } from "../single_controller/index.js";
import { loadRoleCheckpoint, saveRoleCheckpoint } from "./checkpoint.js";
import { DataParallelPPOCritic } from "./critic/dp_critic.js";
import { DataParallelOptimizer } from "./dp_optimizer.js";
import { roleOptimizerShards } from "./optimizer_sharding.js";
import { hfOverrides, loadModelTokenizer, loadValueModel } from "./model_source.js";
import { applyModelMemoryOptions, readModelMemoryOptions } from "./model_options.js";
import { globalTokenNum, inferenceSpec, setupWorker } from "./worker_setup.js";
import { FlopsCounter } from "../utils/flops_counter.js";
import { logger } from "../utils/logger.js";
import { trainingDeviceName } from "../utils/perf_metrics.js";

interface CriticState {
  model: ValueHeadModel;
  critic: DataParallelPPOCritic;
  optimizer: DataParallelOptimizer;
  /** perf/mfu/critic: the trunk's architecture (verl counts the critic as its model_type, head and all). */
  flops: FlopsCounter;
  ppoEpochs: number;
}

export class CriticWorker extends Worker {
  private s: CriticState | undefined;

  constructor(private readonly config: Config) {
    super();
  }

  private get state(): CriticState {
    if (!this.s) throw new Error(`critic worker rank ${this.rank}: call initModel first`);
    return this.s;
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async initModel(): Promise<{ backend: string; numParams: number }> {
    const { cfg, plan, seed, backend } = await setupWorker(this.config, ["actor_rollout_ref.model.external_lib", "critic.model.external_lib"]);
    const critic = cfg.at("critic");
    if (plan.criticMiniBatchPerRank === null) throw new Error("CriticWorker: the config needs no critic (critic.enable / algorithm.adv_estimator)");
    const model = critic.at("model");
    // The critic reads the actor's tokens, so it shares the actor's tokenizer (a scratch critic its vocabulary size).
    const tokenizer = await loadModelTokenizer(cfg.at("actor_rollout_ref.model"));
    const valueModel = await loadValueModel(model, tokenizer, seed, hfOverrides(cfg.at("actor_rollout_ref.model")));
    const memory = readModelMemoryOptions(model, { removePadding: false });
    applyModelMemoryOptions(valueModel.trunk, memory, model, seed + 1);
    const optimizer = new DataParallelOptimizer(
      valueModel.trainableVariables(), critic.at("optim"), Math.max(critic.int("optim.total_training_steps", -1), 0),
      this.collective, critic.optNum("grad_clip"), { shards: roleOptimizerShards(critic, "model.fsdp_config", this.worldSize) },
    );
    this.s = {
      model: valueModel, optimizer, ppoEpochs: critic.int("ppo_epochs", 1),
      flops: new FlopsCounter(valueModel.trunk.config, trainingDeviceName(backend), this.rank === 0 ? (line) => logger().warn(line) : undefined),
      critic: new DataParallelPPOCritic(valueModel, optimizer, {
        config: critic, miniBatchPerRank: plan.criticMiniBatchPerRank, microBatchPerRank: plan.criticMicroBatchPerRank, seed: seed + 101 * (this.rank + 1),
        // forward_micro_batch_size(_per_gpu) and forward_max_token_len_per_gpu follow the update's keys unless set
        forwardSpec: inferenceSpec(critic, "forward_", "use_dynamic_bsz", "forward_max_token_len_per_gpu", this.worldSize),
        removePadding: memory.removePadding, adapter: valueModel.trunk.lora,
      }),
    };
    return { backend, numParams: valueModel.trainableVariables().reduce((a, v) => a + v.size, 0) };
  }

  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async computeValues(data: DataProto): Promise<DataProto> {
    return new DataProto({ values: await this.state.critic.computeValues(data) }, {}, {});
  }

  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async updateCritic(data: DataProto): Promise<DataProto> {
    const { critic, optimizer } = this.state;
    const lr = optimizer.lr;
    const t0 = performance.now();
    const metrics = await critic.updateCritic(data);
    const seconds = (performance.now() - t0) / 1000;
    // verl: the whole batch's tokens over this rank's update time, x critic.ppo_epochs, / world size
    const seqlens = globalTokenNum(data);
    if (seqlens) metrics["perf/mfu/critic"] = [this.state.flops.mfu(seqlens, seconds, { passes: this.state.ppoEpochs, worldSize: this.worldSize })];
    metrics["critic/lr"] = [lr];
    optimizer.scheduler.step();
    return new DataProto({}, {}, { metrics });
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async saveCheckpoint(dir: string): Promise<void> {
    const { model, optimizer, critic } = this.state;
    await saveRoleCheckpoint(dir, { rank: this.rank, worldSize: this.worldSize, params: model.trainableParams(), optimizer, rngs: { critic: critic.rng } });
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async loadCheckpoint(dir: string): Promise<void> {
    const { model, optimizer, critic } = this.state;
    await loadRoleCheckpoint(dir, { rank: this.rank, worldSize: this.worldSize, params: model.trainableParams(), optimizer, rngs: { critic: critic.rng } });
  }
}
