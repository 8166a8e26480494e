// actor_rollout_ref.model.mtp read and checked: what needs what, and the speculative settings built.
import { test } from "node:test";
import assert from "node:assert/strict";
import { makeConfig } from "../../src/models/config.js";
import type { Config } from "../../src/config/index.js";
import { ConfigView } from "../../src/workers/config_view.js";
import { checkMtpFitsModel, readMtpSettings } from "../../src/workers/mtp_settings.js";

const view = (mtp: Record<string, unknown>) => new ConfigView({ actor_rollout_ref: { model: { mtp } } } as unknown as Config, "actor_rollout_ref.model");

test("mtp settings: defaults off; enable_train and enable_rollout need enable; only method mtp, with one draft token or more", () => {
  assert.deepEqual(readMtpSettings(view({})), { enable: false, enableTrain: false, enableRollout: false, detachEncoder: false, lossScalingFactor: 0.1, draftTokens: 1 });
  assert.deepEqual(readMtpSettings(view({ enable: true, enable_train: true, enable_rollout: true, detach_encoder: true, mtp_loss_scaling_factor: 0.3 })),
    { enable: true, enableTrain: true, enableRollout: true, detachEncoder: true, lossScalingFactor: 0.3, draftTokens: 1 });
  assert.equal(readMtpSettings(view({ enable: true, enable_rollout: true, num_speculative_tokens: 3 })).draftTokens, 3);
  assert.throws(() => readMtpSettings(view({ enable_train: true })), /actor_rollout_ref\.model\.mtp\.enable_train=true needs actor_rollout_ref\.model\.mtp\.enable=true/);
  assert.throws(() => readMtpSettings(view({ enable_rollout: true })), /mtp\.enable_rollout=true needs actor_rollout_ref\.model\.mtp\.enable=true/);
  assert.throws(() => readMtpSettings(view({ enable: true, enable_rollout: true, method: "eagle" })), /mtp\.method="eagle" is not supported/);
  assert.throws(() => readMtpSettings(view({ enable: true, enable_rollout: true, num_speculative_tokens: 0 })), /mtp\.num_speculative_tokens must be an integer >= 1, got 0/);
  assert.throws(() => readMtpSettings(view({ mtp_loss_scaling_factor: -1 })), /mtp_loss_scaling_factor must be a number >= 0/);
  // the speculative settings are read only with enable_rollout
  assert.deepEqual(readMtpSettings(view({ enable: true, num_speculative_tokens: 3 })), { ...readMtpSettings(view({ enable: true })), draftTokens: 1 });
});

test("mtp settings against the model: enable needs MTP layers, training one of them", () => {
  const on = readMtpSettings(view({ enable: true, enable_train: true }));
  const qwen2 = makeConfig({ vocabSize: 8, dim: 8, nLayers: 1, nHeads: 2, modelType: "qwen2", attentionBias: true });
  assert.throws(() => checkMtpFitsModel(on, qwen2, "actor_rollout_ref.model"), /actor_rollout_ref\.model\.mtp\.enable=true: the model has no multi-token-prediction layers/);
  checkMtpFitsModel(readMtpSettings(view({})), qwen2, "actor_rollout_ref.model");
  const mimo = (n: number) => makeConfig({ vocabSize: 8, dim: 8, nLayers: 1, nHeads: 2, modelType: "mimo", attentionBias: true, mtpLayers: n });
  checkMtpFitsModel(on, mimo(1), "actor_rollout_ref.model");
  assert.throws(() => checkMtpFitsModel(on, mimo(2), "actor_rollout_ref.model"), /the model has 2 MTP layers; training is built for one/);
  assert.throws(() => makeConfig({ vocabSize: 8, dim: 8, nLayers: 1, nHeads: 2, modelType: "qwen2", attentionBias: true, mtpLayers: 1 }), /built for MiMo only/);
});
