// actor_rollout_ref.model.mtp (verl's MtpConfig): multi-token prediction for models that carry
// MTP layers (MiMo's model.mtp_layers.*, num_nextn_predict_layers in config.json).
//   enable           load (and save) the MTP layers; off, they are left out as verl leaves them out
//   enable_train     add the MTP loss (mtp_loss_scaling_factor x its cross entropy) to the actor's loss
//   detach_encoder   no gradient from the MTP loss into the trunk or the embedding (the MTP layer and lm_head train)
//   enable_rollout   speculative decoding with the MTP layer as the draft (src/rollout/speculative.ts;
//                    agent loops: src/rollout/speculative_slots.ts), as vLLM's method "mtp"
//   num_speculative_tokens  drafts per step (vLLM's key, which verl passes on): MiMo's one MTP layer
//                    is run again on its own output for each draft after the first, as vLLM does
// speculative_* are SGLang's EAGLE settings: read only by an SGLang server, which verl-ts does not drive.
import type { ModelConfig } from "../models/config.js";
import type { ConfigView } from "./config_view.js";

export interface MtpSettings {
  enable: boolean;
  enableTrain: boolean;
  enableRollout: boolean;
  detachEncoder: boolean;
  lossScalingFactor: number;
  /** num_speculative_tokens: drafts per step (1 unless enable_rollout) */
  draftTokens: number;
}

/** The section's settings, checked on their own (the model is checked by checkMtpFitsModel). */
export function readMtpSettings(model: ConfigView): MtpSettings {
  const m = model.at("mtp");
  const s: MtpSettings = {
    enable: m.bool("enable", false),
    enableTrain: m.bool("enable_train", false),
    enableRollout: m.bool("enable_rollout", false),
    detachEncoder: m.bool("detach_encoder", false),
    lossScalingFactor: m.num("mtp_loss_scaling_factor", 0.1),
    draftTokens: 1,
  };
  for (const [k, on] of [["enable_train", s.enableTrain], ["enable_rollout", s.enableRollout]] as const) {
    if (on && !s.enable) throw new Error(`${m.key(k)}=true needs ${m.key("enable")}=true (the MTP layers are loaded only then)`);
  }
  if (s.enableRollout) {
    const method = m.str("method", "mtp"), k = m.int("num_speculative_tokens", 1);
    if (method !== "mtp") throw new Error(`${m.key("method")}=${JSON.stringify(method)} is not supported: the draft is the model's own MTP layer (method mtp)`);
    if (!(k >= 1)) throw new Error(`${m.key("num_speculative_tokens")} must be an integer >= 1, got ${k}`);
    s.draftTokens = k;
  }
  if (!(s.lossScalingFactor >= 0)) throw new Error(`${m.key("mtp_loss_scaling_factor")} must be a number >= 0, got ${s.lossScalingFactor}`);
  return s;
}
/** What the loaded model must have for the settings: MTP layers when enable, one of them when training it. */
export function checkMtpFitsModel(s: MtpSettings, c: ModelConfig, key: string): void {
  if (!s.enable) return;
  if (!c.mtpLayers) {
    throw new Error(`${key}.mtp.enable=true: the model has no multi-token-prediction layers (num_nextn_predict_layers is 0 or absent; model_type ${c.modelType ?? "llama"}); MTP needs a MiMo checkpoint with model.mtp_layers.*`);
  }
  if (s.enableTrain && c.mtpLayers !== 1) {
    throw new Error(`${key}.mtp.enable_train=true: the model has ${c.mtpLayers} MTP layers; training is built for one (MiMo's num_nextn_predict_layers=1)`);
  }
}
