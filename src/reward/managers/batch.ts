// batch: one compute_score call for the whole batch, in batch form
// (dataSources, solutionStrs, groundTruths, extraInfos, kwargs) with
// reward_model.reward_kwargs as kwargs. Without a custom function the
// built-in scorers run per sample (verl issue #1317's fix). A user's reward
// module runs contained in a scoring thread (contained.ts). The scores are
// also stored as batch.acc.
import type { DataProto } from "../../protocol/data_proto.js";
import { ContainedRewardFunction, containmentOptions } from "../contained.js";
import { isPythonModule } from "../python_reward.js";
import { defaultComputeScore, normalizeScore } from "../scorers/registry.js";
import type { BatchComputeScoreFn, RewardManager, RewardManagerOptions, RewardResult } from "../types.js";
import { ExtraInfo, SampleExaminer, float32Column, placeScore, scoreFnLabel, readDecodedRows, rewardFromRmScores, zeroRewards } from "./common.js";

const defaultBatch: BatchComputeScoreFn = (dss, sols, gts, extras) =>
  Promise.all(dss.map((ds, i) => defaultComputeScore(ds, sols[i]!, gts[i], extras[i])));

export class BatchRewardManager implements RewardManager {
  private readonly computeBatch: BatchComputeScoreFn;
  private readonly contained: ContainedRewardFunction | null;

  constructor(private readonly opts: RewardManagerOptions) {
    const source = opts.computeScoreSource;
    // A Python function already runs contained in its own python3 process (python_reward.ts).
    this.contained = source && !isPythonModule(source.path) ? new ContainedRewardFunction(source, containmentOptions(opts.rewardKwargs)) : null;
    this.computeBatch = this.contained
      ? (dataSources, solutionStrs, groundTruths, extraInfos, kwargs) =>
        this.contained!.scoreBatch({ dataSources, solutionStrs, groundTruths, extraInfos, kwargs: kwargs ?? {} })
      : opts.computeBatch ?? (opts.computeScore as BatchComputeScoreFn | undefined) ?? defaultBatch;
  }

  async close(): Promise<void> {
    await this.contained?.close();
  }

  async compute(data: DataProto): Promise<RewardResult> {
    const fromRm = rewardFromRmScores(data);
    if (fromRm) return fromRm;
    const tok = this.opts.tokenizer;
    const { rows, responses } = readDecodedRows(data, tok, this.opts.rewardFnKey);
    const scores = await this.computeBatch(
      rows.map((r) => r.dataSource),
      responses,
      rows.map((r) => r.groundTruth ?? null),
      rows.map((r) => r.extraInfo),
      { ...this.opts.rewardKwargs },
    );
    if (!Array.isArray(scores) || scores.length !== rows.length) {
      throw new Error(`batch compute_score must return an array of ${rows.length} scores, got ${Array.isArray(scores) ? `${scores.length} items` : typeof scores}`);
    }
    const rewards = zeroRewards(data);
    const extra = new ExtraInfo();
    const examiner = new SampleExaminer(this.opts.numExamine);
    const plain: number[] = [];
    rows.forEach((row, i) => {
      const result = normalizeScore(scores[i], `batch ${scoreFnLabel(this.opts.computeScoreSource)}: item ${i} (row ${i}, data_source "${row.dataSource}")`);
      const score = typeof result === "number" ? result : result.score;
      if (typeof result !== "number") extra.addDict(result);
      plain.push(score);
      placeScore(rewards, i, row.validResponseLength, score, row.dataSource);
      examiner.show(tok, row, responses[i]!, result);
    });
    data.batch.acc = float32Column(plain);
    return { rewardTensor: rewards, rewardExtraInfo: extra.info };
  }
}
