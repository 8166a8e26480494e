// A worker role's part of a checkpoint, in `global_step_N/<role>/`:
//   model.safetensors                       weights by Hugging Face name (rank 0; replicas are identical)
//   optim.safetensors                       AdamW moments + step (rank 0; identical after the all-reduce)
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
  if (parts.rank === 0) {
    writeTensorFile(join(dir, "model.safetensors"), await toHost(parts.params), { format: CHECKPOINT_FORMAT });
    const st = await parts.optimizer.optimizer.stateDict();
    writeTensorFile(join(dir, "optim.safetensors"), new Map([
      ["exp_avg", { data: st.expAvg, shape: [st.expAvg.length] }],
      ["exp_avg_sq", { data: st.expAvgSq, shape: [st.expAvgSq.length] }],
    ]), { step: String(st.step), param_names: JSON.stringify([...parts.params.keys()]), param_sizes: JSON.stringify(st.paramSizes) });
    writeFileAtomic(join(dir, "checkpoint_meta.json"), JSON.stringify({ format: CHECKPOINT_FORMAT, world_size: parts.worldSize }, null, 2));
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
  const meta = readCheckpointJson<{ format?: string; world_size?: number }>(join(dir, "checkpoint_meta.json"));
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
  const optim = readSafetensors(join(dir, "optim.safetensors"));
  const expAvg = optim.tensors.get("exp_avg"), expAvgSq = optim.tensors.get("exp_avg_sq");
  if (!expAvg || !expAvgSq) throw new Error(`checkpoint: ${join(dir, "optim.safetensors")} lacks exp_avg / exp_avg_sq`);
  parts.optimizer.optimizer.loadStateDict({
    step: Number(optim.metadata.step),
    expAvg: expAvg.data,
    expAvgSq: expAvgSq.data,
    paramNames: JSON.parse(optim.metadata.param_names ?? "[]") as string[],
    paramSizes: JSON.parse(optim.metadata.param_sizes ?? "[]") as number[],
  });
  const extraPath = join(dir, extraName(meta.world_size ?? parts.worldSize, parts.rank));
  if (meta.world_size !== parts.worldSize || !existsSync(extraPath)) {
    // Weights and optimizer are replicated, so they load at any world size; per-rank RNG streams cannot.
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
