// What every reward manager shares: reading the batch (valid prompt and
// response ids per row, data source, ground truth, extra info), placing a
// score at the last valid response token, rm_scores precedence and the
// num_examine sample printing.
import type { DataProto } from "../../protocol/data_proto.js";
import { rowSize, type TensorData } from "../../protocol/tensor.js";
import type { Tokenizer } from "../../models/tokenizer.js";
import { logger } from "../../utils/logger.js";
import type { RewardResult } from "../types.js";

export interface RewardRow {
  index: number;
  promptIds: ArrayLike<number>;
  responseIds: ArrayLike<number>;
  validResponseLength: number;
  dataSource: string;
  groundTruth: unknown;
  extraInfo: Record<string, unknown>;
}

function need(data: DataProto, key: string): TensorData {
  const t = data.batch[key];
  if (!t) throw new Error(`reward: the batch has no '${key}' (has: ${Object.keys(data.batch).join(", ") || "none"})`);
  return t;
}

/** Rows as verl's managers read them: prompts left-padded, responses right-padded, lengths from attention_mask. */
export function readRows(data: DataProto, rewardFnKey: string): RewardRow[] {
  const prompts = need(data, "prompts"), responses = need(data, "responses"), mask = need(data, "attention_mask");
  const P = rowSize(prompts), R = rowSize(responses), T = rowSize(mask);
  if (T !== P + R) throw new Error(`reward: attention_mask has ${T} columns but prompts (${P}) + responses (${R}) = ${P + R}`);
  const sources = data.nonTensorBatch[rewardFnKey];
  if (!sources) {
    throw new Error(`reward: no non-tensor '${rewardFnKey}' (data.reward_fn_key) in the batch (has: ${Object.keys(data.nonTensorBatch).join(", ") || "none"})`);
  }
  const rm = data.nonTensorBatch.reward_model;
  const extras = data.nonTensorBatch.extra_info;
  const turns = data.nonTensorBatch.__num_turns__;
  const rolloutScores = data.nonTensorBatch.reward_scores;
  const rows: RewardRow[] = [];
  for (let i = 0; i < data.length; i++) {
    let validPrompt = 0, validResponse = 0;
    for (let j = 0; j < P; j++) validPrompt += mask.data[i * T + j]!;
    for (let j = P; j < T; j++) validResponse += mask.data[i * T + j]!;
    const ds = sources[i];
    if (typeof ds !== "string") throw new Error(`reward: row ${i}: '${rewardFnKey}' must be a string, got ${JSON.stringify(ds)}`);
    const rmInfo = rm?.[i];
    const groundTruth = typeof rmInfo === "object" && rmInfo !== null ? (rmInfo as Record<string, unknown>).ground_truth : undefined;
    const extra = extras?.[i];
    rows.push({
      index: i,
      promptIds: prompts.data.subarray(i * P + P - validPrompt, (i + 1) * P),
      responseIds: responses.data.subarray(i * R, i * R + validResponse),
      validResponseLength: validResponse,
      dataSource: ds,
      groundTruth,
      // A fresh object per call: verl adds these keys to extra_info in place.
      extraInfo: {
        ...(typeof extra === "object" && extra !== null ? (extra as Record<string, unknown>) : {}),
        num_turns: turns?.[i] ?? null,
        rollout_reward_scores: rolloutScores?.[i] ?? {},
      },
    });
  }
  return rows;
}

/** Rows plus their responses decoded without special tokens. */
export function readDecodedRows(data: DataProto, tokenizer: Tokenizer, rewardFnKey: string): { rows: RewardRow[]; responses: string[] } {
  const rows = readRows(data, rewardFnKey);
  return { rows, responses: rows.map((r) => tokenizer.decode(r.responseIds, { skipSpecialTokens: true })) };
}

export function requireGroundTruth(row: RewardRow): unknown {
  if (row.groundTruth === undefined) {
    throw new Error(`reward: row ${row.index} (data_source "${row.dataSource}") has no reward_model.ground_truth`);
  }
  return row.groundTruth;
}

/** A zero [B, R] float32 tensor shaped like responses. */
export function zeroRewards(data: DataProto): TensorData {
  const r = need(data, "responses");
  return { data: new Float32Array(r.data.length), shape: [...r.shape], dtype: "float32" };
}

const FLOAT32_MAX = 3.4028234663852886e38;

/** verl writes reward_tensor[i, valid_len - 1]; with valid_len 0 that is index -1, the last slot. Kept as is. */
export function placeScore(rewards: TensorData, row: number, validLength: number, score: number, dataSource?: string): void {
  // NaN and infinity go in as verl puts them (the trainer counts them); a finite score past float32 would turn into one
  if (Number.isFinite(score) && Math.abs(score) > FLOAT32_MAX) {
    throw new Error(
      `reward: row ${row}${dataSource === undefined ? "" : ` (data_source "${dataSource}")`}: reward ${score} is finite but beyond float32's range (±3.4e38), ` +
        "the reward tensor's type (it would be stored as infinity): scale the reward function's scores down",
    );
  }
  const R = rowSize(rewards);
  const col = validLength > 0 ? validLength - 1 : R - 1;
  rewards.data[row * R + col] = score;
}

/** verl's _extract_reward_from_rm_scores: a model-based score already in the batch wins. */
export function rewardFromRmScores(data: DataProto): RewardResult | null {
  const rm = data.batch.rm_scores;
  if (!rm) return null;
  const keys = data.metaInfo.reward_extra_keys;
  const extra: Record<string, unknown[]> = {};
  if (Array.isArray(keys)) {
    for (const k of keys) {
      const v = data.nonTensorBatch[String(k)];
      if (!v) throw new Error(`reward: meta_info.reward_extra_keys names '${String(k)}' but the batch has no such non-tensor key`);
      extra[String(k)] = v;
    }
  }
  return { rewardTensor: rm, rewardExtraInfo: extra };
}

/** Prints up to numExamine samples per data source per call, through the logger. */
export class SampleExaminer {
  private readonly printed = new Map<string, number>();
  constructor(private readonly numExamine: number) {}

  wants(dataSource: string): boolean {
    return (this.printed.get(dataSource) ?? 0) < this.numExamine;
  }

  show(tokenizer: Tokenizer, row: RewardRow, responseStr: string, score: unknown): void {
    if (!this.wants(row.dataSource)) return;
    this.printed.set(row.dataSource, (this.printed.get(row.dataSource) ?? 0) + 1);
    const prompt = tokenizer.decode(row.promptIds, { skipSpecialTokens: true });
    logger().info({ data_source: row.dataSource, prompt, response: responseStr, ground_truth: row.groundTruth, score }, "reward sample");
  }
}

/** Collects dict results into reward_extra_info (every key of every dict, as verl). */
export class ExtraInfo {
  readonly info: Record<string, unknown[]> = {};
  add(key: string, value: unknown): void {
    (this.info[key] ??= []).push(value);
  }
  addDict(d: Record<string, unknown>): void {
    for (const [k, v] of Object.entries(d)) this.add(k, v);
  }
}

/** How errors name the reward function: the user's file when there is one. */
export function scoreFnLabel(source: { name: string; path: string } | undefined): string {
  return source ? `${source.name} in ${source.path}` : "compute_score";
}

export function float32Column(values: number[]): TensorData {
  return { data: Float32Array.from(values), shape: [values.length], dtype: "float32" };
}
