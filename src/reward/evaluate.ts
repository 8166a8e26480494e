// Offline evaluation of generated responses (verl trainer.main_eval): each
// row's score is the mean over its responses, and test_score/<data_source> is
// the mean over that source's rows. Unlike verl, the built-in scorers apply
// when no custom reward function is given.
import { normalizeScore } from "./scorers/registry.js";
import type { ComputeScoreFn } from "./types.js";

export interface EvalColumns {
  responseKey: string;
  dataSourceKey: string;
  rewardModelKey: string;
}

export async function evaluateGenerations(
  rows: Record<string, unknown>[],
  cols: EvalColumns,
  computeScore: ComputeScoreFn,
): Promise<Record<string, number>> {
  const perSource = new Map<string, number[]>();
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i]!;
    const ds = row[cols.dataSourceKey];
    if (typeof ds !== "string") throw new Error(`row ${i}: column '${cols.dataSourceKey}' (data.data_source_key) must be a string, got ${JSON.stringify(ds)}`);
    const responses = row[cols.responseKey];
    if (!Array.isArray(responses) || responses.length === 0 || !responses.every((r) => typeof r === "string")) {
      throw new Error(`row ${i}: column '${cols.responseKey}' (data.response_key) must be a non-empty list of strings, got ${JSON.stringify(responses)?.slice(0, 120)}`);
    }
    const rm = row[cols.rewardModelKey];
    if (typeof rm !== "object" || rm === null || !("ground_truth" in rm)) {
      throw new Error(`row ${i}: column '${cols.rewardModelKey}' (data.reward_model_key) must hold {ground_truth: ...}, got ${JSON.stringify(rm)}`);
    }
    const groundTruth = (rm as Record<string, unknown>).ground_truth;
    const extra = typeof row.extra_info === "object" && row.extra_info !== null ? (row.extra_info as Record<string, unknown>) : null;
    let sum = 0;
    for (const r of responses as string[]) {
      const v = normalizeScore(await computeScore(ds, r, groundTruth, extra), `row ${i} (data_source "${ds}")`);
      sum += typeof v === "number" ? v : v.score;
    }
    let list = perSource.get(ds);
    if (!list) perSource.set(ds, (list = []));
    list.push(sum / responses.length);
  }
  const metrics: Record<string, number> = {};
  for (const ds of [...perSource.keys()].sort()) {
    const xs = perSource.get(ds)!;
    metrics[`test_score/${ds}`] = xs.reduce((a, b) => a + b, 0) / xs.length;
  }
  return metrics;
}
