// verl's Megatron LoRA keys (model.lora.*, read by verl's Megatron workers through Megatron-Bridge)
// mapped onto verl-ts's PEFT-layout adapters (src/models/lora.ts). Megatron-Bridge's adapter on a
// linear module is peft's: W x + (alpha / rank) B A x, B zero at start; only the module names and
// A's initialisation differ, so those are translated here:
//   linear_q / linear_k / linear_v   -> self_attn.q_proj / k_proj / v_proj   (canonical_lora)
//   linear_proj                      -> self_attn.o_proj
//   linear_fc1_gate / linear_fc1_up  -> mlp.gate_proj / up_proj (experts too) (canonical_lora)
//   linear_fc2                       -> mlp.down_proj
// A name with `*` is matched (fnmatch) against the module's Megatron name,
// decoder.layers.{i}.self_attention.{leaf}, decoder.layers.{i}.mlp.{leaf} or
// decoder.layers.{i}.mlp.experts.local_experts.{e}.{leaf}; a plain name against the leaf.
// type=lora adapts the fused linear_qkv / linear_fc1 as one module: one A [r, in] shared by q, k
// and v (or gate and up) and one B split by rows, trained here as tied adapters (src/models/lora.ts
// tiedA) and saved for peft with the shared A written under each part. type=dora is type=lora's
// modules with Megatron-Bridge's DoRA on each (peft's use_dora). lora.dropout applies in training
// passes at lora.dropout_position (pre: on the adapter's input; post: on its output; DoRA only pre,
// as Megatron-Bridge asserts). lora.adapter_path (a checkpoint to continue from) is located here
// and loaded by megatron_adapter.ts. Refused naming the key: vlm_lora, and adapter checkpoints that
// cannot be read (see adapterCheckpointError).
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig } from "../models/config.js";
import { linearModules, type KeyNamer } from "../models/lora.js";
import type { DropoutPosition } from "../models/lora_dropout.js";
import type { ConfigView } from "./config_view.js";
import { expandHome } from "./model_source.js";

export type LoraAInit = "kaiming" | "xavier" | "normal";

export interface MegatronLora {
  type: "lora" | "canonical_lora" | "dora";
  rank: number;
  /** Dropout on the adapter branch in training passes, and where (pre / post). */
  dropout: number;
  dropoutPosition: DropoutPosition;
  alpha: number;
  targets: string[];
  excludes: string[];
  initA: LoraAInit;
  initB: "zero" | LoraAInit;
  /** Names the lora.* key in errors (`actor_rollout_ref.model.lora.target_modules`). */
  key: KeyNamer;
  /** lora.adapter_path located: the checkpoint the adapter starts from (null: a fresh adapter). */
  adapter: MegatronAdapterSource | null;
}

/** A readable lora.adapter_path: verl's mp_rank_00_adapter.pt, or a torch.distributed.checkpoint folder. */
export type MegatronAdapterSource = { kind: "pt"; file: string } | { kind: "dcp"; dir: string };

const HF_TO_MEGATRON: Record<string, string> = {
  q_proj: "linear_q", k_proj: "linear_k", v_proj: "linear_v", o_proj: "linear_proj",
  gate_proj: "linear_fc1_gate", up_proj: "linear_fc1_up", down_proj: "linear_fc2",
};
const CANONICAL = Object.values(HF_TO_MEGATRON);
const A_INITS: readonly LoraAInit[] = ["xavier", "kaiming", "normal"];

function list(view: ConfigView, k: string): string[] {
  const v = view.raw(k);
  if (v === undefined || v === null) return [];
  if (typeof v === "string") return [v];
  return view.strList(k);
}

/**
 * model.lora.* as adapter settings, or null when lora.rank is 0. Throws, naming the key, for what
 * has no equivalent here.
 */
