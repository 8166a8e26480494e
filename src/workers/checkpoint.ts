// A worker role's part of a checkpoint, in `global_step_N/<role>/`:
//   model.safetensors                       weights by Hugging Face name (rank 0; replicas are identical)
//   optim.safetensors                       AdamW moments + step (rank 0; identical after the all-reduce)
//   optim_world_size_K_rank_S.safetensors   instead, with the optimizer sharded over K ranks (ZeRO-1): shard S's
//                                           slice of the moments, written by rank S (a replica of a hybrid shard writes none)
//   extra_state_world_size_W_rank_R.json    LR scheduler step and this rank's RNG states
//   checkpoint_meta.json                    world size and format
//   huggingface/                            a transformers-loadable export (actor only, rank 0; merged under LoRA)
//   lora_adapter/                           under LoRA: the adapter in peft's layout (rank 0)
// Under LoRA model.safetensors and optim.safetensors hold the adapter only (the base is frozen).
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { requireFiniteWeights } from "../models/finite.js";
import { readSafetensors, saveHfModel, serializeSafetensors, type LlamaModel, type NamedArray, type Tokenizer } from "../models/index.js";
import { heartbeat } from "../single_controller/heartbeat.js";
import { saveLoraAdapter } from "../models/peft.js";
import { logger } from "../utils/logger.js";
import { readCheckpointJson, writeFileAtomic } from "../utils/fs.js";
import type { Rng, RngState } from "../utils/rng.js";
import { shardBounds } from "../engine/optim/grad_utils.js";
import type { AdamWState } from "../engine/optim/adamw.js";
import type { DataParallelOptimizer } from "./dp_optimizer.js";

export const CHECKPOINT_FORMAT = "verl-ts-dp-1";

export interface SaveOptions {
  /** Also write the Hugging Face export (default true for roles that offer one). */
  hfExport?: boolean;
}

export interface RoleCheckpointParts {
  rank: number;
  worldSize: number;
  params: Map<string, tf.Variable>;
  optimizer: DataParallelOptimizer;
  rngs: Record<string, Rng>;
  /** Present for the actor: what the Hugging Face export needs. */
  hf?: { model: LlamaModel; tokenizer: Tokenizer };
}

interface ExtraState {
  lr_scheduler: { step: number };
  rng: Record<string, RngState>;
}

const extraName = (world: number, rank: number) => `extra_state_world_size_${world}_rank_${rank}.json`;
const shardName = (shards: number, shard: number) => `optim_world_size_${shards}_rank_${shard}.safetensors`;

interface CheckpointMeta {
  format?: string;
  world_size?: number;
  /** Ranks the optimizer state was sharded over (absent: 1, one optim.safetensors). */
  optimizer_shards?: number;
}

/** The optimizer's moments (this rank's slice of them when sharded) as a safetensors file. */
async function writeOptimizer(path: string, parts: RoleCheckpointParts): Promise<void> {
  const opt = parts.optimizer, st = await opt.optimizer.stateDict();
  const [start, end] = opt.range;
  writeTensorFile(path, new Map([
    ["exp_avg", { data: st.expAvg, shape: [st.expAvg.length] }],
    ["exp_avg_sq", { data: st.expAvgSq, shape: [st.expAvgSq.length] }],
  ]), {
    step: String(st.step), param_names: JSON.stringify([...parts.params.keys()]), param_sizes: JSON.stringify(st.paramSizes),
    ...(opt.shards > 1 ? { shard_start: String(start), shard_end: String(end), numel: String(opt.numel) } : {}),
  });
}

/** Parameters read back asynchronously (a GPU backend has no synchronous read under Node). */
async function toHost(params: Map<string, tf.Variable>): Promise<Map<string, NamedArray>> {
  const out = new Map<string, NamedArray>();
  for (const [name, v] of params) {
    heartbeat();
    out.set(name, { data: Float32Array.from(await v.data() as Float32Array), shape: [...v.shape] });
  }
  return out;
}

function writeTensorFile(path: string, tensors: Map<string, NamedArray>, metadata: Record<string, string>): void {
  writeFileAtomic(path, serializeSafetensors(tensors, metadata));
}

export async function saveRoleCheckpoint(dir: string, parts: RoleCheckpointParts, opts: SaveOptions = {}): Promise<void> {
  mkdirSync(dir, { recursive: true });
  const opt = parts.optimizer;
  // Sharded: the first `shards` ranks each hold a different slice (replicas of a hybrid shard hold the same bits).
  if (opt.shards > 1 && parts.rank < opt.shards) await writeOptimizer(join(dir, shardName(opt.shards, opt.shardIndex)), parts);
  if (parts.rank === 0) {
    writeTensorFile(join(dir, "model.safetensors"), await toHost(parts.params), { format: CHECKPOINT_FORMAT });
    if (opt.shards === 1) await writeOptimizer(join(dir, "optim.safetensors"), parts);
    const meta: CheckpointMeta = { format: CHECKPOINT_FORMAT, world_size: parts.worldSize, ...(opt.shards > 1 ? { optimizer_shards: opt.shards } : {}) };
    writeFileAtomic(join(dir, "checkpoint_meta.json"), JSON.stringify(meta, null, 2));
    if (parts.hf && opts.hfExport !== false) await saveHfModel(parts.hf.model, join(dir, "huggingface"), parts.hf.tokenizer);
    // LoRA: the adapter alone in peft's layout, as verl writes it (the export above is the merged model)
    if (parts.hf?.model.lora) await saveLoraAdapter(parts.hf.model.lora, join(dir, "lora_adapter"));
  }
  const extra: ExtraState = {
    lr_scheduler: parts.optimizer.scheduler.stateDict(),
    rng: Object.fromEntries(Object.entries(parts.rngs).map(([k, r]) => [k, r.getState()])),
  };
  writeFileAtomic(join(dir, extraName(parts.worldSize, parts.rank)), JSON.stringify(extra));
}

