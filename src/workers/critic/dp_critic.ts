// The data-parallel critic (verl's dp_critic): values for a batch, and the
// clipped value-loss update with the same mini-batch / micro-batch / global
// normalisation scheme as the actor (see dp_actor.ts).
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../../protocol/index.js";
import type { TensorData } from "../../protocol/tensor.js";
import { computeValueLoss, maskedMean } from "../../trainer/ppo/core_algos/index.js";
import { heartbeat } from "../../single_controller/heartbeat.js";
import { trainingForward, type LoraAdapter } from "../../models/lora.js";
import { Rng } from "../../utils/rng.js";
import { column, miniBatches, microBatches, toTf, tokenAndSequenceCounts, TokenWeightedMeans, type MicroBatchSpec } from "../batching.js";
import type { ConfigView } from "../config_view.js";
import type { DataParallelOptimizer } from "../dp_optimizer.js";
import { inferInMicroBatches, MicroBatchScalars, responseValues, type ValueModel } from "../forward.js";
import { push, type MetricLists } from "../actor/dp_actor.js";

export interface DpCriticOptions {
  /** The critic section. */
  config: ConfigView;
  miniBatchPerRank: number;
  microBatchPerRank: number | null;
  /** Micro-batching of the values pass (critic.forward_*; see inferenceSpec). */
  forwardSpec: MicroBatchSpec;
  seed: number;
  /** Forward on packed real tokens (critic.model.use_remove_padding). */
  removePadding?: boolean;
  /** The value model's LoRA adapter, whose dropout applies in the update's forward only. */
  adapter?: LoraAdapter;
}

export class DataParallelPPOCritic {
  readonly rng: Rng;

  constructor(readonly model: ValueModel, readonly optimizer: DataParallelOptimizer, readonly opts: DpCriticOptions) {
    this.rng = new Rng(opts.seed);
  }

  /** Values [B, R], zero outside the response mask (verl keeps values only on action tokens). */
  async computeValues(data: DataProto): Promise<TensorData> {
    const [values] = await inferInMicroBatches(data, this.opts.forwardSpec, (micro) => [
      tf.mul(responseValues(this.model, micro, this.opts.removePadding), toTf(column(micro, "response_mask"), "float32")),
    ]);
    return values!;
  }

  async updateCritic(data: DataProto): Promise<MetricLists> {
    const cfg = this.opts.config;
    const optimizer = this.optimizer;
    const epochs = cfg.int("ppo_epochs", 1);
    const shuffle = cfg.bool("shuffle", false);
    const mode = cfg.str("loss_agg_mode", "token-mean");
    const cliprange = cfg.num("cliprange_value", 0.5);
    const spec: MicroBatchSpec = {
      microBatchSize: this.opts.microBatchPerRank,
      maxTokenLen: cfg.bool("use_dynamic_bsz", false) ? cfg.int("ppo_max_token_len_per_gpu") : null,
    };
    const batch = data.select(["input_ids", "responses", "response_mask", "attention_mask", "position_ids", "values", "returns"].filter((k) => k in data.batch));
    for (const k of ["input_ids", "responses", "response_mask", "attention_mask", "values", "returns"]) column(batch, k);
    const metrics: MetricLists = {};
    for (let epoch = 0; epoch < epochs; epoch++) {
      for (const mini of miniBatches(batch, this.opts.miniBatchPerRank, shuffle ? this.rng : undefined)) {
        const info = optimizer.globalLossNorm(column(mini, "response_mask"), null);
        let lossSum = 0;
        const means = new TokenWeightedMeans();
        const reads = new MicroBatchScalars();
        for (const micro of microBatches(mini, spec).batches) {
          heartbeat();
          let kept: tf.Scalar[] = [];
          const { value, grads } = tf.variableGrads(() => {
            const responseMask = toTf(column(micro, "response_mask"), "float32");
            const vpreds = trainingForward(this.opts.adapter, this.rng, () => responseValues(this.model, micro, this.opts.removePadding));
            const { vfLoss, vfClipfrac } = computeValueLoss({
              vpreds, values: toTf(column(micro, "values"), "float32"), returns: toTf(column(micro, "returns"), "float32"),
              responseMask, cliprangeValue: cliprange, lossAggMode: mode, globalBatchInfo: info,
            });
            kept = [vfLoss, vfClipfrac, maskedMean(vpreds, responseMask) as tf.Scalar].map((t) => tf.keep(t));
            return vfLoss;
          }, optimizer.vars);
          optimizer.accumulate(grads);
          // `value` is kept[0] (the value loss), which the reads dispose
          tf.dispose(Object.values(grads));
          await reads.add(kept, (vals) => {
            lossSum += vals[0]!;
            means.add({ "critic/vf_clipfrac": vals[1]!, "critic/vpred_mean": vals[2]! }, tokenAndSequenceCounts(column(micro, "response_mask")).tokens);
          });
        }
        // read when the optimizer asks: the on-device step records its norm and update first (as the actor's)
        const res = await optimizer.step(async () => { await reads.flush(); return [lossSum, ...means.pack()]; });
        for (const [k, v] of Object.entries(means.read(res.scalars.subarray(1)))) push(metrics, k, v);
        push(metrics, "critic/vf_loss", res.scalars[0]!);
        push(metrics, "critic/grad_norm", res.gradNorm);
      }
    }
    return metrics;
  }
}
