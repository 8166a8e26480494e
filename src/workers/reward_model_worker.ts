// verl's model-based RewardModelWorker (reward_model.enable=true): a value-head
// model reads each full sequence and its output at the last attended token is the
// sequence's score, placed at the last valid response token of rm_scores [B, R]
// (an empty response puts it in the last slot, as verl does).
import * as tf from "@tensorflow/tfjs";
import type { Config } from "../config/index.js";
import type { ValueHeadModel } from "../models/index.js";
import { DataProto } from "../protocol/index.js";
import { tensor } from "../protocol/tensor.js";
import { Dispatch, register, Worker } from "../single_controller/index.js";
import { column, toTf, type MicroBatchSpec } from "./batching.js";
import { inferInMicroBatches } from "./forward.js";
import { hfOverrides, loadModelTokenizer, loadValueModel } from "./model_source.js";
import { inferenceSpec, setupWorker } from "./worker_setup.js";

export class RewardModelWorker extends Worker {
  private model: ValueHeadModel | undefined;
  private spec: MicroBatchSpec | undefined;

  constructor(private readonly config: Config) {
    super();
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async initModel(): Promise<{ backend: string; numParams: number }> {
    const { cfg, seed, backend } = await setupWorker(this.config, ["actor_rollout_ref.model.external_lib", "reward_model.model.external_lib"]);
    const rm = cfg.at("reward_model");
    const modelCfg = rm.at("model");
    // Scores are read from the actor's token ids, so the reward model shares the actor's tokenizer.
    const tokenizer = await loadModelTokenizer(cfg.at("actor_rollout_ref.model"));
    this.model = await loadValueModel(modelCfg, tokenizer, seed + 17, hfOverrides(cfg.at("actor_rollout_ref.model")));
    this.spec = inferenceSpec(rm, "", "use_dynamic_bsz", "forward_max_token_len_per_gpu", this.worldSize);
    return { backend, numParams: this.model.trainableVariables().reduce((a, v) => a + v.size, 0) };
  }

  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async computeRmScore(data: DataProto): Promise<DataProto> {
    const model = this.model, spec = this.spec;
    if (!model || !spec) throw new Error(`reward model worker rank ${this.rank}: call initModel first`);
    const [lastValues] = await inferInMicroBatches(data, spec, (micro) => {
      const amHost = column(micro, "attention_mask");
      const am = toTf(amHost, "int32") as tf.Tensor2D;
      const ids = toTf(column(micro, "input_ids"), "int32") as tf.Tensor2D;
      // mask and positions go to the forward as host arrays (it uses them on the host)
      const pos = micro.batch.position_ids?.data;
      const v = model.forward(ids, { attentionMask: amHost.data, ...(pos ? { positionIds: pos } : {}) });
      // The last attended column of each row: argmax of column index where the mask is 1.
      const T = am.shape[1];
      const idx = tf.argMax(tf.mul(am.toFloat(), tf.range(1, T + 1).reshape([1, T])), 1);
      return [tf.sum(tf.mul(v, tf.oneHot(idx, T)), 1, true)];
    });
    const mask = column(data, "response_mask");
    const [B, R] = mask.shape as [number, number];
    const scores = new Float32Array(B * R);
    for (let b = 0; b < B; b++) {
      let len = 0;
      for (let t = 0; t < R; t++) len += mask.data[b * R + t]!;
      scores[b * R + (len > 0 ? len - 1 : R - 1)] = lastValues!.data[b]!;
    }
    return new DataProto({ rm_scores: tensor(scores, [B, R], "float32") }, {}, {});
  }
}
