// The SFT model section spells the model path `model.partial_pretrain` (verl's
// name) where the RL roles say `*.model.path`; everything else (tokenizer_path,
// override_config for `scratch`, external_lib) reads the same. A view that maps
// the one key lets the workers' loaders serve both, with errors naming the key
// the user typed.
import type { Config } from "../../config/index.js";
import type { LlamaModel, Tokenizer } from "../../models/index.js";
import { ConfigView } from "../../workers/config_view.js";
import { loadModelTokenizer, loadPolicy, withTemplateOverride } from "../../workers/model_source.js";

class SftModelView extends ConfigView {
  override key(k: string): string {
    return super.key(k === "path" ? "partial_pretrain" : k);
  }
}

export function sftModelView(config: Config): ConfigView {
  return new SftModelView(config, "model");
}

/**
 * model.tokenizer_path, else the tokenizer beside model.partial_pretrain; its chat template replaced by
 * data.chat_template where set.
 */
export async function loadSftTokenizer(config: Config): Promise<Tokenizer> {
  return withTemplateOverride(await loadModelTokenizer(sftModelView(config)), new ConfigView(config, "data"), "chat_template");
}

/** model.partial_pretrain: a llama2.c .bin, a Hugging Face folder, or `scratch` (+model.override_config.*). */
export function loadSftModel(config: Config, tokenizer: Tokenizer, seed: number): Promise<LlamaModel> {
  return loadPolicy(sftModelView(config), tokenizer, seed);
}