export async function loadRoleCheckpoint(dir: string, parts: Omit<RoleCheckpointParts, "hf">): Promise<void> {
  if (!existsSync(dir)) throw new Error(`checkpoint: ${dir} does not exist`);
  const meta = readCheckpointJson<CheckpointMeta>(join(dir, "checkpoint_meta.json"));
  if (meta.format !== CHECKPOINT_FORMAT) throw new Error(`checkpoint: ${dir} has format '${String(meta.format)}', expected '${CHECKPOINT_FORMAT}'`);
  const { tensors } = readSafetensors(join(dir, "model.safetensors"));
  for (const [name, v] of parts.params) {
    heartbeat();
    const t = tensors.get(name);
    if (!t) throw new Error(`checkpoint: ${join(dir, "model.safetensors")} has no tensor '${name}'`);
    requireFiniteWeights(t.data, name, join(dir, "model.safetensors"));
    if (t.shape.join(",") !== v.shape.join(",")) {
      throw new Error(`checkpoint: '${name}' has shape [${t.shape}] in ${dir} but the model has [${v.shape}]`);
    }
    tf.tidy(() => v.assign(tf.tensor(t.data, t.shape, "float32")));
  }
  parts.optimizer.optimizer.loadStateDict(readOptimizerSlice(dir, meta.optimizer_shards ?? 1, parts.optimizer));
  const extraPath = join(dir, extraName(meta.world_size ?? parts.worldSize, parts.rank));
  if (meta.world_size !== parts.worldSize || !existsSync(extraPath)) {
    // Weights load at any world size and optimizer state is re-sliced to it; per-rank RNG streams cannot.
    logger().warn({ dir, saved: meta.world_size, now: parts.worldSize }, "checkpoint saved with another world size: RNG states not restored");
    const any = join(dir, extraName(meta.world_size ?? 1, 0));
    if (existsSync(any)) parts.optimizer.scheduler.loadStateDict(readCheckpointJson<ExtraState>(any).lr_scheduler);
    return;
  }
  const extra = readCheckpointJson<ExtraState>(extraPath);
  parts.optimizer.scheduler.loadStateDict(extra.lr_scheduler);
  for (const [k, r] of Object.entries(parts.rngs)) {
    const st = extra.rng[k];
    if (!st) throw new Error(`checkpoint: ${extraPath} has no RNG state '${k}'`);
    r.setState(st);
  }
}

/**
 * This rank's slice of the saved moments, from one optim.safetensors or from the shard files that
 * overlap it: a checkpoint saved with another world size or sharding is re-sharded on load.
 */
function readOptimizerSlice(dir: string, savedShards: number, opt: DataParallelOptimizer): AdamWState {
  const [start, end] = opt.range;
  const expAvg = new Float32Array(end - start), expAvgSq = new Float32Array(end - start);
  const bounds = shardBounds(opt.numel, savedShards);
  let header: Record<string, string> | undefined;
  for (let s = 0; s < savedShards; s++) {
    const a = bounds[s]!, b = bounds[s + 1]!;
    // Every file agrees on the step and the parameters: read the first even when nothing overlaps.
    if ((Math.max(a, start) >= Math.min(b, end)) && header !== undefined) continue;
    heartbeat();
    const path = join(dir, savedShards === 1 ? "optim.safetensors" : shardName(savedShards, s));
    if (!existsSync(path)) throw new Error(`checkpoint: ${path} is missing (the optimizer was saved in ${savedShards} shards)`);
    const file = readSafetensors(path);
    const m = file.tensors.get("exp_avg"), v = file.tensors.get("exp_avg_sq");
    if (!m || !v) throw new Error(`checkpoint: ${path} lacks exp_avg / exp_avg_sq`);
    const sizes = JSON.parse(file.metadata.param_sizes ?? "[]") as number[], mine = opt.vars.map((x) => x.size);
    if (sizes.length !== mine.length || sizes.some((n, i) => n !== mine[i])) {
      const total = (xs: number[]) => xs.reduce((p, q) => p + q, 0);
      throw new Error(`checkpoint: ${path} is optimizer state for ${sizes.length} variables (${total(sizes)} values), this optimizer has ${mine.length} (${total(mine)} values)`);
    }
    const savedNumel = savedShards === 1 ? m.data.length : Number(file.metadata.numel);
    if (savedNumel !== opt.numel || (savedShards > 1 && (Number(file.metadata.shard_start) !== a || Number(file.metadata.shard_end) !== b)) || m.data.length !== b - a || v.data.length !== b - a) {
      throw new Error(`checkpoint: ${path} holds moments for [${file.metadata.shard_start ?? 0}, ${file.metadata.shard_end ?? m.data.length}) of ${savedNumel} parameters; expected [${a}, ${b}) of ${opt.numel}`);
    }
    if (header !== undefined && header.step !== file.metadata.step) throw new Error(`checkpoint: ${path} is at optimizer step ${file.metadata.step}, another shard at ${header.step}`);
    header ??= file.metadata;
    const i0 = Math.max(a, start), i1 = Math.min(b, end);
    if (i0 < i1) {
      expAvg.set(m.data.subarray(i0 - a, i1 - a), i0 - start);
      expAvgSq.set(v.data.subarray(i0 - a, i1 - a), i0 - start);
    }
  }
  return {
    step: Number(header!.step),
    expAvg,
    expAvgSq,
    paramNames: JSON.parse(header!.param_names ?? "[]") as string[],
    paramSizes: JSON.parse(header!.param_sizes ?? "[]") as number[],
    range: [start, end],
  };
}
