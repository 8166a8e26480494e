// The two SFT configs verl has, read into one set of settings:
//   sft_trainer         verl's legacy trainer (verl.trainer.fsdp_sft_trainer): model.partial_pretrain,
//                       prompt/response columns or data.multiturn.enable, optim.lr_scheduler,
//                       metrics train/loss, train/lr(1e-3), train/time(s), val/loss
//   sft_trainer_engine  verl's engine trainer (verl.trainer.sft_trainer): model.path (the hf_model
//                       group), always multi-turn (data.messages_key), the shared optim group
//                       (lr_scheduler_type, lr_warmup_steps), data.use_dynamic_bsz, metrics
//                       train/loss, train/grad_norm, train/lr, train/global_tokens, train/total_tokens(B), val/loss
// A config is the engine layout when it has an `engine` section and no model.partial_pretrain
// (so a user config whose defaults include sft_trainer_engine is read the same way).
import { getPath, type Config } from "../../config/index.js";
import { ConfigView } from "../../workers/config_view.js";
import type { MicroBatchSpec } from "../../workers/batching.js";

export function isEngineSftLayout(config: Config): boolean {
  return getPath(config, "engine") !== undefined && getPath(config, "model.partial_pretrain") === undefined;
}

/** Legacy layout: the model path is model.partial_pretrain; errors name the key the user typed. */
class PartialPretrainView extends ConfigView {
  override key(k: string): string {
    return super.key(k === "path" ? "partial_pretrain" : k);
  }
}

/** The model section as the workers' loaders read it (`path`, tokenizer_path, custom_chat_template, LoRA keys). */
export function sftModelView(config: Config): ConfigView {
  return isEngineSftLayout(config) ? new ConfigView(config, "model") : new PartialPretrainView(config, "model");
}

/** Whether rows are conversations (MultiTurnSFTDataset) rather than prompt/response pairs. */
export function isMultiTurnSft(config: Config): boolean {
  return isEngineSftLayout(config) || getPath(config, "data.multiturn.enable") === true;
}

/** Micro-batches of one rank's rows: data.micro_batch_size_per_gpu, or token budgets with the engine's data.use_dynamic_bsz. */
export function sftMicroBatchSpec(config: Config): MicroBatchSpec {
  const cfg = new ConfigView(config, "data");
  if (isEngineSftLayout(config) && cfg.bool("use_dynamic_bsz", false)) {
    const maxTokenLen = cfg.int("max_token_len_per_gpu");
    if (maxTokenLen < 1) throw new Error(`data.max_token_len_per_gpu must be >= 1, got ${maxTokenLen}`);
    return { microBatchSize: null, maxTokenLen };
  }
  const microBatchSize = cfg.int("micro_batch_size_per_gpu");
  if (microBatchSize < 1) throw new Error(`data.micro_batch_size_per_gpu must be >= 1, got ${microBatchSize}`);
  return { microBatchSize, maxTokenLen: null };
}
