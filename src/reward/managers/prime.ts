// prime: score samples in parallel on worker threads with a per-sample
// timeout (verl: 64 processes, 300 s). A timeout or an exception scores 0, is
// logged and counted (reward/timeout_count, reward/error_count) and training
// goes on; a hung synchronous scorer is cut off by terminating its thread.
// Options from reward_model.reward_kwargs: num_workers, timeout_s.
import type { DataProto } from "../../protocol/data_proto.js";
import { logger } from "../../utils/logger.js";
import { containmentOptions, LazyScoringPool } from "../contained.js";
import { normalizeScore } from "../scorers/registry.js";
import type { ComputeScoreFn, RewardManager, RewardManagerOptions, RewardResult, ScoreDict } from "../types.js";
import { SampleExaminer, float32Column, placeScore, readDecodedRows, rewardFromRmScores, zeroRewards } from "./common.js";

type Outcome = { kind: "ok"; value: number | ScoreDict } | { kind: "timeout" } | { kind: "error"; message: string };

/** One sample scored in this thread by a function that waits on a service, bounded by timeout_s as the threads are. */
async function scoreInDriver(fn: ComputeScoreFn, s: { dataSource: string; solutionStr: string; groundTruth: unknown; extraInfo: Record<string, unknown> | null }, timeoutS: number): Promise<Outcome> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<Outcome>((resolve) => {
    timer = setTimeout(() => resolve({ kind: "timeout" }), timeoutS * 1000);
  });
  const scored = (async (): Promise<Outcome> => {
    try {
      const v = normalizeScore(await fn(s.dataSource, s.solutionStr, s.groundTruth, s.extraInfo), `compute_score (data_source "${s.dataSource}")`);
      return { kind: "ok", value: v };
    } catch (e) {
      return { kind: "error", message: (e as Error).message };
    }
  })();
  try {
    return await Promise.race([scored, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Dict fields per row, kept aligned with the batch: a failed row gets score 0 and null elsewhere. */
function alignedExtraInfo(dicts: (Record<string, unknown> | null)[]): Record<string, unknown[]> {
  const keys = new Set<string>();
  for (const d of dicts) if (d) for (const k of Object.keys(d)) keys.add(k);
  const out: Record<string, unknown[]> = {};
  for (const k of keys) out[k] = dicts.map((d) => (d ? (d[k] ?? null) : k === "score" ? 0 : null));
  return out;
}

export class PrimeRewardManager implements RewardManager {
  readonly numWorkers: number;
  readonly timeoutS: number;
  /** null when computeScore runs in this thread (a service call): no threads, and no warning about what they cannot reach. */
  private readonly threads: LazyScoringPool | null;

  constructor(private readonly opts: RewardManagerOptions) {
    const contain = containmentOptions(opts.rewardKwargs, "prime");
    this.numWorkers = contain.numWorkers;
    this.timeoutS = contain.timeoutS;
    if (opts.computeScore && !opts.computeScoreSource && !opts.computeScoreInDriver) {
      throw new Error(
        "the prime reward manager scores in worker threads, which cannot receive a function object: " +
          "give the reward function as a module (custom_reward_function.path / .name), or register scorers with registerScorer(name, fn, { module: import.meta.url })",
      );
    }
    this.threads = opts.computeScoreInDriver ? null : new LazyScoringPool(opts.computeScoreSource ?? null, contain);
  }

  async compute(data: DataProto): Promise<RewardResult> {
    const fromRm = rewardFromRmScores(data);
    if (fromRm) return fromRm;
    const tok = this.opts.tokenizer;
    const { rows, responses } = readDecodedRows(data, tok, this.opts.rewardFnKey);
    const inDriver = this.opts.computeScoreInDriver ? (this.opts.computeScore as ComputeScoreFn | undefined) : undefined;
    const pool = inDriver ? null : await this.threads!.get();
    const outcomes = await Promise.all(rows.map((r, i) => {
      const sample = { dataSource: r.dataSource, solutionStr: responses[i]!, groundTruth: r.groundTruth ?? null, extraInfo: r.extraInfo };
      return inDriver ? scoreInDriver(inDriver, sample, this.timeoutS) : pool!.score(sample);
    }));
    const rewards = zeroRewards(data);
    const dicts: (Record<string, unknown> | null)[] = [];
    const examiner = new SampleExaminer(this.opts.numExamine);
    const acc: number[] = [];
    let timeouts = 0, errors = 0;
    outcomes.forEach((o, i) => {
      const row = rows[i]!;
      let score = 0;
      if (o.kind === "ok") {
        score = typeof o.value === "number" ? o.value : o.value.score;
        dicts.push(typeof o.value === "number" ? null : o.value);
      } else if (o.kind === "timeout") {
        timeouts++;
        dicts.push(null);
        logger().warn({ data_source: row.dataSource, completion: responses[i]!.slice(0, 80), timeout_s: this.timeoutS }, "reward timeout: scored 0");
      } else {
        errors++;
        dicts.push(null);
        logger().warn({ data_source: row.dataSource, completion: responses[i]!.slice(0, 80), error: o.message }, "reward error: scored 0");
      }
      acc.push(score);
      placeScore(rewards, i, row.validResponseLength, score, row.dataSource);
      examiner.show(tok, row, responses[i]!, o.kind === "ok" ? o.value : o.kind);
    });
    data.batch.acc = float32Column(acc);
    return { rewardTensor: rewards, rewardExtraInfo: alignedExtraInfo(dicts), metrics: { "reward/timeout_count": timeouts, "reward/error_count": errors } };
  }

  close(): Promise<void> {
    return this.threads ? this.threads.close() : Promise.resolve();
  }
}
