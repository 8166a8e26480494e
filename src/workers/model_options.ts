// The training-memory keys of a model section (actor_rollout_ref.model,
// critic.model), as verl names them: LoRA (lora_rank > 0 or lora_adapter_path),
// enable_gradient_checkpointing and use_remove_padding.
import type * as tf from "@tensorflow/tfjs";
import { LoraAdapter, type LoraSettings } from "../models/lora.js";
import type { LlamaModel } from "../models/llama.js";
import { loadLoraAdapter, readAdapterSettings } from "../models/peft.js";
import { logger } from "../utils/logger.js";
import { Rng } from "../utils/rng.js";
import type { ConfigView } from "./config_view.js";
import { loadMegatronAdapter } from "./megatron_adapter.js";
import { megatronLoraTargets, readMegatronLora, type MegatronLora } from "./megatron_lora.js";
import { expandHome } from "./model_source.js";

export interface ModelMemoryOptions {
  /** null = full fine-tuning; `megatron` when set through model.lora.* (Megatron's keys). */
  lora: (LoraSettings & { megatron?: MegatronLora }) | null;
  /** A peft folder to continue training from (its adapter_config.json wins over lora_rank / lora_alpha / target_modules). */
  loraAdapterPath: string | null;
  gradientCheckpointing: boolean;
  removePadding: boolean;
}

function moduleSpec(model: ConfigView, k: string): string | string[] | null {
  const v = model.raw(k);
  if (v === undefined || v === null) return null;
  if (typeof v === "string") return v;
  return model.strList(k);
}

/** Read the keys; `defaults` are verl's for this section (the critic's use_remove_padding defaults to false). */
export function readModelMemoryOptions(model: ConfigView, defaults: { removePadding: boolean } = { removePadding: true }): ModelMemoryOptions {
  const rank = model.int("lora_rank", 0);
  if (rank < 0) throw new Error(`${model.key("lora_rank")} must be 0 (off) or a positive integer, got ${rank}`);
  const adapterPath = model.optStr("lora_adapter_path");
  const on = rank > 0 || adapterPath !== null;
  const megatron = readMegatronLora(model);
  if (megatron && on) {
    throw new Error(`${model.key("lora.rank")} and ${model.key(rank > 0 ? "lora_rank" : "lora_adapter_path")} are both set: use one LoRA spelling (lora.* is Megatron's, lora_rank FSDP's)`);
  }
  return {
    lora: megatron ? {
      // targets resolved against the model's modules in applyModelMemoryOptions
      rank: megatron.rank, alpha: megatron.alpha, targetModules: [], initA: megatron.initA, initB: megatron.initB, megatron,
      dropout: megatron.dropout, dropoutPosition: megatron.dropoutPosition, useDora: megatron.type === "dora",
    } : on ? {
      rank, alpha: model.num("lora_alpha", 16),
      targetModules: moduleSpec(model, "target_modules") ?? "all-linear",
      excludeModules: moduleSpec(model, "exclude_modules"),
    } : null,
    loraAdapterPath: adapterPath ? expandHome(adapterPath) : null,
    gradientCheckpointing: model.bool("enable_gradient_checkpointing", true),
    removePadding: model.bool("use_remove_padding", defaults.removePadding),
  };
}

/** Attach the adapter (fresh, seeded, or loaded from lora_adapter_path / lora.adapter_path) and the checkpointing flag to `llama`. */
export function applyModelMemoryOptions(llama: LlamaModel, opts: ModelMemoryOptions, model: ConfigView, seed: number): void {
  llama.gradientCheckpointing = opts.gradientCheckpointing;
  if (!opts.lora) return;
  if (opts.loraAdapterPath) {
    const saved = readAdapterSettings(opts.loraAdapterPath);
    if (opts.lora.rank > 0 && (saved.rank !== opts.lora.rank || saved.alpha !== opts.lora.alpha)) {
      logger().warn({ key: model.key("lora_adapter_path"), saved: { r: saved.rank, alpha: saved.alpha }, config: { r: opts.lora.rank, alpha: opts.lora.alpha } },
        "the adapter's own r / lora_alpha are used (as peft does), not the config's");
    }
    llama.lora = loadLoraAdapter(opts.loraAdapterPath, llama.config);
    return;
  }
  const rng = new Rng((seed ^ 0x10ca) >>> 0);
  const { megatron, ...settings } = opts.lora;
  if (megatron) {
    const { targets, tiedA } = megatronLoraTargets(llama.config, megatron);
    // lora.adapter_path: the adapter continues from a Megatron checkpoint (verl's or Megatron-Bridge's)
    if (megatron.adapter) {
      llama.lora = loadMegatronAdapter(llama.config, megatron, settings, targets, tiedA);
      return;
    }
    llama.lora = LoraAdapter.init(llama.config, { ...settings, targetModules: targets, tiedA }, rng, megatron.key,
      (m) => llama.p(`${m}.weight`) as tf.Tensor2D);
    return;
  }
  llama.lora = LoraAdapter.init(llama.config, settings, rng, model.prefix);
}