export function readMegatronLora(model: ConfigView): MegatronLora | null {
  const lora = model.at("lora");
  if (lora.raw("rank") === undefined) return null;
  const rank = lora.int("rank", 0);
  if (rank < 0) throw new Error(`${lora.key("rank")} must be 0 (off) or a positive integer, got ${rank}`);
  if (rank === 0) return null;
  const key: KeyNamer = (k) => lora.key(k === "lora_rank" ? "rank" : k === "lora_alpha" ? "alpha" : k);
  const type = lora.str("type", "lora");
  if (type === "vlm_lora") throw new Error(`${lora.key("type")}=vlm_lora: vision-language models are not built; use lora, canonical_lora or dora`);
  if (type !== "lora" && type !== "canonical_lora" && type !== "dora") throw new Error(`${lora.key("type")} is ${JSON.stringify(type)}; choose one of lora, canonical_lora, dora (vlm_lora is not built)`);
  const alpha = lora.num("alpha", 32);
  if (!(alpha > 0)) throw new Error(`${lora.key("alpha")} must be a positive number, got ${alpha}`);
  const dropout = lora.num("dropout", 0);
  if (!(dropout >= 0 && dropout < 1)) throw new Error(`${lora.key("dropout")} must be in [0, 1), got ${dropout}`);
  const dropoutPosition = lora.str("dropout_position", "pre");
  if (dropoutPosition !== "pre" && dropoutPosition !== "post") throw new Error(`${lora.key("dropout_position")} is ${JSON.stringify(dropoutPosition)}; choose pre or post`);
  if (type === "dora" && dropoutPosition !== "pre") throw new Error(`${lora.key("dropout_position")}=${dropoutPosition}: DoRA applies dropout before the adapter only (Megatron-Bridge asserts dropout_position=pre for type=dora)`);
  const initA = lora.str("lora_A_init_method", "xavier");
  if (!A_INITS.includes(initA as LoraAInit)) throw new Error(`${lora.key("lora_A_init_method")} is ${JSON.stringify(initA)}; choose one of ${A_INITS.join(", ")}`);
  const initB = lora.str("lora_B_init_method", "zero");
  if (initB !== "zero" && !A_INITS.includes(initB as LoraAInit)) throw new Error(`${lora.key("lora_B_init_method")} is ${JSON.stringify(initB)}; choose one of zero, ${A_INITS.join(", ")}`);
  const adapterPath = lora.optStr("adapter_path");
  let adapter: MegatronAdapterSource | null = null;
  if (adapterPath !== null && adapterPath !== "") {
    const path = expandHome(adapterPath), located = locateMegatronAdapter(path);
    if (typeof located === "string") throw new Error(adapterCheckpointError(lora.key("adapter_path"), path, model.key("lora_adapter_path"), located));
    adapter = located;
  }
  const targets = list(lora, "target_modules"), excludes = list(lora, "exclude_modules");
  if (targets.length > 0 && excludes.length > 0) throw new Error(`${lora.key("exclude_modules")} needs ${lora.key("target_modules")} empty (as Megatron-Bridge asserts): it selects every linear module but those`);
  if (targets.length === 0 && excludes.length === 0) throw new Error(`${lora.key("target_modules")} is empty and so is ${lora.key("exclude_modules")}: name the modules to adapt`);
  const allowed = type === "canonical_lora" ? CANONICAL : ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"];
  for (const [k, names] of [["target_modules", targets], ["exclude_modules", excludes]] as const) {
    for (const n of names) {
      const leaf = n.split(".").pop()!;
      if (!leaf.includes("*") && !allowed.includes(leaf)) {
        throw new Error(`${lora.key(k)} names '${n}', not a module of lora.type=${type} (its modules: ${allowed.join(", ")})`);
      }
    }
  }
  return { type, rank, alpha, dropout, dropoutPosition, targets, excludes, initA: initA as LoraAInit, initB: initB as "zero" | LoraAInit, key, adapter };
}

const RANK_FILE = /^mp_rank_\d{2}(_\d{3}){0,2}_adapter\.pt$/;

/**
 * Where an adapter checkpoint's tensors are, or (a string) what the path holds instead. verl's
 * Megatron workers save <path>/mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}]_adapter.pt (torch.save of
 * {"adapter_state_dict"}, one file per model-parallel rank; verl/utils/megatron_peft_utils.py):
 * one rank's file, mp_rank_00_adapter.pt, holds the whole adapter. Megatron-Bridge saves torch_dist
 * folders (.metadata + .distcp shards), whole whatever the parallelism; a Megatron checkpoint root
 * (latest_checkpointed_iteration.txt) leads to its latest iter_NNNNNNN folder.
 */
export function locateMegatronAdapter(path: string): MegatronAdapterSource | string {
  if (!existsSync(path)) return "missing";
  if (!statSync(path).isDirectory()) return /\.(pt|pth|bin)$/.test(path) ? { kind: "pt", file: path } : "other";
  const files = readdirSync(path);
  if (files.includes(".metadata")) return { kind: "dcp", dir: path };
  if (files.includes("latest_checkpointed_iteration.txt")) {
    const it = readFileSync(join(path, "latest_checkpointed_iteration.txt"), "utf8").trim();
    const iter = join(path, `iter_${it.padStart(7, "0")}`);
    if (/^\d+$/.test(it) && existsSync(join(iter, ".metadata"))) return { kind: "dcp", dir: iter };
  }
  const ranks = files.filter((f) => RANK_FILE.test(f));
  if (ranks.length === 1 && ranks[0] === "mp_rank_00_adapter.pt") return { kind: "pt", file: join(path, ranks[0]) };
  if (ranks.length > 0) return "ranks";
  return files.includes("adapter_config.json") ? "peft" : "other";
}

