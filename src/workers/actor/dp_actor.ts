// The data-parallel PPO actor (verl's dp_actor): log-probs for a batch, and the
// policy update — for each of ppo_epochs, mini-batches of the rank's share (one
// optimizer step each), micro-batches inside them (gradient accumulation). Losses
// use aggLoss's global normalisation (the mini-batch's token / sequence count over
// all ranks), so summing micro-batch and rank gradients gives exactly the gradient
// of one pass over the whole mini-batch, whatever the micro-batch size or world size.
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../../protocol/index.js";
import type { TensorData } from "../../protocol/tensor.js";
import {
  aggLoss, getPolicyLoss, keepMetrics, klPenalty, stopGradient,
  type ActorLossConfig, type LossMetrics,
} from "../../trainer/ppo/core_algos/index.js";
import { heartbeat } from "../../single_controller/heartbeat.js";
import { Rng } from "../../utils/rng.js";
import { phaseProfile } from "../../utils/phase_profile.js";
import { freePoolStats } from "../../engine/webgpu_buffer_pool.js";
import { bindGroupStats } from "../../engine/bind_group_cache.js";
import { DynamicLossScale } from "../../engine/loss_scale.js";
import { constScalar } from "../../engine/constants.js";
import { matmulPrecision } from "../../engine/webgpu_kernels.js";
import { column, miniBatches, microBatches, toTf, tokenAndSequenceCounts, TokenWeightedMeans, type MicroBatchSpec } from "../batching.js";
import type { ConfigView } from "../config_view.js";
import type { DataParallelOptimizer } from "../dp_optimizer.js";
import type { LlamaModel } from "../../models/index.js";
import { trainingForward } from "../../models/lora.js";
import { responseLogProbs } from "../../rollout/index.js";
import { mtpTokenMask } from "../../rollout/log_probs.js";
import { inferInMicroBatches, MicroBatchScalars } from "../forward.js";
import { computeRolloutCorrection, rolloutCorrectionConfig, type RolloutCorrectionConfig } from "../../trainer/ppo/rollout_corr.js";

export interface DpActorOptions {
  /** The actor section (actor_rollout_ref.actor). */
  config: ConfigView;
  /** Sequences per rank per mini-batch (ppo_mini_batch_size * n / world). */
  miniBatchPerRank: number;
  /** Sequences per rank per micro-batch; null with use_dynamic_bsz. */
  microBatchPerRank: number | null;
  /** Seed for the per-epoch shuffles and losses that draw random numbers. */
  seed: number;
  /** Forward on packed real tokens (model.use_remove_padding). */
  removePadding?: boolean;
  /**
   * algorithm.rollout_correction when its bypass_mode is on: old_log_probs are the rollout's,
   * and the update uses the bypass_mode policy loss with this section (verl's apply_bypass_mode).
   */
  bypassRolloutCorrection?: Record<string, unknown>;
  /** MoE routing replay (actor.router_replay.mode R2/R3): the update's forward uses the batch's routed_experts. */
  replayRouting?: boolean;
  /** model.mtp.enable_train (MiMo): the MTP loss, times `scale` (mtp_loss_scaling_factor), joins the update's loss. */
  mtpTrain?: MtpTrainOptions;
}

/** verl's MTP training settings (actor_rollout_ref.model.mtp). */
export interface MtpTrainOptions {
  /** mtp_loss_scaling_factor over the MTP layers trained (Megatron's mtp_loss_scaling_factor / mtp_num_layers; one here) */
  scale: number;
  /** detach_encoder: the MTP loss trains the MTP layer only */
  detachEncoder: boolean;
}

/** Routing replay in a log-prob pass: record the experts chosen (R2), or replay the batch's (R3). */
export interface RoutingPass { record?: boolean; replay?: boolean }

/** Per-mini-batch and per-micro-batch metric lists (reduced by the driver). */
export type MetricLists = Record<string, number[]>;

/** The actor config with verl's bypass-mode override: loss_mode bypass_mode, the section passed inside policy_loss. */
function bypassLossConfig(section: ActorLossConfig, bypass: Record<string, unknown> | undefined): ActorLossConfig {
  if (!bypass) return section;
  return { ...section, policy_loss: { ...(section.policy_loss ?? {}), loss_mode: "bypass_mode", rollout_correction: bypass } };
}

/**
 * Bypass mode's rollout_corr/ metrics for one micro-batch: the current policy against the
 * rollout's log-probs (`rollout` null: the on-policy pass, where verl compares the policy with itself).
 */
