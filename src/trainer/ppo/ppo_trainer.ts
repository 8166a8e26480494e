// The PPO fit loop (verl's RayPPOTrainer.fit), step by step in verl's order:
// uid per prompt, repeat by n, generate, reward, old log-prob, ref log-prob,
// values, in-reward KL, advantage, critic update, actor update (after
// critic_warmup), rollout dump, validation, checkpoint, metrics. Steps are 1-based.
import { performance } from "node:perf_hooks";
import * as tf from "@tensorflow/tfjs";
import type { PpoBatchPlan } from "../../config/index.js";
import type { DataLoaderState } from "../../data/index.js";
import type { Tokenizer } from "../../models/index.js";
import { DataProto } from "../../protocol/index.js";
import { tensor, type TensorData } from "../../protocol/tensor.js";
import type { RewardManager } from "../../reward/index.js";
import { logger } from "../../utils/logger.js";
import { Rng } from "../../utils/rng.js";
import type { Tracking } from "../../utils/tracking.js";
import type { ConfigView } from "../../workers/config_view.js";
import type { CheckpointManager } from "../checkpoint/checkpoint_manager.js";
import {
  aggLoss, applyKlPenalty, computeAdvantage, getKlController, type AlgoConfig, type KlController, type KlCtrlConfig,
} from "./core_algos/index.js";
import { nonFiniteRewardMetrics, perOptimizerStep, SkippedStepGuard } from "./fault_guards.js";
import { RolloutSkip } from "./rollout_skip.js";
import { applyBypassMode, applyRolloutCorrection, isBypassMode } from "./rollout_corr.js";
import { computeDataMetrics, computeThroughputMetrics, computeTimingMetrics, computeVarianceProxyMetrics, reduceMetrics } from "./metric_utils.js";
import { callProto, type PpoWorkers } from "./resources.js";
import { balanceBatchOrder } from "./seqlen_balancing.js";
import { agentRowKeys, assignUids, decodeRows, flattenMetricLists, popGenBatch, requireTensor, rowSums } from "./step_batch.js";
import { timed, type TimingRaw } from "./timer.js";
import { loadTrainerCheckpoint, saveTrainerCheckpoint } from "./trainer_checkpoint.js";
import { dumpGenerations, validate } from "./validation.js";

export interface TrainLoader extends Iterable<DataProto> {
  readonly length: number;
  readonly currentEpoch: number;
  stateDict(): DataLoaderState;
  loadStateDict(s: DataLoaderState): void;
  /** data.sampler's update(batch) after each step (a curriculum sampler), when there is one. */
  updateSampler?(batch: DataProto): Promise<void>;
}

export interface PpoTrainerDeps {
  cfg: ConfigView;
  plan: PpoBatchPlan;
  tokenizer: Tokenizer;
  rewardFn: RewardManager;
  valRewardFn: RewardManager;
  trainLoader: TrainLoader;
  valLoader: Iterable<DataProto>;
  workers: PpoWorkers;
  tracking: Tracking;
  checkpoints: CheckpointManager;
  totalTrainingSteps: number;
}

export interface FitResult {
  /** The last step trained (0 when only validating). */
  globalStep: number;
  /** The metrics logged at each step, in order. */
  history: { step: number; metrics: Record<string, number> }[];
}

export class PPOTrainer {
  globalSteps = 0;
  readonly rng: Rng;
  readonly klCtrl: KlController | null;
  private readonly history: FitResult["history"] = [];
  private readonly skipGuard: SkippedStepGuard;
  private readonly rolloutSkip: RolloutSkip | null;
  /** Grad norms per optimizer step of the last training step, per role (for skipGuard). */
  private stepGradNorms: Record<string, number[]> = {};
  /** The last step's batch with its rewards and advantages (for data.sampler's update). */

  constructor(readonly d: PpoTrainerDeps) {
    this.rng = new Rng(d.cfg.int("trainer.seed", 42) ^ 0x7a11);
    const useKlInReward = d.cfg.bool("algorithm.use_kl_in_reward", false);
    this.klCtrl = useKlInReward ? getKlController(d.cfg.section("algorithm.kl_ctrl") as KlCtrlConfig) : null;
    this.skipGuard = new SkippedStepGuard(d.cfg.optInt("trainer.max_consecutive_skipped_steps"));
    this.rolloutSkip = RolloutSkip.fromConfig(d.cfg);
  }

