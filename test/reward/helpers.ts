// Builds reward-manager inputs the way rollout leaves them: prompts left-padded,
// responses right-padded, attention_mask over both.
import { DataProto } from "../../src/protocol/data_proto.js";
import { tensor } from "../../src/protocol/tensor.js";
import type { Tokenizer } from "../../src/models/tokenizer.js";

export interface RowSpec {
  prompt: string;
  response: string;
  dataSource: string;
  groundTruth?: unknown;
  extraInfo?: Record<string, unknown>;
}

export function makeBatch(tok: Tokenizer, rows: RowSpec[], P: number, R: number): DataProto {
  const B = rows.length;
  const prompts = new Int32Array(B * P).fill(tok.padTokenId);
  const responses = new Int32Array(B * R).fill(tok.padTokenId);
  const mask = new Int32Array(B * (P + R));
  const respMask = new Int32Array(B * R);
  rows.forEach((r, i) => {
    const p = tok.encode(r.prompt, { addSpecialTokens: false });
    const s = tok.encode(r.response, { addSpecialTokens: false });
    if (p.length > P || s.length > R) throw new Error(`row ${i} does not fit P=${P} R=${R}`);
    p.forEach((id, j) => { prompts[i * P + P - p.length + j] = id; mask[i * (P + R) + P - p.length + j] = 1; });
    s.forEach((id, j) => { responses[i * R + j] = id; mask[i * (P + R) + P + j] = 1; respMask[i * R + j] = 1; });
  });
  return DataProto.fromDict(
    { prompts: tensor(prompts, [B, P]), responses: tensor(responses, [B, R]), attention_mask: tensor(mask, [B, P + R]), response_mask: tensor(respMask, [B, R]) },
    {
      data_source: rows.map((r) => r.dataSource),
      reward_model: rows.map((r) => ({ style: "rule", ground_truth: r.groundTruth })),
      extra_info: rows.map((r) => r.extraInfo ?? { index: 0 }),
    },
  );
}

/** Column index of the single non-zero reward per row (or -1). */
export function rewardPositions(t: { data: ArrayLike<number>; shape: number[] }): number[] {
  const [B, R] = t.shape as [number, number];
  return Array.from({ length: B }, (_, i) => {
    for (let j = 0; j < R; j++) if (t.data[i * R + j] !== 0) return j;
    return -1;
  });
}

export function rowSums(t: { data: ArrayLike<number>; shape: number[] }): number[] {
  const [B, R] = t.shape as [number, number];
  return Array.from({ length: B }, (_, i) => {
    let s = 0;
    for (let j = 0; j < R; j++) s += t.data[i * R + j]!;
    return s;
  });
}
