// reward_model.{reward_loop_source,reward_loop_module_path,reward_loop_class_name}: a user's reward loop
// class, verl's experimental reward loop (reward_loop_source=importlib; used while
// reward_model.use_reward_loop is true, verl's default). As verl builds it, the class is constructed as
//   new Cls(config, tokenizer, computeScore, rewardRouterAddress, rewardModelTokenizer)
// (the whole config, the actor's tokenizer, the custom reward function or null, and, with a generative
// reward model served for the run, its address "127.0.0.1:<port>" and its tokenizer, else null) and its async run_single(data) (or runSingle) is called once per
// row with a one-row DataProto, all rows at once; it returns {reward_score, reward_extra_info?}. The score
// goes to the row's last valid response token; reward_extra_info's keys (those of the first row, as verl
// takes them) become per-row extra info.
//
// The class is user code, so it runs contained like custom reward functions: in scoring threads, one
// instance per thread, each row bounded by reward_model.reward_kwargs.timeout_s; a throw, a timeout or
// an exit fails the step with an error naming the class, its file and the row.
import { resolve } from "node:path";
import { getPath, type Config } from "../config/index.js";
import { DataProto, type DataProtoPayload } from "../protocol/index.js";
import { logger } from "../utils/logger.js";
import { ConfigView } from "../workers/config_view.js";
import { loadModelTokenizer } from "../workers/model_source.js";
import { LazyScoringPool } from "./contained.js";
import { ScoringPool } from "./scoring_pool.js";
import { loadCustomRewardFunction, loadExport } from "./custom.js";
import { placeScore, rewardFromRmScores, zeroRewards } from "./managers/common.js";
import { isPythonModule } from "./python_reward.js";
import type { ContainmentOptions } from "./timeout.js";
import { servedRewardModelKwargs, type ServedRewardModelRef } from "./served_reward_model.js";
import type { RewardManager, RewardResult } from "./types.js";

export interface RewardLoopSource {
  path: string;
  className: string;
  /** The composed config, handed to the class as verl hands it its DictConfig. */
  config: Config;
  /** The generative reward model served for the run (its address and tokenizer go to the constructor). */
  servedRewardModel?: ServedRewardModelRef;
}

export interface RewardLoopInstance {
  run(data: DataProto): Promise<unknown>;
}

const K = "reward_model";

/** The reward loop the config names, or null (reward_loop_source=register: the reward manager scores). */
export function rewardLoopSource(config: Config, servedRewardModel?: ServedRewardModelRef): RewardLoopSource | null {
  const source = getPath(config, `${K}.reward_loop_source`) ?? "register";
  if (source === "register") return null;
  if (source !== "importlib") throw new Error(`${K}.reward_loop_source must be "register" or "importlib", got ${JSON.stringify(source)}`);
  const path = getPath(config, `${K}.reward_loop_module_path`), className = getPath(config, `${K}.reward_loop_class_name`);
  if (typeof path !== "string" || path === "") throw new Error(`${K}.reward_loop_source=importlib needs ${K}.reward_loop_module_path (a .js/.mjs/.cjs/.ts/.mts/.cts file exporting the class)`);
  if (typeof className !== "string" || className === "") throw new Error(`${K}.reward_loop_source=importlib needs ${K}.reward_loop_class_name (the exported class)`);
  if (isPythonModule(path)) {
    throw new Error(
      `${K}.reward_loop_module_path=${path} is Python: a verl reward loop subclasses verl's RewardManagerBase and reads each row as verl's torch DataProto ` +
        "with a Hugging Face tokenizer, so it needs verl, torch and transformers in Python, which verl-ts does not run. Port the class to JS/TS " +
        "(async run_single(data) returning {reward_score, reward_extra_info}), or move its scoring into custom_reward_function.path (a .py reward function runs here)",
    );
  }
  if (getPath(config, `${K}.use_reward_loop`) === false) {
    logger().warn({ class: className, path }, `${K}.use_reward_loop=false: verl's legacy reward path does not read ${K}.reward_loop_*; the reward manager scores`);
    return null;
  }
  return { path: resolve(process.cwd(), path), className, config, ...(servedRewardModel ? { servedRewardModel } : {}) };
}