  private get seedPerSample(): boolean {
    return this.d.cfg.bool("actor_rollout_ref.rollout.seed_per_sample", false);
  }

  private log(metrics: Record<string, number>, step: number): void {
    this.d.tracking.log(metrics, step);
    this.history.push({ step, metrics });
  }

  async validate(): Promise<Record<string, number>> {
    return validate({
      cfg: this.d.cfg, tokenizer: this.d.tokenizer, valLoader: this.d.valLoader, rewardFn: this.d.valRewardFn,
      actorRollout: this.d.workers.actorRollout, seed: this.d.cfg.int("trainer.seed", 42), seedPerSample: this.seedPerSample,
    }, this.globalSteps);
  }

  async fit(): Promise<FitResult> {
    const { cfg, trainLoader } = this.d;
    const resumable = { workers: this.d.workers, trainLoader, rng: this.rng, klCtrl: this.klCtrl };
    const resumed = await loadTrainerCheckpoint(this.d.checkpoints, cfg, resumable);
    this.globalSteps = resumed.step;
    // one row a step: rows past it at the resumed step are earlier restarts' validations before training
    this.d.tracking.begin(resumed.step, resumed.metrics ?? undefined, { rowsAtResumedStep: 1 });
    const total = this.d.totalTrainingSteps;
    if (cfg.bool("trainer.val_before_train", true)) {
      const val = await this.validate();
      logger().info(val, "validation before training");
      this.log(val, this.globalSteps);
      if (cfg.bool("trainer.val_only", false)) return { globalStep: this.globalSteps, history: this.history };
    }
    if (this.globalSteps >= total) {
      logger().info({ step: this.globalSteps, total }, "the checkpoint is already at the last step; nothing to train");
      return { globalStep: this.globalSteps, history: this.history };
    }
    this.globalSteps += 1;
    const totalEpochs = cfg.int("trainer.total_epochs", 1);
    while (trainLoader.currentEpoch < totalEpochs) {
      for (const batch of trainLoader) {
        const epoch = trainLoader.currentEpoch;
        if (epoch >= totalEpochs) break;
        const isLastStep = this.globalSteps >= total;
        const { metrics, trained } = await this.step(batch, epoch, isLastStep, resumable);
        // as verl: the curriculum sampler sees the trained batch before the step is logged
        await trainLoader.updateSampler?.(trained);
        this.log(metrics, this.globalSteps);
        for (const [role, norms] of Object.entries(this.stepGradNorms)) this.skipGuard.observe(role, norms, this.globalSteps);
        if (isLastStep) return { globalStep: this.globalSteps, history: this.history };
        this.globalSteps += 1;
      }
    }
    return { globalStep: this.globalSteps - 1, history: this.history };
  }

