// Rows -> DataProto. Prompt token ids become left-padded tensors of width
// maxPromptLength (input_ids, attention_mask, position_ids), as verl's
// postprocess_data + compute_position_id_with_mask make them; every other
// field becomes a non-tensor column.
import { DataProto } from "../protocol/data_proto.js";
import { tensor } from "../protocol/tensor.js";
import type { Truncation } from "./data_config.js";

export interface CollateOptions {
  maxPromptLength: number;
  padTokenId: number;
  truncation?: Truncation;
}

/** Cut ids to maxLength the way verl's truncation modes do; "error" throws naming `where`. */
export function truncateIds(ids: number[], maxLength: number, truncation: Truncation, where: string): number[] {
  if (ids.length <= maxLength) return ids;
  switch (truncation) {
    case "left": return ids.slice(ids.length - maxLength);
    case "right": return ids.slice(0, maxLength);
    case "middle": {
      const left = Math.floor(maxLength / 2), right = maxLength - left;
      return [...ids.slice(0, left), ...(right > 0 ? ids.slice(ids.length - right) : [])];
    }
    case "error":
      throw new Error(`${where}: prompt is ${ids.length} tokens, longer than data.max_prompt_length=${maxLength} (set data.truncation to left/right/middle, or data.filter_overlong_prompts=true)`);
  }
}

function rowName(row: Record<string, unknown>, i: number): string {
  return typeof row.index === "number" ? `batch row ${i} (index ${row.index})` : `batch row ${i}`;
}

export function collateToDataProto(rows: Record<string, unknown>[], opts: CollateOptions): DataProto {
  const { maxPromptLength: P, padTokenId, truncation = "error" } = opts;
  const keys: string[] = [];
  const seen = new Set<string>();
  for (const r of rows) for (const k of Object.keys(r)) if (!seen.has(k) && k !== "input_ids") { seen.add(k); keys.push(k); }
  const nonTensor: Record<string, unknown[]> = {};
  for (const k of keys) nonTensor[k] = rows.map((r) => (k in r ? r[k] : null));

  const withIds = rows.filter((r) => r.input_ids !== undefined).length;
  if (withIds === 0) return new DataProto({}, nonTensor);
  if (withIds !== rows.length) throw new Error("collate: some rows have input_ids and some do not");

  const B = rows.length;
  const ids = new Int32Array(B * P).fill(padTokenId);
  const mask = new Int32Array(B * P);
  const pos = new Int32Array(B * P);
  rows.forEach((r, i) => {
    const raw = r.input_ids;
    if (!Array.isArray(raw) && !(raw instanceof Int32Array)) throw new Error(`collate: ${rowName(r, i)}: input_ids must be an array of token ids`);
    const t = truncateIds(Array.from(raw as ArrayLike<number>), P, truncation, rowName(r, i));
    const start = i * P + (P - t.length);
    for (let j = 0; j < t.length; j++) {
      ids[start + j] = t[j]!;
      mask[start + j] = 1;
      pos[start + j] = j;
    }
  });
  return new DataProto(
    { input_ids: tensor(ids, [B, P]), attention_mask: tensor(mask, [B, P]), position_ids: tensor(pos, [B, P]) },
    nonTensor,
  );
}
