// verl's model-based RewardModelWorker (reward_model.enable=true): a value-head
// model reads each full sequence and its output at the last attended token is the
// sequence's score, placed at the last valid response token of rm_scores [B, R]
// (an empty response puts it in the last slot, as verl does). With
// reward_model.model.input_tokenizer set and a reward model that has its own tokenizer,
// the sequences are re-rendered with the reward model's chat template first (rm_chat_template.ts).
import * as tf from "@tensorflow/tfjs";
import type { Config } from "../config/index.js";
import type { ValueHeadModel } from "../models/index.js";
import { DataProto } from "../protocol/index.js";
import { tensor } from "../protocol/tensor.js";
import { Dispatch, register, Worker } from "../single_controller/index.js";
import { column, toTf, type MicroBatchSpec } from "./batching.js";
import { inferInMicroBatches } from "./forward.js";
import { expandHome, hfOverrides, loadModelTokenizer, loadValueModel, modelKind, SCRATCH } from "./model_source.js";
import { switchChatTemplate, type SwitchLength } from "./rm_chat_template.js";
import { servedRewardModel } from "../config/validate.js";
import { loadTokenizer } from "../models/tokenizers/index.js";
import type { Tokenizer } from "../models/tokenizer.js";
import { inferenceSpec, setupWorker } from "./worker_setup.js";

export class RewardModelWorker extends Worker {
  private model: ValueHeadModel | undefined;
  private spec: MicroBatchSpec | undefined;
  private switchTemplate: { src: Tokenizer; target: Tokenizer; length: SwitchLength } | undefined;

  constructor(private readonly config: Config) {
    super();
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async initModel(): Promise<{ backend: string; numParams: number }> {
    const { cfg, seed, backend } = await setupWorker(this.config, ["actor_rollout_ref.model.external_lib", "reward_model.model.external_lib"]);
    const rm = cfg.at("reward_model");
    const modelCfg = rm.at("model");
    const actorModel = cfg.at("actor_rollout_ref.model");
    const actorTokenizer = await loadModelTokenizer(actorModel);
    let tokenizer = actorTokenizer;
    // verl's legacy worker switches chat templates whenever input_tokenizer is set (its default is the actor's
    // path); its reward loop (a reward model served by reward_model.rollout.name) always does, from the actor's
    // tokenizer. A scratch reward model has no tokenizer of its own: it reads the actor's token ids.
    const served = servedRewardModel(cfg.root);
    const inputTok = served !== null ? actorModel.str("path") : modelCfg.optStr("input_tokenizer");
    if (inputTok !== null && modelKind(modelCfg.str("path"), modelCfg.key("path")) !== "scratch") {
      tokenizer = await loadModelTokenizer(modelCfg);
      if (!tokenizer.hasChatTemplate) {
        throw new Error(
          `${modelCfg.key("input_tokenizer")}=${inputTok}: the reward model's tokenizer (${modelCfg.key("path")}) has no chat template to re-render ` +
            `the conversations with; set ${modelCfg.key("input_tokenizer")}=null to score the actor's token ids as they are`,
        );
      }
      // The actor's own path (verl's default) means the actor's tokenizer as loaded (tokenizer_path, custom_chat_template).
      const src = inputTok === actorModel.str("path") ? actorTokenizer : await loadInputTokenizer(inputTok, modelCfg.key("input_tokenizer"));
      this.switchTemplate = { src, target: tokenizer, length: { maxLength: rm.optInt("max_length") } };
    }
    this.model = await loadValueModel(modelCfg, tokenizer, seed + 17, hfOverrides(actorModel));
    if (served !== null && this.switchTemplate) {
      // the server's limit: rollout.max_model_len, else the model's max_position_embeddings (verl's vLLM default)
      this.switchTemplate.length = { served: true, maxModelLen: rm.optInt("rollout.max_model_len") ?? this.model.config.maxSeqLen };
    }
    this.spec = inferenceSpec(rm, "", "use_dynamic_bsz", "forward_max_token_len_per_gpu", this.worldSize);
    return { backend, numParams: this.model.trainableVariables().reduce((a, v) => a + v.size, 0) };
  }

  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async computeRmScore(data: DataProto): Promise<DataProto> {
    const model = this.model, spec = this.spec;
    if (!model || !spec) throw new Error(`reward model worker rank ${this.rank}: call initModel first`);
    const sw = this.switchTemplate;
    const rmData = sw ? switchChatTemplate(data, sw.src, sw.target, sw.length) : data;
    const [lastValues] = await inferInMicroBatches(rmData, spec, (micro) => {
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

/** input_tokenizer other than the actor's path: a tokenizer folder or file, or char:<alphabet>. */
async function loadInputTokenizer(spec: string, key: string): Promise<Tokenizer> {
  if (spec === SCRATCH) throw new Error(`${key}=${SCRATCH}: name the tokenizer that produced the actor's token ids (a folder, a tokenizer file, or char:<alphabet>)`);
  try {
    return await loadTokenizer(spec.startsWith("char:") ? spec : expandHome(spec));
  } catch (e) {
    throw new Error(`${key}: ${(e as Error).message}`);
  }
}
