// Rule-based scorers chosen by data_source, as verl's default_compute_score.
// Users add theirs with registerScorer; a scorer registered with `module`
// (its file URL) can also be loaded by the prime manager's worker threads.
import type { ScoreValue, ScorerFn, MaybePromise } from "../types.js";
import { gsm8kComputeScore } from "./gsm8k.js";
import { mathComputeScore } from "./math.js";

interface Entry {
  fn: ScorerFn;
  builtin: boolean;
  module?: string;
}

const scorers = new Map<string, Entry>();

export interface RegisterScorerOptions {
  /** The file URL of the module that registers this scorer (pass `import.meta.url`), so worker threads can import it. */
  module?: string;
}

export function registerScorer(dataSource: string, fn: ScorerFn, opts: RegisterScorerOptions = {}): void {
  if (typeof dataSource !== "string" || dataSource.length === 0) throw new Error("registerScorer: data_source must be a non-empty string");
  if (typeof fn !== "function") throw new Error(`registerScorer("${dataSource}"): the scorer must be a function`);
  const existing = scorers.get(dataSource);
  if (existing && existing.fn !== fn) {
    throw new Error(`registerScorer: data_source "${dataSource}" already has a${existing.builtin ? " built-in" : ""} scorer; pick another name`);
  }
  scorers.set(dataSource, { fn, builtin: existing?.builtin ?? false, module: opts.module ?? existing?.module });
}

export function knownDataSources(): string[] {
  return [...scorers.keys()].sort();
}

/** Modules that registered scorers (for worker threads to import) and data sources a worker cannot reach. */
export function scorerModules(): { modules: string[]; unreachable: string[] } {
  const modules = new Set<string>(), unreachable: string[] = [];
  for (const [ds, e] of scorers) {
    if (e.builtin) continue;
    if (e.module) modules.add(e.module);
    else unreachable.push(ds);
  }
  return { modules: [...modules], unreachable };
}

export function getScorer(dataSource: string): ScorerFn {
  const e = scorers.get(dataSource);
  if (!e) {
    throw new Error(
      `Reward function is not implemented for data_source="${dataSource}". Known data sources: ${knownDataSources().join(", ")}. ` +
        `Register one with registerScorer("${dataSource}", (solutionStr, groundTruth, extraInfo) => score) from "verl-ts", ` +
        `or set custom_reward_function.path to a module exporting compute_score (see docs/rewards.md).`,
    );
  }
  return e.fn;
}

/** verl's result coercion: dicts pass through (need a numeric `score`), numbers and booleans become numbers, lists give their first item. */
export function normalizeScore(value: unknown, where: string): number | { score: number; [k: string]: unknown } {
  if (typeof value === "number") return value;
  if (typeof value === "boolean") return value ? 1 : 0;
  if (Array.isArray(value)) {
    throw new Error(`${where}: a list (${JSON.stringify(value).slice(0, 80)}) is not a score: return one number, a bool or {score, ...} per sample (a list is the batch manager's return)`);
  }
  if (typeof value === "object" && value !== null) {
    const score = (value as Record<string, unknown>).score;
    const n = typeof score === "boolean" ? (score ? 1 : 0) : score;
    if (typeof n !== "number") throw new Error(`${where}: a dict result needs a numeric 'score' field, got ${JSON.stringify(value)}`);
    return { ...(value as Record<string, unknown>), score: n };
  }
  throw new Error(`${where}: expected a number, boolean or {score, ...}, got ${value === undefined ? "undefined" : JSON.stringify(value)}`);
}

/** A built-in rule scorer compares against the ground truth: without one it would score 0 whatever the response. */
function noGroundTruth(dataSource: string, extraInfo?: Record<string, unknown> | null): Error {
  const index = extraInfo?.index, split = extraInfo?.split;
  const row = index === undefined ? "" : ` (extra_info.index ${JSON.stringify(index)}${typeof split === "string" ? `, split ${split}` : ""})`;
  return new Error(
    `reward: a data_source "${dataSource}" row${row} has a null reward_model.ground_truth, and the built-in scorer cannot score without one `
      + "(it would give 0 whatever the response): fill in the row's ground truth, drop the row, or score with custom_reward_function.path",
  );
}

export function defaultComputeScore(
  dataSource: string,
  solutionStr: string,
  groundTruth: unknown,
  extraInfo?: Record<string, unknown> | null,
): MaybePromise<ScoreValue> {
  if ((groundTruth === null || groundTruth === undefined) && scorers.get(dataSource)?.builtin) throw noGroundTruth(dataSource, extraInfo);
  const out = getScorer(dataSource)(solutionStr, groundTruth, extraInfo ?? null);
  const where = `scorer for data_source "${dataSource}"`;
  return out instanceof Promise ? out.then((v) => normalizeScore(v, where)) : normalizeScore(out, where);
}

function registerBuiltin(dataSource: string, fn: ScorerFn): void {
  scorers.set(dataSource, { fn, builtin: true });
}

registerBuiltin("openai/gsm8k", (s, gt) => gsm8kComputeScore(s, gt));
for (const ds of ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]) {
  registerBuiltin(ds, (s, gt) => mathComputeScore(s, gt));
}