  /** One training step on one batch of prompts; returns the step's metrics. */
  private async step(prompts: DataProto, epoch: number, isLastStep: boolean, resumable: Parameters<typeof saveTrainerCheckpoint>[2]): Promise<{ metrics: Record<string, number>; trained: DataProto }> {
    const { cfg, plan, workers } = this.d;
    const step = this.globalSteps;
    const timing: TimingRaw = {};
    const metrics: Record<string, number> = {};
    const workerMetrics: Record<string, number[]> = {};
    this.stepGradNorms = {};
    const n = plan.rolloutN;
    let batch: DataProto = prompts;
    const t0 = performance.now();
    const collect = (t: TimingRaw) => this.stepMetrics(metrics, workerMetrics, batch, t, step, epoch);
    await timed(timing, "step", async () => {
      batch.metaInfo.temperature = cfg.num("actor_rollout_ref.rollout.temperature", 1.0);
      assignUids(batch, this.rng);
      let gen = popGenBatch(batch, n, this.seedPerSample ? this.rng : null, agentRowKeys(cfg, batch));
      gen.metaInfo = { ...batch.metaInfo, global_steps: step };
      const generate = () => callProto(workers.actorRollout, "generateSequences", gen);
      let genOut: DataProto;
      if (this.rolloutSkip) {
        // a loaded rollout replaces the step's prompts too, so rewards see their own ground truth
        const r = await timed(timing, "gen", () => this.rolloutSkip!.rollout({ prompts: batch, gen, out: new DataProto() }, generate));
        ({ prompts: batch, gen, out: genOut } = r);
        if (r.loaded) logger().info({ step, file: this.rolloutSkip.file }, "rollout.skip_rollout: the step's rollout was loaded, not generated");
      } else genOut = await timed(timing, "gen", generate);
      const baselines = cfg.str("algorithm.adv_estimator") === "remax"
        ? await timed(timing, "gen_max", () => this.greedyBaselines(batch, gen, n)) : undefined;
      batch = batch.repeat(n, true).union(new DataProto(genOut.batch, genOut.nonTensorBatch, {}));
      if (baselines) batch.batch.reward_baselines = tensor(Float32Array.from(baselines.flatMap((b) => new Array<number>(n).fill(b))), [batch.length], "float32");
      batch.metaInfo.temperature = cfg.num("actor_rollout_ref.rollout.temperature", 1.0);
      if (cfg.bool("trainer.balance_batch", true) && workers.worldSize > 1) Object.assign(metrics, this.balanceBatch(batch));
      batch.metaInfo.global_token_num = rowSums(requireTensor(batch, "attention_mask"));

      const reward = await timed(timing, "reward", async () => {
        if (workers.rewardModel && !batch.batch.rm_scores) batch = batch.union(await callProto(workers.rewardModel, "computeRmScore", batch));
        return this.d.rewardFn.compute(batch);
      });
      Object.assign(metrics, reward.metrics ?? {});
      Object.assign(metrics, nonFiniteRewardMetrics(reward.rewardTensor, batch.nonTensorBatch[cfg.str("data.reward_fn_key", "data_source")], step));
      Object.assign(workerMetrics, flattenMetricLists(genOut.metaInfo.metrics));

      // bypass mode: old_log_probs are the rollout's (2 policies); else recomputed by the actor (3)
      const rollCorr = cfg.section("algorithm.rollout_correction");
      const bypass = isBypassMode(rollCorr);
      if (bypass) applyBypassMode(batch);
      else {
        await timed(timing, "old_log_prob", async () => {
          const out = await callProto(workers.actorRollout, "computeLogProb", batch);
          const ent = out.batch.entropys;
          if (ent) metrics["actor/entropy"] = this.aggregate(ent, requireTensor(batch, "response_mask"));
          Object.assign(workerMetrics, flattenMetricLists(out.metaInfo.metrics));
          // routing replay R2: the routing this pass recorded replaces any the rollout recorded (as verl keeps the old-log-prob pass's)
          if (out.batch.routed_experts) delete batch.batch.routed_experts;
          batch = batch.union(out.select(["old_log_probs", ...(out.batch.sum_pi_squared ? ["sum_pi_squared"] : []), ...(out.batch.routed_experts ? ["routed_experts"] : [])], [], []));
        });
      }
      if (plan.needReference) {
        await timed(timing, "ref", async () => { batch = batch.union(await callProto(workers.actorRollout, "computeRefLogProb", batch)); });
      }
      if (workers.critic) {
        await timed(timing, "values", async () => { batch = batch.union(await callProto(workers.critic!, "computeValues", batch)); });
      }

      await timed(timing, "adv", async () => {
        batch.batch.token_level_scores = reward.rewardTensor;
        for (const [k, v] of Object.entries(reward.rewardExtraInfo)) if (v.length === batch.length) batch.nonTensorBatch[k] = v;
        if (this.klCtrl) Object.assign(metrics, await applyKlPenalty(batch, this.klCtrl, cfg.str("algorithm.kl_penalty", "kl")));
        else batch.batch.token_level_rewards = reward.rewardTensor;
        // the rollout engine's numerics vs the trainer's: IS weights, rejection, rollout_corr/ metrics
        // (in bypass mode the actor's loss does this against the current policy instead)
        if (!bypass) Object.assign(metrics, applyRolloutCorrection(batch, rollCorr));
        batch = await computeAdvantage(batch, {
          advEstimator: cfg.str("algorithm.adv_estimator"), numRepeat: n, config: cfg.section("algorithm") as AlgoConfig, rng: this.rng,
        });
      });

      if (workers.critic) {
        const out = await timed(timing, "update_critic", () => callProto(workers.critic!, "updateCritic", batch));
        Object.assign(workerMetrics, flattenMetricLists(out.metaInfo.metrics));
        this.stepGradNorms.critic = perOptimizerStep(out.metaInfo.metrics, "critic/grad_norm");
      }
      if (cfg.int("trainer.critic_warmup", 0) <= step) {
        const out = await timed(timing, "update_actor", () => callProto(workers.actorRollout, "updateActor", batch));
        Object.assign(workerMetrics, flattenMetricLists(out.metaInfo.metrics));
        this.stepGradNorms.actor = perOptimizerStep(out.metaInfo.metrics, "actor/grad_norm");
      }

      const rolloutDir = cfg.optStr("trainer.rollout_data_dir");
      if (rolloutDir) {
        await timed(timing, "dump_rollout_generations", () => this.dumpRollout(rolloutDir, batch, step, Object.keys(reward.rewardExtraInfo)));
      }

      const testFreq = cfg.int("trainer.test_freq", -1);
      if (testFreq > 0 && (isLastStep || step % testFreq === 0)) {
        Object.assign(metrics, await timed(timing, "testing", () => this.validate()));
      }
      const saveFreq = cfg.int("trainer.save_freq", -1);
      if (saveFreq > 0 && (isLastStep || step % saveFreq === 0)) {
        // The step's metrics so far go into the checkpoint: a kill after its commit but before the
        // metrics line is written loses nothing (the resumed run replays them).
        const soFar = collect({ ...timing, step: (performance.now() - t0) / 1000 });
        await timed(timing, "save_checkpoint", () => saveTrainerCheckpoint(this.d.checkpoints, step, resumable, soFar));
      }
    });
    return { metrics: collect(timing), trained: batch };
  }

