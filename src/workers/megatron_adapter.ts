// lora.adapter_path: a Megatron adapter checkpoint loaded into verl-ts's PEFT-layout adapters.
// The tensors carry Megatron-Bridge's parameter names,
//   decoder.layers.{i}.self_attention.linear_qkv.adapter.linear_in.weight    A [r, in]
//   decoder.layers.{i}.self_attention.linear_qkv.adapter.linear_out.weight   B [out, r]
//   ....adapter.weight_magnitude                                              DoRA's m [out]
// (canonical_lora: linear_qkv.adapter.adapter_{q,k,v}.*, linear_fc1.adapter.adapter_{gate,up}.*),
// and B / m rows in Megatron's fused layouts: linear_qkv's rows by query group g = 0..kv_heads-1,
// each [the group's q heads, its k head, its v head] (head_dim rows a head), and linear_fc1's
// [gate; up]. The fused adapter's A is shared by its HF parts (tied, as LoraAdapter's tiedA), its
// B and m split by those rows. Every tensor is checked against the settings and the model: a name
// no adapted module has, a missing one, or a shape off lora.rank or the model is an error naming it.
// torch_dist folders may stack the layers of a key on a leading axis (Megatron's ShardedTensor with
// the layer offset prepended: decoder.layers.<module>... of [layers, ...]); those are split by layer.
import * as tf from "@tensorflow/tfjs";
import type { ModelConfig } from "../models/config.js";
import { LoraAdapter, linearModules, type LoraSettings, type LoraTensors } from "../models/lora.js";
import { readDistributedCheckpoint } from "../models/torch/dcp.js";
import { readTorchStateDict } from "../models/torch/torch_save.js";
import { megatronName, type MegatronAdapterSource, type MegatronLora } from "./megatron_lora.js";

interface Named { data: Float32Array; shape: number[] }

/** The adapter tensors of a checkpoint by Megatron name (float32), and the file or folder they came from. */
export function readMegatronAdapter(src: MegatronAdapterSource, nLayers: number): { tensors: Map<string, Named>; from: string } {
  if (src.kind === "pt") return { tensors: readTorchStateDict(src.file, "adapter_state_dict"), from: src.file };
  // a torch_dist folder holds the whole model's state (base weights, optimizer moments): only the
  // model's adapter parameters are read
  const adapterKey = (fqn: string) => /^((module|model)\.)?decoder\.layers\./.test(fqn) && fqn.includes(".adapter.");
  const { tensors } = readDistributedCheckpoint(src.dir, adapterKey);
  const out = new Map<string, Named>();
  for (const [fqn, t] of tensors) {
    const name = fqn.replace(/^(module|model)\./, "");
    const stacked = /^decoder\.layers\.(?!\d+\.)(.*)$/.exec(name);
    if (!stacked) { out.set(name, { data: t.data, shape: t.shape }); continue; }
    if (t.shape[0] !== nLayers) throw new Error(`${src.dir}: '${fqn}' stacks ${t.shape[0]} layers on its first axis [${t.shape}], but the model has ${nLayers}`);
    const per = t.data.length / nLayers;
    for (let i = 0; i < nLayers; i++) out.set(`decoder.layers.${i}.${stacked[1]}`, { data: t.data.slice(i * per, (i + 1) * per), shape: t.shape.slice(1) });
  }
  return { tensors: out, from: src.dir };
}

/** Which rows of the fused module's output an HF part takes: q / k / v of linear_qkv, gate / up of linear_fc1. */
function fusedRows(config: ModelConfig, leaf: string, fusedOut: number, from: string): number[] {
  const rows: number[] = [];
  const run = (start: number, n: number) => { for (let j = 0; j < n; j++) rows.push(start + j); };
  if (leaf === "linear_fc1_gate" || leaf === "linear_fc1_up") {
    const half = fusedOut / 2;
    run(leaf === "linear_fc1_gate" ? 0 : half, half);
    return rows;
  }
  const hd = config.headDim, groups = config.nKvHeads, perGroup = config.nHeads / groups;
  if (!Number.isInteger(perGroup) || fusedOut !== (config.nHeads + 2 * groups) * hd) {
    throw new Error(`${from}: linear_qkv's adapter has ${fusedOut} output rows; Megatron's layout for ${config.nHeads} heads, ${groups} key/value heads of ${hd} has ${(config.nHeads + 2 * groups) * hd}`);
  }
  const groupRows = (perGroup + 2) * hd;
  for (let g = 0; g < groups; g++) {
    if (leaf === "linear_q") run(g * groupRows, perGroup * hd);
    else run(g * groupRows + (perGroup + (leaf === "linear_k" ? 0 : 1)) * hd, hd);
  }
  return rows;
}

function takeRows(t: Named, rows: number[]): Float32Array {
  const cols = t.shape.length === 2 ? t.shape[1]! : 1, out = new Float32Array(rows.length * cols);
  rows.forEach((r, i) => out.set(t.data.subarray(r * cols, (r + 1) * cols), i * cols));
  return out;
}

