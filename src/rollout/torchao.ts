// torchao rollout (actor_rollout_ref.rollout.quantization=torchao): verl hands vLLM the torchao config
// serialized in rollout.quantization_config_file (torchao's config_to_dict JSON, e.g.
// {"_type": "Float8DynamicActivationFloat8WeightConfig", "_version": 2, "_data": {...}}), and vLLM quantizes
// every linear layer's weight with it at load and at each weight sync (online quantization). Here each
// weight is replaced by its dequantized value at each sync, so the rollout gets the scheme's numerics
// (not its speed). Built, as torchao 2 computes them:
//   Float8DynamicActivationFloat8WeightConfig, granularity PerRow (verl's example): bfloat16 weights
//     rounded to e4m3 with one scale per output row, amax / 448 (a bfloat16 division); each token's
//     input to those products rounded to e4m3 with its own scale (dynamic, per token);
//   Int8WeightOnlyConfig, PerRow or PerGroup(g): symmetric int8, scale = amax / 127.5 (at least 2^-23);
//   Int4WeightOnlyConfig(group_size), plain packing: asymmetric int4 per group of the row, scale =
//     (max - min) / 15 (at least 1e-6), min + scale * 8 as the zero.
// As vLLM applies it: the dense q/k/v/o and gate/up/down projections only (vLLM's LinearBase layers;
// MoE experts, the router, embeddings and lm_head stay in full precision), and torchao's own skips: a
// float8 weight whose fused matrix (q/k/v, gate/up) has a side that is not a multiple of 16, an int4
// weight whose row is not a multiple of group_size. Per-tensor granularity is refused: its one scale
// spans vLLM's fused matrices.
import { existsSync, readFileSync } from "node:fs";
import { E4M3_MAX, roundBf16, roundE4m3Clamped, roundF16, roundHalfEven } from "./float_grids.js";

export type TorchaoScheme =
  | { config: "Float8DynamicActivationFloat8WeightConfig" }
  | { config: "Int8WeightOnlyConfig"; group: number | "row" }
  | { config: "Int4WeightOnlyConfig"; groupSize: number };

export interface TorchaoSpec {
  scheme: TorchaoScheme;
  /** The dtype the weights are in before quantizing (vLLM's model dtype, rollout.dtype). */
  castTo: "f32" | "bf16" | "f16";
}

const f = Math.fround;
const castFn = (d: TorchaoSpec["castTo"]): ((x: number) => number) => (d === "bf16" ? roundBf16 : d === "f16" ? roundF16 : f);

/** The HF weights vLLM's torchao method quantizes: the dense attention and MLP projections (LinearBase layers). */
export function isTorchaoWeight(name: string): boolean {
  return /^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$/.test(name);
}

/**
 * Float8 rowwise: per output row, scale = bf16(amax / 448) (torchao divides in the weight's bfloat16),
 * q = e4m3(clamp(w / scale, ±448)), returned as q * scale. An all-zero row keeps zeros.
 */
export function quantizeFloat8Rowwise(w: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    const at = r * cols;
    let amax = 0;
    for (let c = 0; c < cols; c++) amax = Math.max(amax, Math.abs(roundBf16(w[at + c]!)));
    const scale = roundBf16(f(amax / E4M3_MAX));
    if (scale === 0) continue;
    for (let c = 0; c < cols; c++) {
      const q = roundE4m3Clamped(Math.max(-E4M3_MAX, Math.min(E4M3_MAX, f(roundBf16(w[at + c]!) / scale))));
      out[at + c] = f(q * scale);
    }
  }
  return out;
}

/**
 * Int8 symmetric per block of `group` columns of a row: scale = cast(amax / 127.5), at least 2^-23 (torchao's
 * float32 eps); q = clamp(round(w * (1 / scale)), -128, 127); returned as cast(q * scale).
 */
export function quantizeInt8(w: Float32Array, rows: number, cols: number, group: number, castTo: TorchaoSpec["castTo"]): Float32Array {
  const cast = castFn(castTo), out = new Float32Array(rows * cols), eps = 2 ** -23;
  for (let r = 0; r < rows; r++) {
    for (let c0 = 0; c0 < cols; c0 += group) {
      const at = r * cols, c1 = Math.min(cols, c0 + group);
      let amax = 0;
      for (let c = c0; c < c1; c++) amax = Math.max(amax, Math.abs(cast(w[at + c]!)));
      const scale = Math.max(cast(f(amax / 127.5)), eps), inv = f(1 / scale);
      for (let c = c0; c < c1; c++) {
        const q = Math.max(-128, Math.min(127, roundHalfEven(f(cast(w[at + c]!) * inv))));
        out[at + c] = cast(f(q * scale));
      }
    }
  }
  return out;
}

