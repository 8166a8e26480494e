// custom_reward_function.{path,name,reward_kwargs}: load a user's scoring
// function from a .js/.mjs/.cjs file, a .ts/.mts/.cts file through tsx, or a
// verl Python file (.py or pkg://module) run in a python3 process (python_reward.ts).
//
// Calling convention (JS has no keyword arguments): the function is called
// positionally as compute_score(dataSource, solutionStr, groundTruth, extraInfo, kwargs),
// where kwargs is an object holding reward_kwargs (verl merges them as
// keyword arguments, reward_kwargs winning) and, with a generative reward model
// served for the run, reward_router_address and reward_model_tokenizer (as verl's
// reward loop passes them). It may be sync or async and may return a number, a
// boolean or {score, ...extra}.
import { existsSync } from "node:fs";
import { extname, isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { getPath, type Config } from "../config/index.js";
import type { BatchComputeScoreFn, ComputeScoreFn, RewardFnSource } from "./types.js";
import { isPythonModule, loadPythonRewardFunction } from "./python_reward.js";
import { DEFAULT_REWARD_TIMEOUT_S, rewardTimeoutFromConfig } from "./timeout.js";
import { servedRewardModelKwargs, type ServedRewardModelRef } from "./served_reward_model.js";

const JS_EXT = new Set([".js", ".mjs", ".cjs"]);
const TS_EXT = new Set([".ts", ".mts", ".cts"]);

/** Import a module's namespace from a file path (TypeScript through tsx's tsImport). */
export async function importUserModule(path: string, what = "reward module", key = "custom_reward_function.path"): Promise<Record<string, unknown>> {
  const abs = isAbsolute(path) ? path : resolve(process.cwd(), path);
  if (!existsSync(abs)) throw new Error(`${what} ${abs} does not exist (${key}=${path})`);
  const ext = extname(abs).toLowerCase();
  const url = pathToFileURL(abs).href;
  try {
    if (JS_EXT.has(ext)) return (await import(url)) as Record<string, unknown>;
    if (TS_EXT.has(ext)) {
      const { tsImport } = await import("tsx/esm/api");
      return (await tsImport(url, import.meta.url)) as Record<string, unknown>;
    }
  } catch (e) {
    throw new Error(`cannot load ${what} ${abs}: ${(e as Error).message}`);
  }
  if (ext === ".py") throw new Error(`module ${abs} is Python: verl-ts runs Python reward functions (custom_reward_function.path), but classes and other extensions must be .js or .ts`);
  throw new Error(`${what} ${abs}: unsupported extension '${ext}' (use .js, .mjs, .cjs, .ts, .mts, .cts or, for a reward function, .py)`);
}

/** The named export (or a property of the default export, for CommonJS modules). */
export async function loadExport(path: string, name: string, what = "reward module", key = "custom_reward_function.path"): Promise<unknown> {
  const mod = await importUserModule(path, what, key);
  const direct = mod[name];
  if (direct !== undefined) return direct;
  const def = mod.default;
  if (typeof def === "object" && def !== null && (def as Record<string, unknown>)[name] !== undefined) return (def as Record<string, unknown>)[name];
  const names = [...Object.keys(mod), ...(typeof def === "object" && def !== null ? Object.keys(def).map((k) => `default.${k}`) : [])];
  throw new Error(`${what} ${path} has no export '${name}' (exports: ${names.join(", ") || "none"})`);
}

export interface CustomRewardFunction {
  source: RewardFnSource;
  /** The function as exported (for Python: the per-sample call). */
  raw: (...args: unknown[]) => unknown;
  /** Per-sample form with reward_kwargs appended. */
  computeScore: ComputeScoreFn;
  /** Batch form (batch manager) with reward_kwargs appended. */
  computeBatch: BatchComputeScoreFn;
}

export function asRecord(v: unknown, where: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== "object" || Array.isArray(v)) throw new Error(`${where} must be a mapping, got ${JSON.stringify(v)}`);
  return { ...(v as Record<string, unknown>) };
}

/** Wrap an already-loaded function (e.g. in a worker thread) with its kwargs; `served` are the served reward model's. */
export function bindRewardFunction(raw: unknown, source: RewardFnSource, served: Record<string, unknown> = {}): CustomRewardFunction {
  if (typeof raw !== "function") {
    throw new Error(`reward module ${source.path}: export '${source.name}' is a ${typeof raw}, not a function`);
  }
  const fn = raw as (...args: unknown[]) => unknown;
  const merged = (callKwargs?: Record<string, unknown>) => ({ ...(callKwargs ?? {}), ...served, ...source.kwargs });
  return {
    source,
    raw: fn,
    computeScore: (ds, sol, gt, extra, kw) => fn(ds, sol, gt, extra ?? null, merged(kw)),
    computeBatch: (dss, sols, gts, extras, kw) => fn(dss, sols, gts, extras, merged(kw)),
  };
}

/** `timeoutMs` bounds each Python call and the module's import (reward_model.reward_kwargs.timeout_s). */
export async function loadRewardFunction(source: RewardFnSource, timeoutMs = DEFAULT_REWARD_TIMEOUT_S.default * 1000): Promise<CustomRewardFunction> {
  if (isPythonModule(source.path)) {
    // validatePpoConfig refuses this pairing first, with the reason
    if (source.servedRewardModel) throw new Error(`reward module ${source.path}: a Python function cannot receive the served reward model's tokenizer; write it in JS/TS`);
    const py = await loadPythonRewardFunction(source, timeoutMs);
    return { source, raw: py.computeScore as (...args: unknown[]) => unknown, computeScore: py.computeScore, computeBatch: py.computeBatch };
  }
  const served = source.servedRewardModel ? await servedRewardModelKwargs(source.servedRewardModel) : {};
  return bindRewardFunction(await loadExport(source.path, source.name), source, served);
}

/**
 * The custom reward function from `custom_reward_function`, or null when no path is set (built-in scorers apply).
 * `served`: the generative reward model served for the run, whose address and tokenizer each call gets.
 */
export async function loadCustomRewardFunction(config: Config, served?: ServedRewardModelRef): Promise<CustomRewardFunction | null> {
  const path = getPath(config, "custom_reward_function.path");
  if (path === undefined || path === null || path === "") return null;
  if (typeof path !== "string") throw new Error(`custom_reward_function.path must be a string, got ${JSON.stringify(path)}`);
  const name = getPath(config, "custom_reward_function.name") ?? "compute_score";
  if (typeof name !== "string" || name === "") throw new Error(`custom_reward_function.name must be a non-empty string, got ${JSON.stringify(name)}`);
  const kwargs = asRecord(getPath(config, "custom_reward_function.reward_kwargs"), "custom_reward_function.reward_kwargs");
  const source: RewardFnSource = { path: path.startsWith("pkg://") ? path : resolve(process.cwd(), path), name, kwargs, ...(served ? { servedRewardModel: served } : {}) };
  return loadRewardFunction(source, rewardTimeoutFromConfig(config) * 1000);
}