/** In a scoring thread: the class instance, built as verl's RewardLoopWorker builds it. */
export async function buildRewardLoop(src: RewardLoopSource): Promise<RewardLoopInstance> {
  const cls = await loadExport(src.path, src.className);
  const where = `reward loop ${src.className} (${src.path})`;
  if (typeof cls !== "function") throw new Error(`${where}: the export is a ${typeof cls}, not a class`);
  const tokenizer = await loadModelTokenizer(new ConfigView(src.config).at("actor_rollout_ref.model"));
  // verl hands the class the function as loaded; the class passes the served model's kwargs itself
  const custom = await loadCustomRewardFunction(src.config);
  const served = src.servedRewardModel ? await servedRewardModelKwargs(src.servedRewardModel) : null;
  let instance: Record<string, unknown>;
  try {
    instance = new (cls as new (...args: unknown[]) => Record<string, unknown>)(
      src.config, tokenizer, custom?.computeScore ?? null, served?.reward_router_address ?? null, served?.reward_model_tokenizer ?? null,
    );
  } catch (e) {
    throw new Error(`${where}: the constructor threw: ${(e as Error).message}`);
  }
  const method = instance.run_single ?? instance.runSingle;
  if (typeof method !== "function") throw new Error(`${where}: the class has no run_single(data) method (verl's RewardManagerBase.run_single)`);
  return { run: (data) => Promise.resolve((method as (d: DataProto) => unknown).call(instance, data)) };
}

/** In a scoring thread: run_single on one row, its answer checked and made plain. */
export async function runRewardLoopRow(loop: RewardLoopInstance, row: DataProtoPayload): Promise<{ reward_score: number; reward_extra_info: Record<string, unknown> }> {
  const out = await loop.run(DataProto.fromTransfer(row));
  if (typeof out !== "object" || out === null || Array.isArray(out)) throw new Error(`run_single returned ${JSON.stringify(out)}, not {reward_score, reward_extra_info}`);
  const o = out as Record<string, unknown>;
  const raw = o.reward_score;
  const score = typeof raw === "boolean" ? Number(raw) : raw;
  if (typeof score !== "number") throw new Error(`run_single returned reward_score ${JSON.stringify(raw)}, not a number`);
  const extra = o.reward_extra_info ?? {};
  if (typeof extra !== "object" || extra === null || Array.isArray(extra)) throw new Error(`run_single returned reward_extra_info ${JSON.stringify(extra)}, not a mapping`);
  return { reward_score: score, reward_extra_info: extra as Record<string, unknown> };
}

/** verl's RewardLoopManager.compute_rm_score over the user's class, as a verl-ts reward manager. */
export class RewardLoopRewardManager implements RewardManager {
  private readonly threads: LazyScoringPool;

  constructor(private readonly source: RewardLoopSource, private readonly opts: ContainmentOptions) {
    this.threads = new LazyScoringPool(null, opts, source);
  }

  async compute(data: DataProto): Promise<RewardResult> {
    const fromRm = rewardFromRmScores(data);
    if (fromRm) return fromRm;
    const where = `reward loop ${this.source.className} (${this.source.path})`;
    let got;
    try {
      got = await this.threads.get();
    } catch (e) {
      throw new Error(`${where}: ${(e as Error).message}`);
    }
    // custom is null here, so the pool is always a thread pool (never Python processes)
    if (!(got instanceof ScoringPool)) throw new Error(`${where}: expected scoring threads`);
    const pool = got;
    const outcomes = await Promise.all(Array.from({ length: data.length }, (_, i) => pool.runLoopRow(data.slice(i, i + 1).toTransfer().payload)));
    const ds = data.nonTensorBatch.data_source;
    const rowName = (i: number) => `row ${i}${ds?.[i] !== undefined ? ` (data_source ${JSON.stringify(ds[i])})` : ""}`;
    const results = outcomes.map((o, i) => {
      if (o.kind === "ok") return o.value as { reward_score: number; reward_extra_info: Record<string, unknown> };
      const why = o.kind === "timeout" ? `timed out after ${this.opts.timeoutS} s (reward_model.reward_kwargs.timeout_s)` : o.message;
      throw new Error(`${where} failed on ${rowName(i)}: ${why}`);
    });
    const rewards = zeroRewards(data);
    const mask = data.batch.attention_mask, prompts = data.batch.prompts;
    if (!mask || !prompts) throw new Error(`${where}: the batch needs prompts and attention_mask to place the scores`);
    const T = mask.shape[1]!, P = prompts.shape[1]!;
    results.forEach((r, i) => {
      let len = 0;
      for (let t = P; t < T; t++) len += Number(mask.data[i * T + t]);
      // verl writes rm_scores[i, valid_len - 1]: an empty response lands in the last slot
      placeScore(rewards, i, len, r.reward_score, ds?.[i] === undefined ? undefined : String(ds[i]));
    });
    const keys = results.length > 0 ? Object.keys(results[0]!.reward_extra_info) : [];
    const rewardExtraInfo: Record<string, unknown[]> = {};
    for (const k of keys) {
      rewardExtraInfo[k] = results.map((r, i) => {
        if (!(k in r.reward_extra_info)) throw new Error(`${where}: ${rowName(i)}'s reward_extra_info has no '${k}', which row 0's has (every row needs the same keys)`);
        return r.reward_extra_info[k];
      });
    }
    return { rewardTensor: rewards, rewardExtraInfo };
  }

  close(): Promise<void> {
    return this.threads.close();
  }
}
