// dapo: naive scoring plus DAPO's soft overlong penalty (verl section 8.1):
// penalty = min(-(len - (max_resp_len - buffer_len)) / buffer_len * factor, 0),
// added to the score. A plain-number score is also logged as `acc`.
import { getPath } from "../../config/index.js";
import type { DataProto } from "../../protocol/data_proto.js";
import type { RewardManagerOptions, RewardResult } from "../types.js";
import { ExtraInfo, SampleExaminer, placeScore, scoreFnLabel, rewardFromRmScores, zeroRewards } from "./common.js";
import { NaiveRewardManager, scoreRows } from "./naive.js";

export interface OverlongBufferConfig {
  enable: boolean;
  len: number;
  penaltyFactor: number;
  log: boolean;
}

function readOverlong(opts: RewardManagerOptions): { cfg: OverlongBufferConfig | null; maxRespLen: number | null } {
  const kw = opts.rewardKwargs;
  const raw = (kw.overlong_buffer_cfg ?? (opts.config ? getPath(opts.config, "reward_model.overlong_buffer") : undefined)) as Record<string, unknown> | undefined | null;
  const maxRaw = kw.max_resp_len ?? (opts.config ? getPath(opts.config, "data.max_response_length") : undefined);
  const maxRespLen = typeof maxRaw === "number" ? maxRaw : null;
  if (!raw || !raw.enable) return { cfg: null, maxRespLen };
  const cfg: OverlongBufferConfig = {
    enable: true,
    len: Number(raw.len),
    penaltyFactor: Number(raw.penalty_factor ?? 1),
    log: Boolean(raw.log),
  };
  if (!(cfg.len > 0)) throw new Error(`reward_model.overlong_buffer.len must be > 0 when enabled (got ${JSON.stringify(raw.len)})`);
  if (maxRespLen === null) throw new Error("the dapo reward manager's overlong buffer needs data.max_response_length");
  if (maxRespLen < cfg.len) {
    throw new Error(`data.max_response_length (${maxRespLen}) must be >= reward_model.overlong_buffer.len (${cfg.len})`);
  }
  return { cfg, maxRespLen };
}

export class DapoRewardManager extends NaiveRewardManager {
  private readonly overlong: OverlongBufferConfig | null;
  private readonly maxRespLen: number | null;

  constructor(opts: RewardManagerOptions) {
    super(opts);
    const { cfg, maxRespLen } = readOverlong(opts);
    this.overlong = cfg;
    this.maxRespLen = maxRespLen;
  }

  override async compute(data: DataProto): Promise<RewardResult> {
    const fromRm = rewardFromRmScores(data);
    if (fromRm) return fromRm;
    const tok = this.opts.tokenizer;
    const eosText = tok.decode([tok.eosTokenId]);
    const stripEos = (s: string) => (eosText && s.endsWith(eosText) ? s.slice(0, -eosText.length) : s);
    const rewards = zeroRewards(data);
    const extra = new ExtraInfo();
    const examiner = new SampleExaminer(this.opts.numExamine);
    const scored = await scoreRows(data, tok, this.scoreSamples, this.opts.rewardFnKey, stripEos, scoreFnLabel(this.opts.computeScoreSource));
    for (const { row, responseStr, result } of scored) {
      let reward: number;
      if (typeof result === "number") {
        reward = result;
        extra.add("acc", result);
      } else {
        reward = result.score;
        extra.addDict(result);
      }
      if (this.overlong) {
        const expected = this.maxRespLen! - this.overlong.len;
        const exceed = row.validResponseLength - expected;
        const penalty = Math.min((-exceed / this.overlong.len) * this.overlong.penaltyFactor, 0);
        reward += penalty;
        if (this.overlong.log) {
          extra.add("overlong_reward", penalty);
          extra.add("overlong", penalty < 0);
        }
      }
      placeScore(rewards, row.index, row.validResponseLength, reward, row.dataSource);
      examiner.show(tok, row, responseStr, result);
    }
    return { rewardTensor: rewards, rewardExtraInfo: extra.info };
  }
}