/**
 * Int4 asymmetric per group of `group` columns (fbgemm's int4_row_quantize_zp, torchao's plain Int4Tensor), in
 * float32: scale = max(max - min, 1e-6) / 15, zero = min + scale * 8, q = clamp(round((w - min) / scale), 0, 15) - 8;
 * scale and zero are kept in the weight's dtype, and the kernel's weight is cast(q * scale + zero).
 */
export function quantizeInt4(w: Float32Array, rows: number, cols: number, group: number, castTo: TorchaoSpec["castTo"]): Float32Array {
  const cast = castFn(castTo), out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c0 = 0; c0 < cols; c0 += group) {
      const at = r * cols, c1 = c0 + group;
      let lo = Infinity, hi = -Infinity;
      for (let c = c0; c < c1; c++) { const v = cast(w[at + c]!); lo = Math.min(lo, v); hi = Math.max(hi, v); }
      const scale = f(Math.max(f(hi - lo), f(1e-6)) / 15), zero = f(lo + f(scale * 8));
      const scaleKept = cast(scale), zeroKept = cast(zero);
      for (let c = c0; c < c1; c++) {
        const q = Math.max(0, Math.min(15, roundHalfEven(f(f(cast(w[at + c]!) - lo) / scale)))) - 8;
        out[at + c] = cast(f(f(q * scaleKept) + zeroKept));
      }
    }
  }
  return out;
}

/**
 * One parameter as the torchao rollout sees it. `fusedRows`: the rows of the matrix vLLM fuses it into
 * (q/k/v, gate/up), whose sides torchao's float8 checks.
 */
export function torchaoRolloutWeight(name: string, data: Float32Array, shape: readonly number[], spec: TorchaoSpec, fusedRows: number): Float32Array {
  if (!isTorchaoWeight(name)) return data;
  if (shape.length !== 2) throw new Error(`torchao quantization: ${name} has shape [${shape.join(", ")}], not a matrix`);
  const [rows, cols] = shape as [number, number], s = spec.scheme;
  switch (s.config) {
    case "Float8DynamicActivationFloat8WeightConfig":
      // torchao leaves a weight _scaled_mm cannot take in full precision
      return fusedRows % 16 === 0 && cols % 16 === 0 ? quantizeFloat8Rowwise(data, rows, cols) : data;
    case "Int8WeightOnlyConfig": {
      const g = s.group === "row" ? cols : s.group;
      if (cols % g !== 0) throw new Error(`torchao Int8WeightOnlyConfig: ${name}'s rows of ${cols} are not a whole number of groups of ${g} (torchao refuses this weight)`);
      return quantizeInt8(data, rows, cols, g, spec.castTo);
    }
    case "Int4WeightOnlyConfig":
      // torchao skips a weight whose rows do not split into groups
      return cols % s.groupSize === 0 ? quantizeInt4(data, rows, cols, s.groupSize, spec.castTo) : data;
  }
}

/** The per-token input rounding of the quantized products (the whole row is one group), or undefined when the scheme has none. */
export const torchaoActivationGroup = (spec: TorchaoSpec, cols: number): number | undefined =>
  spec.scheme.config === "Float8DynamicActivationFloat8WeightConfig" ? cols : undefined;

export const torchaoKey = (spec: TorchaoSpec): string => `torchao:${JSON.stringify(spec.scheme)}:${spec.castTo}`;

type Json = Record<string, unknown>;

/** A torchao config_to_dict object's type name and fields. */
function typed(v: unknown, where: string): { type: string; data: Json } {
  if (v === null || typeof v !== "object" || Array.isArray(v) || typeof (v as Json)._type !== "string") throw new Error(`${where}: expected a torchao object {"_type": ..., "_data": ...}, got ${JSON.stringify(v)}`);
  const data = (v as Json)._data;
  return { type: (v as Json)._type as string, data: data && typeof data === "object" && !Array.isArray(data) ? (data as Json) : {} };
}

/** An enum or dtype value as config_to_dict writes it ({"_type": ..., "_data": "NAME"}) or a plain string. */
const enumName = (v: unknown): string | undefined => (typeof v === "string" ? v : v && typeof v === "object" ? String((v as Json)._data ?? "") : undefined);

const BUILT = "Float8DynamicActivationFloat8WeightConfig (granularity PerRow), Int8WeightOnlyConfig (PerRow or PerGroup) and Int4WeightOnlyConfig (plain packing)";

