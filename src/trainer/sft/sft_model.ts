// The SFT model section: legacy sft_trainer spells the model path `model.partial_pretrain`
// (verl's name), sft_trainer_engine `model.path` like the RL roles (sft_layout.ts picks the
// view); everything else (tokenizer_path, override_config for `scratch`, external_lib, the
// LoRA keys) reads the same, with errors naming the key the user typed.
import type { Config } from "../../config/index.js";
import type { LlamaModel, Tokenizer } from "../../models/index.js";
import { ConfigView } from "../../workers/config_view.js";
import { loadModelTokenizer, loadPolicy, withTemplateOverride } from "../../workers/model_source.js";
import { isEngineSftLayout, sftModelView } from "./sft_layout.js";

export { sftModelView } from "./sft_layout.js";

/**
 * model.tokenizer_path, else the tokenizer beside the model; its chat template replaced by
 * model.custom_chat_template (engine layout) or data.chat_template (legacy) where set.
 */
export async function loadSftTokenizer(config: Config): Promise<Tokenizer> {
  const tok = await loadModelTokenizer(sftModelView(config));
  return isEngineSftLayout(config) ? tok : withTemplateOverride(tok, new ConfigView(config, "data"), "chat_template");
}

/** The model path: a llama2.c .bin, a Hugging Face folder, or `scratch` (+model.override_config.*). */
export function loadSftModel(config: Config, tokenizer: Tokenizer, seed: number): Promise<LlamaModel> {
  return loadPolicy(sftModelView(config), tokenizer, seed);
}
