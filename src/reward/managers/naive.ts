// naive: score each sample in turn with compute_score (the user's or the
// built-in scorer for its data_source), at the last valid response token.
import type { DataProto } from "../../protocol/data_proto.js";
import type { Tokenizer } from "../../models/tokenizer.js";
import { defaultComputeScore, normalizeScore } from "../scorers/registry.js";
import type { ComputeScoreFn, RewardManager, RewardManagerOptions, RewardResult } from "../types.js";
import { ExtraInfo, SampleExaminer, placeScore, readRows, requireGroundTruth, rewardFromRmScores, zeroRewards, type RewardRow } from "./common.js";

export interface ScoredRow {
  row: RewardRow;
  responseStr: string;
  result: number | { score: number; [k: string]: unknown };
}

/** Decode and score rows one after another (shared by naive and dapo). */
export async function scoreRowsSequentially(
  data: DataProto,
  tokenizer: Tokenizer,
  computeScore: ComputeScoreFn,
  rewardFnKey: string,
  transformResponse: (s: string) => string = (s) => s,
): Promise<ScoredRow[]> {
  const out: ScoredRow[] = [];
  for (const row of readRows(data, rewardFnKey)) {
    const responseStr = transformResponse(tokenizer.decode(row.responseIds, { skipSpecialTokens: true }));
    let raw: unknown;
    try {
      raw = await computeScore(row.dataSource, responseStr, requireGroundTruth(row), row.extraInfo);
    } catch (e) {
      throw new Error(`reward: compute_score failed on row ${row.index} (data_source "${row.dataSource}"): ${(e as Error).message}`, { cause: e });
    }
    out.push({ row, responseStr, result: normalizeScore(raw, `compute_score on row ${row.index} (data_source "${row.dataSource}")`) });
  }
  return out;
}

export class NaiveRewardManager implements RewardManager {
  protected readonly computeScore: ComputeScoreFn;

  constructor(protected readonly opts: RewardManagerOptions) {
    this.computeScore = (opts.computeScore as ComputeScoreFn | undefined) ?? defaultComputeScore;
  }

  async compute(data: DataProto): Promise<RewardResult> {
    const fromRm = rewardFromRmScores(data);
    if (fromRm) return fromRm;
    const rewards = zeroRewards(data);
    const extra = new ExtraInfo();
    const examiner = new SampleExaminer(this.opts.numExamine);
    for (const { row, responseStr, result } of await scoreRowsSequentially(data, this.opts.tokenizer, this.computeScore, this.opts.rewardFnKey)) {
      const score = typeof result === "number" ? result : result.score;
      if (typeof result !== "number") extra.addDict(result);
      placeScore(rewards, row.index, row.validResponseLength, score);
      examiner.show(this.opts.tokenizer, row, responseStr, result);
    }
    return { rewardTensor: rewards, rewardExtraInfo: extra.info };
  }
}
