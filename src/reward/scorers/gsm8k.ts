// GSM8K answer matching with verl's rules (verl/utils/reward_score/gsm8k.py):
// only the last 300 characters are searched; "strict" wants "#### <number>"
// and takes the last one (commas and "$" removed); "flexible" takes the last
// number-like run that is not "" or "." (commas kept). The answer must equal
// the ground truth string exactly: no numeric normalisation ("72." != "72").

export const SOLUTION_CLIP_CHARS = 300;

export type Gsm8kMethod = "strict" | "flexible";

/** Python's s[-n:] counts code points, not UTF-16 units. */
function lastCodePoints(s: string, n: number): string {
  if (s.length <= n) return s;
  const cps = Array.from(s);
  return cps.length > n ? cps.slice(-n).join("") : s;
}

export function extractGsm8kSolution(solutionStr: string, method: Gsm8kMethod = "strict"): string | null {
  if (method !== "strict" && method !== "flexible") throw new Error(`gsm8k: method must be "strict" or "flexible", got ${JSON.stringify(method)}`);
  const text = lastCodePoints(solutionStr, SOLUTION_CLIP_CHARS);
  if (method === "strict") {
    const found = [...text.matchAll(/#### (-?[0-9.,]+)/g)].map((m) => m[1]!);
    if (found.length === 0) return null;
    return found[found.length - 1]!.replaceAll(",", "").replaceAll("$", "");
  }
  const found = [...text.matchAll(/(-?[0-9.,]+)/g)].map((m) => m[1]!);
  if (found.length === 0) return null;
  // As verl's loop: the last candidate that is not "" or "."; if none is, the loop ends on the first.
  for (let i = found.length - 1; i >= 0; i--) if (found[i] !== "" && found[i] !== ".") return found[i]!;
  return found[0]!;
}

export interface Gsm8kScoreOptions {
  method?: Gsm8kMethod;
  formatScore?: number;
  score?: number;
}

/**
 * 1.0 (score) when the extracted answer equals the ground truth, format_score (0) when an answer
 * was found but differs, 0 when none was found. A numeric ground truth is compared as its string
 * (verl would always score 0 there).
 */
export function gsm8kComputeScore(solutionStr: string, groundTruth: unknown, opts: Gsm8kScoreOptions = {}): number {
  const answer = extractGsm8kSolution(solutionStr, opts.method ?? "strict");
  if (answer === null) return 0;
  const truth = typeof groundTruth === "string" ? groundTruth : String(groundTruth);
  return answer === truth ? (opts.score ?? 1.0) : (opts.formatScore ?? 0.0);
}
