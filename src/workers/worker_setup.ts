// What every worker does first in its thread: pick the tensor backend once,
// import the user's extension module, and read the settings all roles share.
import { validatePpoConfig, type Config, type PpoBatchPlan } from "../config/index.js";
import { initBackend, releaseBackend } from "../engine/backend.js";
import { onThreadClose } from "../single_controller/index.js";
import { trackPeakTensorBytes } from "../utils/perf_metrics.js";
import type { MicroBatchSpec } from "./batching.js";
import { ConfigView } from "./config_view.js";
import { importExternalLib } from "./model_source.js";

export interface WorkerCommon {
  cfg: ConfigView;
  plan: PpoBatchPlan;
  seed: number;
  backend: string;
}

/**
 * The rank thread's backend. Every WebGPU rank thread creates its own Dawn device and destroys it
 * when the pool shuts down (onThreadClose -> releaseBackend), before the pool stops the thread.
 */
export async function initWorkerBackend(device: string): Promise<string> {
  const name = await initBackend(device);
  if (name === "webgpu") onThreadClose(releaseBackend);
  // from here on, so perf/max_memory_allocated_gb covers loading the model too (torch's peak counts from the start)
  trackPeakTensorBytes();
  return name;
}

/** Backend, extension modules, batch plan. Called by each worker's initModel. */
export async function setupWorker(config: Config, externalLibKeys: string[]): Promise<WorkerCommon> {
  const cfg = new ConfigView(config);
  const backend = await initWorkerBackend(cfg.str("trainer.device", "auto"));
  for (const key of externalLibKeys) await importExternalLib(cfg.optStr(key), key);
  return { cfg, plan: validatePpoConfig(config), seed: cfg.int("trainer.seed", 42), backend };
}

/**
 * Micro-batching for a no-grad pass from a section's `log_prob_*` keys (rollout, ref)
 * or the given prefix: dynamic token budget, per-rank size, or a global size split over ranks.
 */
export function inferenceSpec(section: ConfigView, prefix: string, dynamicKey: string, maxTokenKey: string, world: number): MicroBatchSpec {
  if (section.bool(dynamicKey, false)) return { microBatchSize: null, maxTokenLen: section.int(maxTokenKey) };
  const perRank = section.optInt(`${prefix}micro_batch_size_per_gpu`);
  if (perRank !== null) return { microBatchSize: perRank, maxTokenLen: null };
  const global = section.optInt(`${prefix}micro_batch_size`);
  if (global !== null) return { microBatchSize: Math.max(1, Math.floor(global / world)), maxTokenLen: null };
  throw new Error(`set ${section.key(`${prefix}micro_batch_size_per_gpu`)} (rows per forward pass) or ${section.key(dynamicKey)}=true`);
}

/**
 * The token count of each sequence of the whole batch (meta_info.global_token_num, set by the
 * PPO driver before the batch is split over ranks): what verl's MFU is counted from. Undefined
 * when a caller that is not the driver (a test, a benchmark) sent none: the MFU is then left out.
 */
export function globalTokenNum(data: { metaInfo: Record<string, unknown> }): number[] | undefined {
  const v = data.metaInfo.global_token_num;
  if (v === undefined) return undefined;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "number" && Number.isFinite(x) && x >= 0)) {
    throw new Error("meta_info.global_token_num must list the token count of each sequence of the whole batch");
  }
  return v as number[];
}
