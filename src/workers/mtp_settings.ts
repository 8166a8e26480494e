// actor_rollout_ref.model.mtp (verl's MtpConfig): multi-token prediction for models that carry
// MTP layers (MiMo's model.mtp_layers.*, num_nextn_predict_layers in config.json).
//   enable           load (and save) the MTP layers; off, they are left out as verl leaves them out
//   enable_train     add the MTP loss (mtp_loss_scaling_factor x its cross entropy) to the actor's loss
//   detach_encoder   the MTP loss trains the MTP layer only (no gradient into the trunk or the embedding)
//   enable_rollout   speculative decoding with the MTP layer as the draft: not built (refused here)
// method / num_speculative_tokens (vLLM) and speculative_* (SGLang's EAGLE) configure that rollout only.
import type { ModelConfig } from "../models/config.js";
import type { ConfigView } from "./config_view.js";

export interface MtpSettings {
  enable: boolean;
  enableTrain: boolean;
  detachEncoder: boolean;
  lossScalingFactor: number;
}

/** The section's settings, checked on their own (the model is checked by checkMtpFitsModel). */
export function readMtpSettings(model: ConfigView): MtpSettings {
  const m = model.at("mtp");
  const s: MtpSettings = {
    enable: m.bool("enable", false),
    enableTrain: m.bool("enable_train", false),
    detachEncoder: m.bool("detach_encoder", false),
    lossScalingFactor: m.num("mtp_loss_scaling_factor", 0.1),
  };
  if (s.enableTrain && !s.enable) throw new Error(`${m.key("enable_train")}=true needs ${m.key("enable")}=true (the MTP layers are loaded only then)`);
  if (m.bool("enable_rollout", false)) {
    throw new Error(
      `${m.key("enable_rollout")}=true is not supported: speculative decoding with the MTP layer as the draft is not built in verl-ts's decoders ` +
        `(the MTP layers load, train and export; rollouts decode with the trunk alone)`,
    );
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
