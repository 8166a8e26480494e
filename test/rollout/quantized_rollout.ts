// Shared by the quantized-rollout tests (fp8, torchao): how far the rollout's log-probs sit from the
// float32 trainer's, and a 2-step stories260K GRPO run's rollout-correction metrics.
import { loadConfig } from "../../src/config/index.js";
import type { LlamaModel } from "../../src/models/llama.js";
import type { DataProto } from "../../src/protocol/data_proto.js";
import { computeLogProb, defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { readParamsForDecode } from "../../src/rollout/decode_weights.js";
import { Rng } from "../../src/utils/rng.js";
import { ONCE_UPON_A_TIME } from "../models/stories.js";
import { runPpo } from "../../src/trainer/main_ppo.js";
import type { Workspace } from "../trainer/ppo/trainer/fixtures.js";

/** Three stories260K prompts, two samples each, 24 tokens at temperature 1 with their rollout log-probs, from the weights as they are now. */
export async function sampleWithLogProbs(m: LlamaModel): Promise<DataProto> {
  await readParamsForDecode(m);
  const batch = leftPadPrompts([ONCE_UPON_A_TIME, [1, 403], [1, 378, 261, 407]], 0);
  return generate(m, batch, defaultSamplingParams({ temperature: 1, responseLength: 24, eosTokenIds: [2], padTokenId: 0, calculateLogProbs: true, n: 2 }), new Rng(11));
}

/** Mean and largest |rollout log-prob - trainer log-prob| over the response tokens. */
export async function logProbGap(m: LlamaModel, out: DataProto): Promise<{ mean: number; max: number }> {
  const lp = await computeLogProb(m, out, { microBatchSize: 16, temperature: 1 });
  const mask = out.batch["response_mask"]!.data, roll = out.batch["rollout_log_probs"]!.data;
  let sum = 0, max = 0, n = 0;
  for (let i = 0; i < mask.length; i++) {
    if (!mask[i]) continue;
    const d = Math.abs(roll[i]! - lp.logProbs.data[i]!);
    sum += d; max = Math.max(max, d); n++;
  }
  return { mean: sum / n, max };
}

/** [rollout_corr/kl, rollout_corr/k3_kl] of each step of a 2-step GRPO run of stories260K (`bin`) in `ws`, with `extra` overrides. */
export async function grpoRolloutCorr(ws: Workspace, bin: string, extra: string[]): Promise<(readonly [number, number])[]> {
  const res = await runPpo(loadConfig({
    configName: "ppo_trainer",
    overrides: [...ws.overrides, `actor_rollout_ref.model.path=${bin}`, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.calculate_log_probs=true",
      "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.logger=[]", "trainer.n_gpus_per_node=1", ...extra],
  }));
  return res.history.map((h) => [h.metrics["rollout_corr/kl"]!, h.metrics["rollout_corr/k3_kl"]!] as const);
}