/** The granularity of a weight (`which`: 0 activation, 1 weight when a pair is given); null = torchao's default. */
function granularity(v: unknown, which: 0 | 1, where: string): { type: string; data: Json } | null {
  if (v === undefined || v === null) return null;
  const g = Array.isArray(v) ? v[which] : v;
  return typed(g, `${where}.granularity`);
}

/**
 * rollout.quantization_config_file for quantization=torchao: the scheme, or an error naming the file and
 * what in it is not built. `castTo` is rollout.dtype.
 */
export function readTorchaoConfigFile(path: string | null, castTo: TorchaoSpec["castTo"], keys: { quantization: string; configFile: string }): TorchaoSpec {
  const where = `${keys.configFile}=${path}`;
  if (!path) throw new Error(`${keys.quantization}=torchao needs ${keys.configFile}: the torchao config (config_to_dict JSON) vLLM quantizes with; verl passes no other`);
  if (!existsSync(path)) throw new Error(`${where}: no such file`);
  let json: unknown;
  try { json = JSON.parse(readFileSync(path, "utf8")); } catch (e) { throw new Error(`${where}: not JSON (${(e as Error).message})`); }
  const { type, data } = typed(json, where);
  const version = (json as Json)._version;
  const refuse = (what: string) => new Error(`${where}: ${type} ${what} is not built (verl-ts builds ${BUILT})`);
  if (version !== undefined && version !== 2) throw refuse(`version ${JSON.stringify(version)} (torchao's deprecated version 1)`);
  switch (type) {
    case "Float8DynamicActivationFloat8WeightConfig": {
      for (const k of ["activation_dtype", "weight_dtype"]) {
        const d = enumName(data[k]);
        if (d !== undefined && d !== "float8_e4m3fn") throw refuse(`with ${k} ${d} (e4m3fn only)`);
      }
      const act = granularity(data.granularity, 0, where), wt = granularity(data.granularity, 1, where);
      if (act?.type !== "PerRow" || wt?.type !== "PerRow") {
        throw refuse(`with granularity ${act?.type ?? "null (PerTensor)"}/${wt?.type ?? "null (PerTensor)"}: only PerRow is (a per-tensor scale spans vLLM's fused q/k/v and gate/up matrices; block scales are rollout.quantization=fp8)`);
      }
      for (const k of ["activation_value_lb", "activation_value_ub"]) if (data[k] !== undefined && data[k] !== null) throw refuse(`with ${k}=${JSON.stringify(data[k])}`);
      const packing = enumName(data.packing_format);
      if (packing !== undefined && packing.toLowerCase() !== "plain") throw refuse(`with packing_format ${packing} (2:4 sparse packings change the weights)`);
      return { scheme: { config: type }, castTo: "bf16" }; // torchao's rowwise float8 takes bfloat16 weights only
    }
    case "Int8WeightOnlyConfig": {
      if (data.group_size !== undefined && data.group_size !== null) throw refuse(`with group_size (version 1's field; version 2 says granularity PerGroup)`);
      const g = granularity(data.granularity, 1, where);
      if (g === null || g.type === "PerRow") return { scheme: { config: type, group: "row" }, castTo };
      const size = g.data.group_size;
      if (g.type === "PerGroup" && Number.isInteger(size) && (size as number) > 0) return { scheme: { config: type, group: size as number }, castTo };
      throw refuse(`with granularity ${g.type}${g.type === "PerTensor" ? " (its one scale spans vLLM's fused q/k/v and gate/up matrices)" : ""}`);
    }
    case "Int4WeightOnlyConfig": {
      const size = data.group_size ?? 128;
      if (!Number.isInteger(size) || (size as number) <= 0) throw new Error(`${where}: Int4WeightOnlyConfig group_size must be a positive integer, got ${JSON.stringify(size)}`);
      const packing = enumName(data.int4_packing_format);
      if (packing !== undefined && packing.toLowerCase() !== "plain") throw refuse(`with int4_packing_format ${packing} (its quantization parameters differ from the plain format's)`);
      return { scheme: { config: type, groupSize: size as number }, castTo };
    }
    default:
      throw new Error(`${where}: torchao's ${type} is not built (verl-ts builds ${BUILT})`);
  }
}

/** The rows of the matrix vLLM fuses `name` into: q/k/v into qkv_proj, gate/up into gate_up_proj; others are their own. */
export function vllmFusedRows(name: string, shape: readonly number[], c: { nHeads: number; nKvHeads: number; headDim: number }): number {
  if (/\.self_attn\.[qkv]_proj\.weight$/.test(name)) return (c.nHeads + 2 * c.nKvHeads) * c.headDim;
  if (/\.mlp\.(gate|up)_proj\.weight$/.test(name)) return 2 * shape[0]!;
  return shape[0]!;
}
