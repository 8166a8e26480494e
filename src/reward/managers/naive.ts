// naive: score each sample with compute_score (the user's or the built-in scorer
// for its data_source), at the last valid response token. A user's reward module
// (custom_reward_function.path) runs contained in scoring threads (contained.ts);
// built-in scorers and a function object passed in code run in turn in this thread.
import type { DataProto } from "../../protocol/data_proto.js";
import type { Tokenizer } from "../../models/tokenizer.js";
import { ContainedRewardFunction, containmentOptions, type SampleToScore } from "../contained.js";
import { isPythonModule } from "../python_reward.js";
import { defaultComputeScore, normalizeScore } from "../scorers/registry.js";
import type { ComputeScoreFn, RewardManager, RewardManagerOptions, RewardResult } from "../types.js";
import { ExtraInfo, SampleExaminer, placeScore, scoreFnLabel, readRows, requireGroundTruth, rewardFromRmScores, zeroRewards, type RewardRow } from "./common.js";

export interface ScoredRow {
  row: RewardRow;
  responseStr: string;
  result: number | { score: number; [k: string]: unknown };
}

type SampleScorer = (samples: SampleToScore[]) => Promise<unknown[]>;

/** Decode and score rows (shared by naive and dapo). */
export async function scoreRows(
  data: DataProto,
  tokenizer: Tokenizer,
  scoreSamples: SampleScorer,
  rewardFnKey: string,
  transformResponse: (s: string) => string = (s) => s,
  label = "compute_score",
): Promise<ScoredRow[]> {
  const rows = readRows(data, rewardFnKey);
  const samples = rows.map((row) => ({
    index: row.index, dataSource: row.dataSource, groundTruth: requireGroundTruth(row), extraInfo: row.extraInfo,
    solutionStr: transformResponse(tokenizer.decode(row.responseIds, { skipSpecialTokens: true })),
  }));
  const raw = await scoreSamples(samples);
  return rows.map((row, i) => ({
    row, responseStr: samples[i]!.solutionStr,
    result: normalizeScore(raw[i], `${label} on row ${row.index} (data_source "${row.dataSource}")`),
  }));
}

/** One sample after the other in this thread. */
function inThisThread(computeScore: ComputeScoreFn): SampleScorer {
  return async (samples) => {
    const out: unknown[] = [];
    for (const s of samples) {
      try {
        out.push(await computeScore(s.dataSource, s.solutionStr, s.groundTruth, s.extraInfo));
      } catch (e) {
        throw new Error(`reward: compute_score failed on row ${s.index} (data_source "${s.dataSource}"): ${(e as Error).message}`, { cause: e });
      }
    }
    return out;
  };
}

export class NaiveRewardManager implements RewardManager {
  protected readonly scoreSamples: SampleScorer;
  private readonly contained: ContainedRewardFunction | null;

  constructor(protected readonly opts: RewardManagerOptions) {
    const source = opts.computeScoreSource;
    // A Python function already runs contained in its own python3 process (python_reward.ts).
    this.contained = source && !isPythonModule(source.path) ? new ContainedRewardFunction(source, containmentOptions(opts.rewardKwargs)) : null;
    this.scoreSamples = this.contained
      ? (samples) => this.contained!.scoreSamples(samples)
      : inThisThread((opts.computeScore as ComputeScoreFn | undefined) ?? defaultComputeScore);
  }

  async compute(data: DataProto): Promise<RewardResult> {
    const fromRm = rewardFromRmScores(data);
    if (fromRm) return fromRm;
    const rewards = zeroRewards(data);
    const extra = new ExtraInfo();
    const examiner = new SampleExaminer(this.opts.numExamine);
    for (const { row, responseStr, result } of await scoreRows(data, this.opts.tokenizer, this.scoreSamples, this.opts.rewardFnKey, undefined, scoreFnLabel(this.opts.computeScoreSource))) {
      const score = typeof result === "number" ? result : result.score;
      if (typeof result !== "number") extra.addDict(result);
      placeScore(rewards, row.index, row.validResponseLength, score, row.dataSource);
      examiner.show(this.opts.tokenizer, row, responseStr, result);
    }
    return { rewardTensor: rewards, rewardExtraInfo: extra.info };
  }

  async close(): Promise<void> {
    await this.contained?.close();
  }
}