  /** The step's logged metrics: the driver's, the workers' (reduced), data, timing and throughput. */
  private stepMetrics(
    driver: Record<string, number>, workerMetrics: Record<string, number[]>, batch: DataProto, timing: TimingRaw, step: number, epoch: number,
  ): Record<string, number> {
    const metrics = { ...driver, ...reduceMetrics(workerMetrics) };
    metrics["training/global_step"] = step;
    metrics["training/epoch"] = epoch;
    Object.assign(metrics, computeDataMetrics(batch, Boolean(this.d.workers.critic)));
    Object.assign(metrics, computeTimingMetrics(batch, timing));
    Object.assign(metrics, computeThroughputMetrics(batch, timing, this.d.workers.worldSize));
    Object.assign(metrics, computeVarianceProxyMetrics(batch, metrics["actor/grad_norm"]));
    return metrics;
  }

  /**
   * ReMax's baseline (verl's gen_max): one greedy response per prompt, scored by the reward
   * manager; its sequence reward is the baseline of the prompt's sampled responses.
   */
  private async greedyBaselines(prompts: DataProto, gen: DataProto, n: number): Promise<number[]> {
    const first = gen.selectIdxs(Array.from({ length: prompts.length }, (_, i) => i * n));
    const greedy = new DataProto(first.batch, {}, { ...gen.metaInfo, do_sample: false });
    const out = await callProto(this.d.workers.actorRollout, "generateSequences", greedy);
    const scored = new DataProto(prompts.batch, prompts.nonTensorBatch, {}).union(new DataProto(out.batch, {}, {}));
    return rowSums((await this.d.rewardFn.compute(scored)).rewardTensor);
  }

  /** Reorder rows so each rank gets an equal share of the work (Karmarkar-Karp); global_seqlen/* metrics. */
  private balanceBatch(batch: DataProto): Record<string, number> {
    const { order, metrics } = balanceBatchOrder(rowSums(requireTensor(batch, "attention_mask")), this.d.workers.worldSize);
    batch.reorder(order);
    return metrics;
  }

  /** agg_loss of a [B, R] host matrix under the actor's loss_agg_mode (actor/entropy). */
  private aggregate(values: TensorData, mask: TensorData): number {
    const mode = this.d.cfg.str("actor_rollout_ref.actor.loss_agg_mode", "token-mean");
    return tf.tidy(() => aggLoss(tf.tensor(values.data, values.shape), tf.tensor(mask.data, mask.shape, "float32"), mode).dataSync()[0]!);
  }

  /** `{rollout_data_dir}/{step}.jsonl`: input, output, gts, score, step and the reward's extra fields. */
  private dumpRollout(dir: string, batch: DataProto, step: number, extraKeys: string[]): void {
    const scores = rowSums(requireTensor(batch, "token_level_scores"));
    const rows = decodeRows(batch, this.d.tokenizer, scores).map((r, i) => ({
      ...r, step, ...Object.fromEntries(extraKeys.filter((k) => batch.nonTensorBatch[k]).map((k) => [k, batch.nonTensorBatch[k]![i]])),
    }));
    dumpGenerations(dir, step, rows);
  }
}

