// verl's own reward code, in Python: custom_reward_function.path=*.py (or
// pkg://module) runs `name` (default compute_score) in a persistent python3
// process. Called with keywords as verl calls it:
//   compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)
//   (batch manager) compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=, **kwargs)
// with custom_reward_function.reward_kwargs winning over the rest, as in verl.
// A Python exception fails the call with the file, function, sample and
// traceback; a call past reward_model.reward_kwargs.timeout_s (loading the module
// included) kills the process and fails the same way (the prime manager scores
// those 0 and counts them, as it does JS failures).
import type { BatchComputeScoreFn, ComputeScoreFn, RewardFnSource } from "./types.js";
import { PythonRewardProcess } from "./python_process.js";

export function isPythonModule(path: string): boolean {
  return path.startsWith("pkg://") || /\.py$/i.test(path);
}

/** reward_model.reward_kwargs.timeout_s is the one limit; the environment variable of earlier versions is refused, not ignored. */
export function refuseTimeoutEnv(env: NodeJS.ProcessEnv = process.env): void {
  if (env.VERL_PYTHON_REWARD_TIMEOUT_S !== undefined && env.VERL_PYTHON_REWARD_TIMEOUT_S !== "") {
    throw new Error(
      `VERL_PYTHON_REWARD_TIMEOUT_S is no longer read: set reward_model.reward_kwargs.timeout_s (seconds per call, every manager; ` +
        `+reward_model.reward_kwargs.timeout_s=${env.VERL_PYTHON_REWARD_TIMEOUT_S}) and unset the variable`,
    );
  }
}

export function singleKwargs(
  source: RewardFnSource, dataSource: string, solutionStr: string, groundTruth: unknown,
  extraInfo: Record<string, unknown> | null | undefined, callKwargs?: Record<string, unknown>,
): Record<string, unknown> {
  return { data_source: dataSource, solution_str: solutionStr, ground_truth: groundTruth ?? null, extra_info: extraInfo ?? null, ...callKwargs, ...source.kwargs };
}

/** How errors name a sample. */
export function describeSample(dataSource: string, solutionStr: string, groundTruth: unknown): string {
  const sol = solutionStr.length > 80 ? `${solutionStr.slice(0, 80)}...` : solutionStr;
  return `the sample with data_source "${dataSource}", ground_truth ${JSON.stringify(groundTruth ?? null)}, solution ${JSON.stringify(sol)}`;
}

export interface PythonRewardFunction {
  computeScore: ComputeScoreFn;
  computeBatch: BatchComputeScoreFn;
  process: PythonRewardProcess;
}

/** Start the process and load the module now, so a bad path or an import error stops the run before any work. */
export async function loadPythonRewardFunction(source: RewardFnSource, timeoutMs: number): Promise<PythonRewardFunction> {
  refuseTimeoutEnv();
  const proc = new PythonRewardProcess({ module: source.path, fn: source.name, timeoutMs, key: "custom_reward_function.path" });
  await proc.start();
  return {
    process: proc,
    computeScore: (ds, sol, gt, extra, kw) => proc.call(singleKwargs(source, ds, sol, gt, extra, kw), describeSample(ds, sol, gt)),
    computeBatch: (dss, sols, gts, extras, kw) => proc.call(
      { data_sources: dss, solution_strs: sols, ground_truths: gts, extra_infos: extras, ...kw, ...source.kwargs },
      `a batch of ${dss.length} samples`,
    ),
  };
}
