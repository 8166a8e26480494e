// Validation (verl's _validate): generate val_kwargs.n responses per validation
// prompt with the val_kwargs sampling, score them with the validation reward
// manager, and reduce per data source and prompt into val-core/val-aux metrics
// (mean@N, best@n, maj@n, ...). Generations can be logged and dumped.
import { join } from "node:path";
import type { Tokenizer } from "../../models/index.js";
import { DataProto } from "../../protocol/index.js";
import type { RewardManager } from "../../reward/index.js";
import { writeFileAtomic } from "../../utils/fs.js";
import { logger } from "../../utils/logger.js";
import { Rng } from "../../utils/rng.js";
import type { ConfigView } from "../../workers/config_view.js";
import { processValidationMetrics, validationMetricsToDict } from "./metric_utils.js";
import { callProto, type RoleGroup } from "./resources.js";
import { agentRowKeys, assignUids, decodeRows, popGenBatch, rowSums } from "./step_batch.js";

export interface ValidationContext {
  cfg: ConfigView;
  tokenizer: Tokenizer;
  valLoader: Iterable<DataProto>;
  rewardFn: RewardManager;
  actorRollout: RoleGroup;
  /** trainer.seed: validation uids and sample seeds come from a stream fixed by (seed, step). */
  seed: number;
  seedPerSample: boolean;
}

export async function validate(ctx: ValidationContext, globalStep: number): Promise<Record<string, number>> {
  const { cfg, tokenizer } = ctx;
  const n = cfg.int("actor_rollout_ref.rollout.val_kwargs.n", 1);
  const doSample = cfg.bool("actor_rollout_ref.rollout.val_kwargs.do_sample", false);
  const dataSources: string[] = [], uids: string[] = [];
  const infos: Record<string, unknown[]> = { reward: [] };
  const samples: { input: string; output: string; gts: unknown; score: number }[] = [];
  // Not the training stream: validating must not shift what training draws next.
  const rng = new Rng((ctx.seed ^ 0x5a17 ^ Math.imul(globalStep + 1, 0x9e3779b1)) >>> 0);
  for (const valBatch of ctx.valLoader) {
    assignUids(valBatch, rng);
    const gen = popGenBatch(valBatch, n, ctx.seedPerSample && doSample ? rng : null, agentRowKeys(cfg, valBatch));
    gen.metaInfo = {
      eos_token_id: tokenizer.eosTokenId, pad_token_id: tokenizer.padTokenId, recompute_log_prob: false,
      do_sample: doSample, validate: true, global_steps: globalStep,
    };
    const out = await callProto(ctx.actorRollout, "generateSequences", gen);
    const batch = valBatch.repeat(n, true).union(new DataProto(out.batch, out.nonTensorBatch, {}));
    const result = await ctx.rewardFn.compute(batch);
    const scores = rowSums(result.rewardTensor);
    const ds = batch.nonTensorBatch[cfg.str("data.reward_fn_key", "data_source")] ?? batch.nonTensorBatch.data_source;
    scores.forEach((s, i) => {
      dataSources.push(typeof ds?.[i] === "string" ? (ds[i] as string) : "unknown");
      uids.push(batch.nonTensorBatch.uid![i] as string);
      infos.reward!.push(s);
    });
    for (const [k, vals] of Object.entries(result.rewardExtraInfo)) {
      if (vals.length === scores.length) (infos[k] ??= []).push(...vals);
    }
    samples.push(...decodeRows(batch, tokenizer, scores));
  }
  for (const [k, v] of Object.entries(infos)) if (v.length !== dataSources.length) delete infos[k];
  logValidationSamples(samples, cfg.int("trainer.log_val_generations", 0));
  const dumpDir = cfg.optStr("trainer.validation_data_dir");
  if (dumpDir) dumpGenerations(dumpDir, globalStep, samples.map((s, i) => ({ ...s, step: globalStep, ...extrasAt(infos, i) })), "trainer.validation_data_dir");
  return validationMetricsToDict(processValidationMetrics(dataSources, uids, infos));
}

function extrasAt(infos: Record<string, unknown[]>, i: number): Record<string, unknown> {
  return Object.fromEntries(Object.entries(infos).filter(([k]) => k !== "reward").map(([k, v]) => [k, v[i]]));
}

/** `trainer.log_val_generations` samples, sorted by input then drawn with a fixed seed (as verl). */
function logValidationSamples(samples: { input: string; output: string; score: number }[], count: number): void {
  if (count <= 0 || samples.length === 0) return;
  const sorted = [...samples].sort((a, b) => (a.input < b.input ? -1 : a.input > b.input ? 1 : 0));
  for (const s of sorted.slice(0, count)) logger().info({ input: s.input, output: s.output, score: s.score }, "validation sample");
}

/** `{dir}/{step}.jsonl`, one generation per line (verl's _dump_generations). `key` is the setting that named dir. */
export function dumpGenerations(dir: string, step: number, rows: Record<string, unknown>[], key = "trainer.rollout_data_dir"): void {
  try {
    writeFileAtomic(join(dir, `${step}.jsonl`), rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
  } catch (e) {
    throw new Error(`${key}: ${(e as Error).message} (or unset ${key} to stop the dump)`, { cause: e });
  }
}