async function bypassMetrics(current: tf.Tensor, rollout: TensorData | null, mask: TensorData, cfg: RolloutCorrectionConfig): Promise<Record<string, number>> {
  const [B, R] = mask.shape as [number, number];
  const cur = (await current.data()) as Float32Array;
  const roll = rollout ? Float32Array.from(rollout.data as ArrayLike<number>) : cur;
  return computeRolloutCorrection(cur, roll, mask.data as ArrayLike<number>, B, R, cfg).metrics;
}

function sumOf(xs: ArrayLike<number>): number {
  let n = 0;
  for (let i = 0; i < xs.length; i++) n += xs[i]!;
  return n;
}

export function push(into: MetricLists, key: string, v: number): void {
  (into[key] ??= []).push(v);
}

export class DataParallelPPOActor {
  readonly rng: Rng;
  /** the loss scale of 16-bit products, made on the first such update (engine/loss_scale.ts) */
  private lossScale?: DynamicLossScale;

  constructor(
    readonly model: LlamaModel,
    readonly optimizer: DataParallelOptimizer | null,
    readonly opts: DpActorOptions,
  ) {
    this.rng = new Rng(opts.seed);
  }

  /** Old (or reference) log-probs [B, R], and the entropy and Σπ² when asked; no gradients. */
  async computeLogProb(
    data: DataProto, spec: MicroBatchSpec, temperature: number, calculateEntropy: boolean, calculateSumPiSquared = false, routing: RoutingPass = {},
  ): Promise<{ logProbs: TensorData; entropy?: TensorData; sumPiSquared?: TensorData; routedExperts?: TensorData }> {
    if (routing.replay) column(data, "routed_experts");
    const outs = await inferInMicroBatches(data, spec, (micro) => {
      const r = responseLogProbs(this.model, micro, {
        temperature, calculateEntropy, calculateSumPiSquared, removePadding: this.opts.removePadding,
        recordExperts: routing.record, ...(routing.replay ? { replayExperts: column(micro, "routed_experts") } : {}),
      });
      return [r.logProbs, ...(r.entropy ? [r.entropy] : []), ...(r.sumPiSquared ? [r.sumPiSquared] : []), ...(r.routedExperts ? [r.routedExperts] : [])];
    });
    let at = 1;
    return {
      logProbs: outs[0]!,
      ...(calculateEntropy ? { entropy: outs[at++]! } : {}),
      ...(calculateSumPiSquared ? { sumPiSquared: outs[at++]! } : {}),
      ...(routing.record ? { routedExperts: outs[at++]! } : {}),
    };
  }

  async updatePolicy(data: DataProto): Promise<MetricLists> {
    const optimizer = this.optimizer;
    if (!optimizer) throw new Error("updatePolicy: this actor has no optimizer (a reference policy is frozen)");
    const cfg = this.opts.config;
    const temperature = typeof data.metaInfo.temperature === "number" ? data.metaInfo.temperature : NaN;
    if (!(temperature > 0)) throw new Error("updateActor: batch.metaInfo.temperature (the rollout temperature) must be a positive number");
    const epochs = cfg.int("ppo_epochs", 1);
    const shuffle = cfg.bool("shuffle", false);
    const entropyCoeff = cfg.num("entropy_coeff", 0);
    const withEntropy = cfg.bool("calculate_entropy", false) || entropyCoeff !== 0;
    const useKl = cfg.bool("use_kl_loss", false);
    const klCoef = cfg.num("kl_loss_coef", 0.001);
    const klType = cfg.str("kl_loss_type", "low_var_kl");
    const mode = cfg.str("loss_agg_mode", "token-mean");
    const scaleFactor = cfg.optNum("loss_scale_factor");
    const bypass = this.opts.bypassRolloutCorrection;
    const lossCfg = bypassLossConfig(cfg.section() as ActorLossConfig, bypass);
    const lossFn = getPolicyLoss(lossCfg.policy_loss?.loss_mode ?? "vanilla");
    const bypassCfg = bypass ? rolloutCorrectionConfig(bypass) : null;
    const dynamic = cfg.bool("use_dynamic_bsz", false);
    const spec: MicroBatchSpec = {
      microBatchSize: this.opts.microBatchPerRank,
      maxTokenLen: dynamic ? cfg.int("ppo_max_token_len_per_gpu") : null,
    };
    const keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "old_log_probs", "advantages"];
    if (useKl) keys.push("ref_log_prob");
    if (data.batch.rollout_is_weights) keys.push("rollout_is_weights");
    const replay = this.opts.replayRouting === true;
    if (replay) keys.push("routed_experts");
    const batch = data.select(keys.filter((k) => k in data.batch));
    if (replay) column(batch, "routed_experts");
    for (const k of ["responses", "response_mask", "input_ids", "attention_mask", "advantages", ...(useKl ? ["ref_log_prob"] : [])]) column(batch, k);