const CANONICAL_PART: Record<string, string> = { linear_q: "q", linear_k: "k", linear_v: "v", linear_fc1_gate: "gate", linear_fc1_up: "up" };

/**
 * The adapter a lora.adapter_path checkpoint holds, for `targets` (HF module names, from
 * megatronLoraTargets) of `config`, with `settings` (rank, alpha, dropout, DoRA) from lora.*.
 */
export function loadMegatronAdapter(
  config: ModelConfig, s: MegatronLora, settings: LoraSettings, targets: string[], tiedA: string[][],
): LoraAdapter {
  if (!s.adapter) throw new Error("loadMegatronAdapter: lora.adapter_path is not set");
  const { tensors, from } = readMegatronAdapter(s.adapter, config.nLayers);
  const shapes = linearModules(config), r = s.rank, dora = s.type === "dora";
  const used = new Set<string>();
  const missing: string[] = [];
  const get = (name: string, shape: number[]): Named | null => {
    const t = tensors.get(name);
    if (!t) { missing.push(name); return null; }
    used.add(name);
    if (t.shape.join(",") !== shape.join(",")) {
      const rankHint = name.endsWith("linear_in.weight") && t.shape.length === 2 && t.shape[1] === shape[1] ? ` (rank ${t.shape[0]} in the file, ${s.key("rank")}=${r})`
        : name.endsWith("linear_out.weight") && t.shape.length === 2 && t.shape[0] === shape[0] ? ` (rank ${t.shape[1]} in the file, ${s.key("rank")}=${r})` : "";
      throw new Error(`${from}: '${name}' has shape [${t.shape}], expected [${shape}] for this model${rankHint}`);
    }
    return t;
  };
  const out = new Map<string, { a: Float32Array; b: Float32Array; m?: Float32Array }>();
  for (const hf of targets) {
    const meg = megatronName(hf);
    if (!meg) throw new Error(`${from}: module ${hf} has no Megatron name`);
    const [outF, inF] = shapes.get(hf)!;
    const parent = meg.full.slice(0, meg.full.length - meg.leaf.length);
    if (meg.fused && s.type !== "canonical_lora") {
      // one adapter on the fused module: its rows split among the HF parts
      const parts = [...shapes.keys()].filter((m) => { const o = megatronName(m); return o?.fused === meg.fused && o.full.slice(0, o.full.length - o.leaf.length) === parent; });
      const fusedOut = parts.reduce((n, m) => n + shapes.get(m)![0], 0);
      const prefix = `${parent}${meg.fused}.adapter.`;
      const a = get(`${prefix}linear_in.weight`, [r, inF]), b = get(`${prefix}linear_out.weight`, [fusedOut, r]);
      const m = dora ? get(`${prefix}weight_magnitude`, [fusedOut]) : null;
      if (!a || !b || (dora && !m)) continue;
      const rows = fusedRows(config, meg.leaf, fusedOut, from);
      if (rows.length !== outF) throw new Error(`${from}: ${meg.fused}'s adapter rows for ${hf} are ${rows.length}, the module has ${outF}`);
      out.set(hf, { a: a.data, b: takeRows(b, rows), ...(m ? { m: takeRows(m, rows) } : {}) });
    } else {
      const prefix = meg.fused ? `${parent}${meg.fused}.adapter.adapter_${CANONICAL_PART[meg.leaf]}.` : `${meg.full}.adapter.`;
      const a = get(`${prefix}linear_in.weight`, [r, inF]), b = get(`${prefix}linear_out.weight`, [outF, r]);
      const m = dora ? get(`${prefix}weight_magnitude`, [outF]) : null;
      if (!a || !b || (dora && !m)) continue;
      out.set(hf, { a: a.data, b: b.data, ...(m ? { m: m.data } : {}) });
    }
  }
  const list = (names: string[]) => `${names.slice(0, 6).join(", ")}${names.length > 6 ? `, ... (${names.length} in all)` : ""}`;
  const settingsNote = `lora.type=${s.type}, ${s.targets.length > 0 ? `${s.key("target_modules")}=[${s.targets.join(",")}]` : `${s.key("exclude_modules")}=[${s.excludes.join(",")}]`}`;
  if (missing.length > 0) throw new Error(`${from}: has no ${list([...new Set(missing)])}, which the adapter (${settingsNote}) needs`);
  const unknown = [...tensors.keys()].filter((n) => !used.has(n));
  if (unknown.length > 0) throw new Error(`${from}: holds ${list(unknown)}, which no adapted module of the model has (${settingsNote})`);
  const lt = new Map<string, LoraTensors>();
  try {
    for (const [hf, t] of out) {
      const [outF, inF] = shapes.get(hf)!;
      lt.set(hf, { a: tf.tensor2d(t.a, [r, inF]), b: tf.tensor2d(t.b, [outF, r]), ...(t.m ? { m: tf.tensor1d(t.m) } : {}) });
    }
    return new LoraAdapter({ ...settings, targetModules: targets, tiedA }, config, lt);
  } finally {
    for (const t of lt.values()) tf.dispose([t.a, t.b, ...(t.m ? [t.m] : [])]);
  }
}