/**
 * Why lora.adapter_path cannot be loaded (`why` from locateMegatronAdapter), naming what the path
 * holds. A peft folder can be loaded, but as model.lora_adapter_path.
 */
export function adapterCheckpointError(key: string, path: string, peftKey: string, why: string): string {
  const peft = `convert it to a peft folder (adapter_config.json + adapter_model.safetensors; Megatron-Bridge's AutoBridge.export_adapter_ckpt writes one) and give that as ${peftKey}, with lora.rank left 0`;
  if (why === "missing") return `${key}=${path} does not exist (verl reads <path>/mp_rank_00_adapter.pt there, Megatron-Bridge a torch_dist folder; a peft folder goes in ${peftKey})`;
  const files = statSync(path).isDirectory() ? readdirSync(path) : [path.split("/").pop()!];
  if (why === "ranks") {
    const ranks = files.filter((f) => RANK_FILE.test(f)).sort();
    return `${key}=${path} holds verl's Megatron adapter checkpoint of several model-parallel ranks (${ranks.slice(0, 4).join(", ")}${ranks.length > 4 ? ", ..." : ""}): ` +
      `each holds its rank's shard of the adapter (tensor-parallel slices, pipeline stages with their own layer numbering) and merging them is not built; ` +
      `save it with tensor, pipeline and expert parallel size 1 (one file, mp_rank_00_adapter.pt), or ${peft}`;
  }
  if (why === "peft") return `${key}=${path} is a peft folder (adapter_config.json): lora.adapter_path reads Megatron adapter checkpoints; give a peft folder as ${peftKey}, with lora.rank left 0`;
  return `${key}=${path} holds neither mp_rank_00_adapter.pt, a torch_dist folder (.metadata + .distcp shards) nor a peft folder (it holds ${files.slice(0, 5).join(", ") || "nothing"}); ${peft}`;
}

/** fnmatch: `*` any run of characters (dots included), `?` one; the rest literal. */
function fnmatch(pattern: string, name: string): boolean {
  const re = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${re}$`).test(name);
}

/** The Megatron name and fused parent of an HF linear module (null for the output layer). */
export function megatronName(hf: string): { full: string; leaf: string; fused: string | null } | null {
  const m = /^model\.layers\.(\d+)\.(self_attn|mlp)\.(?:experts\.(\d+)\.)?([a-z]+_proj)$/.exec(hf);
  const leaf = m ? HF_TO_MEGATRON[m[4]!] : undefined;
  if (!m || !leaf) return null;
  const where = m[2] === "self_attn" ? "self_attention" : m[3] !== undefined ? `mlp.experts.local_experts.${m[3]}` : "mlp";
  const fused = leaf === "linear_q" || leaf === "linear_k" || leaf === "linear_v" ? "linear_qkv" : leaf.startsWith("linear_fc1_") ? "linear_fc1" : null;
  return { full: `decoder.layers.${m[1]}.${where}.${leaf}`, leaf, fused };
}

/**
 * The HF module names the settings adapt in this model, in model order, and (type=lora) the groups
 * of them that are one fused Megatron module sharing A: a name matches the fused module
 * (linear_qkv: q, k and v together).
 */
export function megatronLoraTargets(config: ModelConfig, s: MegatronLora): { targets: string[]; tiedA: string[][] } {
  const matchOne = (pattern: string, meg: { full: string; leaf: string; fused: string | null }): boolean => {
    const forms = s.type !== "canonical_lora" && meg.fused ? [meg.full.replace(/[^.]+$/, meg.fused), meg.fused] : [meg.full, meg.leaf];
    return pattern.includes("*") || pattern.includes(".") ? fnmatch(pattern, forms[0]!) : pattern === forms[1];
  };
  const picked: string[] = [];
  const groups = new Map<string, string[]>();
  const used = new Set<string>();
  for (const hf of linearModules(config).keys()) {
    const meg = megatronName(hf);
    if (!meg) continue;
    let on: boolean;
    if (s.targets.length > 0) {
      const hit = s.targets.filter((p) => matchOne(p, meg));
      hit.forEach((p) => used.add(p));
      on = hit.length > 0;
    } else on = !s.excludes.some((p) => matchOne(p, meg));
    if (!on) continue;
    picked.push(hf);
    if (s.type !== "canonical_lora" && meg.fused) {
      const fusedName = meg.full.replace(/[^.]+$/, meg.fused);
      groups.set(fusedName, [...(groups.get(fusedName) ?? []), hf]);
    }
  }
  for (const p of s.targets) if (!used.has(p)) throw new Error(`${s.key("target_modules")} names '${p}', which matches no linear module of the model`);
  if (picked.length === 0) throw new Error(`${s.key("target_modules")} / ${s.key("exclude_modules")} leave no linear module of the model to adapt`);
  return { targets: picked, tiedA: [...groups.values()].filter((g) => g.length > 1) };
}