    const nMini = Math.ceil(batch.length / this.opts.miniBatchPerRank);
    const onPolicy = nMini === 1 && epochs === 1;
    if (!onPolicy) column(batch, "old_log_probs");
    const vars = optimizer.vars;
    const metrics: MetricLists = {};
    const moe = this.model.config.moe;
    const mtp = this.opts.mtpTrain;
    // 16-bit matrix products (fsdp_config.mixed_precision): the loss is scaled so small gradients survive them
    const scaler = matmulPrecision() === "f32" ? null : (this.lossScale ??= new DynamicLossScale());
    const prof = phaseProfile("actor.updatePolicy");
    const manager = (tf.backend() as unknown as { bufferManager?: object }).bufferManager;
    const pool0 = manager ? { ...freePoolStats(manager) } : undefined;
    const groups0 = prof ? bindGroupStats() : undefined;
    for (let epoch = 0; epoch < epochs; epoch++) {
      for (const mini of miniBatches(batch, this.opts.miniBatchPerRank, shuffle ? this.rng : undefined)) {
        // read per mini-batch: a skipped step halves the scale for the next one
        const lossScale = scaler ? scaler.scale : 1;
        const info = optimizer.globalLossNorm(column(mini, "response_mask"), scaleFactor);
        const micros = microBatches(mini, spec).batches;
        // Megatron's MTP loss: each micro-batch's token mean (its own num_tokens), averaged over the
        // micro-batches and the data-parallel ranks (the schedule's 1/num_microbatches, DDP's mean)
        const mtpMicros = mtp ? (() => { const n = Float64Array.of(micros.length); optimizer.allReduceSum(n); return n[0]!; })() : 1;
        let pgSum = 0, klSum = 0, entSum = 0, auxSum = 0, loadSum = 0, mtpSum = 0;
        const means = new TokenWeightedMeans();
        const reads = new MicroBatchScalars();
        for (const micro of micros) {
          const mtpTokens = mtp ? Math.max(1, sumOf(mtpTokenMask(micro).data)) : 1;
          heartbeat();
          let kept: LossMetrics = {};
          let parts: tf.Scalar[] = [];
          let current = null as tf.Tensor | null;
          const { value, grads } = tf.variableGrads(() => {
            // a training pass: the adapter's dropout applies here only (verl computes log-probs in eval mode)
            const { logProbs: logProb, entropy, router, mtp: mtpOut } = trainingForward(this.model.lora, this.rng, () => responseLogProbs(this.model, micro, {
              temperature, calculateEntropy: withEntropy, removePadding: this.opts.removePadding, routerLoss: moe !== undefined,
              ...(replay ? { replayExperts: column(micro, "routed_experts") } : {}),
              ...(mtp ? { mtp: { detachEncoder: mtp.detachEncoder } } : {}),
            }));
            const responseMask = toTf(column(micro, "response_mask"), "float32");
            const old = onPolicy ? stopGradient(logProb) : toTf(column(micro, "old_log_probs"), "float32");
            const out = lossFn({
              oldLogProb: old, logProb, advantages: toTf(column(micro, "advantages"), "float32"), responseMask,
              lossAggMode: mode, config: lossCfg, globalBatchInfo: info, rng: this.rng,
              rolloutIsWeights: micro.batch.rollout_is_weights ? toTf(micro.batch.rollout_is_weights, "float32") : null,
            });
            kept = keepMetrics(out.metrics);
            if (bypassCfg) current = tf.keep(stopGradient(logProb));
            let loss: tf.Scalar = out.pgLoss;
            // absent terms are clones of a kept zero (no upload each micro-batch)
            const terms: tf.Scalar[] = [out.pgLoss, ...Array.from({ length: 5 }, () => tf.clone(constScalar(0)))];
            if (mtp) {
              // cross entropy of each response token from the MTP head, a token mean (whatever loss_agg_mode), scaled
              terms[5] = tf.div(aggLoss(tf.neg(mtpOut!.logProbs), mtpOut!.mask, "token-mean", { batchNumTokens: mtpTokens }), mtpMicros) as tf.Scalar;
              loss = tf.add(loss, tf.mul(terms[5], mtp.scale));
            }
            if (router) {
              // MoE: router_aux_loss_coef x the load-balancing loss (as transformers adds it), this micro-batch's share of the batch
              const share = micro.length / Math.max(1, info.globalBatchSize ?? mini.length);
              terms[3] = tf.mul(router.aux, share) as tf.Scalar;
              terms[4] = tf.mul(router.load, share) as tf.Scalar;
              if (moe!.routerAuxLossCoef !== 0) loss = tf.add(loss, tf.mul(terms[3], moe!.routerAuxLossCoef));
            }
            if (entropy) {
              const ent = aggLoss(entropy, responseMask, mode, info);
              terms[2] = ent;
              if (entropyCoeff !== 0) loss = tf.sub(loss, tf.mul(ent, entropyCoeff));
            }
            if (useKl) {
              const kld = klPenalty(logProb, toTf(column(micro, "ref_log_prob"), "float32"), klType);
              const klLoss = aggLoss(kld, responseMask, mode, info);
              terms[1] = klLoss;
              loss = tf.add(loss, tf.mul(klLoss, klCoef));
            }
            parts = terms.map((t) => tf.keep(t));
            return lossScale === 1 ? loss : tf.mul(loss, lossScale);
          }, vars);
          prof?.mark("record_forward_backward");
          // scaled gradients are summed as they are; the step divides the sum by the scale once
          optimizer.accumulate(grads);
          prof?.mark("record_accumulate");
          // `value` may be one of `parts` (the bare policy loss), which the reads dispose
          tf.dispose([...new Set<tf.Tensor>([value, ...Object.values(grads)])].filter((t) => !parts.includes(t as tf.Scalar)));
          // the loss terms, then the kept metrics that are tensors, in the order of `kept`
          const metricTensors = Object.values(kept).filter((v): v is tf.Scalar => typeof v !== "number");
          const bypassed = current as tf.Tensor | null;
          await reads.add([...parts, ...metricTensors], async (vals) => {
            pgSum += vals[0]!; klSum += vals[1]!; entSum += vals[2]!; auxSum += vals[3]!; loadSum += vals[4]!; mtpSum += vals[5]!;
            let at = parts.length;
            const read: Record<string, number> = {};
            for (const [k, v] of Object.entries(kept)) read[k] = typeof v === "number" ? v : vals[at++]!;
            if (bypassCfg && bypassed) {
              Object.assign(read, await bypassMetrics(bypassed, onPolicy ? null : column(micro, "old_log_probs"), column(micro, "response_mask"), bypassCfg));
              bypassed.dispose();
            }
            means.add(read, tokenAndSequenceCounts(column(micro, "response_mask")).tokens);
          });
          prof?.mark("record_reads");
        }
        prof?.mark("micro_batch_rest");
        // read when the optimizer asks: the on-device step records its norm and update first, so
        // one wait covers the micro-batches' scalars and the norm
        const res = await optimizer.step(async () => {
          await reads.flush();
          return [pgSum, klSum, entSum, auxSum, loadSum, mtpSum, ...means.pack()];
        }, 1 / lossScale);
        prof?.mark("optimizer_step");
        scaler?.update(res.skipped);
        for (const [k, v] of Object.entries(means.read(res.scalars.subarray(6)))) push(metrics, k, v);
        // verl logs Megatron's tracker value: the unscaled MTP cross entropy of layer 1
        if (mtp) push(metrics, "actor/mtp_losses/mtp_1_loss", res.scalars[5]!);
        if (moe) {
          push(metrics, "actor/router_aux_loss", res.scalars[3]!);
          push(metrics, "actor/router_aux_loss_coef", moe.routerAuxLossCoef);
          push(metrics, "actor/router_load_max", res.scalars[4]!);
        }
        push(metrics, "actor/pg_loss", res.scalars[0]!);
        if (useKl) {
          push(metrics, "actor/kl_loss", res.scalars[1]!);
          push(metrics, "actor/kl_coef", klCoef);
        }
        if (withEntropy) push(metrics, "actor/entropy", res.scalars[2]!);
        push(metrics, "actor/grad_norm", res.gradNorm);
      }
    }
    if (prof) {
      const pool = manager ? freePoolStats(manager) : undefined, groups = bindGroupStats();
      prof.print({
        ...(pool && pool0 ? {
          buffersCreated: pool.created - (pool0.created ?? 0), gbCreated: (pool.bytesCreated - (pool0.bytesCreated ?? 0)) / 1e9,
          trims: pool.trims - (pool0.trims ?? 0), gbDestroyed: (pool.bytesDestroyed - (pool0.bytesDestroyed ?? 0)) / 1e9,
        } : {}),
        // bind groups reused / made in this update (engine/bind_group_cache.ts)
        ...(groups && groups0 ? { bindGroupHits: groups.hits - groups0.hits, bindGroupsMade: groups.misses - groups0.misses } : {}),
      });
    }
    return metrics;
  }
}
