// Quantized rollouts (actor_rollout_ref.rollout.quantization): the setting per model, and fp8 (torchao's
// schemes are in torchao.ts). FP8 rollout (quantization=fp8) as verl's vLLM/SGLang path does it:
// at each weight sync the linear layers' weights are quantized to float8 e4m3 with one scale per
// 128 x 128 block (and vLLM rounds those layers' inputs per token in groups of 128), so generation
// runs in fp8 while training stays in float32. WGSL and the CPU have no 8-bit float, so here each
// value is replaced by its dequantized one (an e4m3 number times its block's float32 scale): the
// rollout gets fp8's numerics, and so a realistic rollout-training mismatch, but neither fp8's speed
// nor its memory saving.
import { existsSync, readFileSync } from "node:fs";
import type { LlamaModel } from "../models/llama.js";
import type { ConfigView } from "../workers/config_view.js";
import { parsePrecision } from "../engine/webgpu_kernels.js";
import { E4M3_MAX, roundBf16Bits, roundE4m3Clamped, roundF16 } from "./float_grids.js";
import { readTorchaoConfigFile, torchaoActivationGroup, torchaoKey, torchaoRolloutWeight, type TorchaoSpec } from "./torchao.js";

export { E4M3_MAX, roundBf16, roundE4m3, roundE4m3Clamped, roundF16 } from "./float_grids.js";

/** verl's fp8 rollout settings: the weight block [rows, columns] and the dtype weights are cast to before quantizing (vLLM's model dtype, rollout.dtype). */
export interface Fp8Spec { blockSize: [number, number]; castTo: "f32" | "bf16" | "f16" }

/** A quantized rollout: fp8's block scales, or a torchao scheme (torchao.ts). */
export type RolloutQuantSpec = Fp8Spec | TorchaoSpec;
const isTorchao = (spec: RolloutQuantSpec): spec is TorchaoSpec => "scheme" in spec;

/** verl's block (FP8_BLOCK_QUANT_KWARGS weight_block_size in its vLLM and SGLang servers). */
export const FP8_BLOCK: [number, number] = [128, 128];
/** The least block maximum, as verl's Triton kernel floors it (an all-zero block then gets a tiny scale and stays zero). */
const AMAX_EPS = 1e-10;

/**
 * Quantize a row-major [rows, cols] matrix block-wise to e4m3 and return it dequantized (float32),
 * with the per-block scales [ceil(rows/bm), ceil(cols/bn)]. Per block, as verl's Triton kernel on
 * NVIDIA: scale = max(amax, 1e-10) / 448 and inverse = 1 / scale in float32; each value becomes
 * e4m3(clamp(x * inverse, ±448)); vLLM's GEMM multiplies it back by `scale`. Edge blocks are partial
 * (verl pads with zeros, which do not change a block's maximum).
 */
export function quantizeBlockwise(w: Float32Array, rows: number, cols: number, spec: Fp8Spec): { values: Float32Array; scales: Float32Array } {
  if (w.length !== rows * cols) throw new Error(`fp8 quantization: ${w.length} values for a [${rows}, ${cols}] matrix`);
  const [bm, bn] = spec.blockSize, br = Math.ceil(rows / bm), bc = Math.ceil(cols / bn);
  const cast = spec.castTo === "bf16" ? roundBf16Bits : spec.castTo === "f16" ? roundF16 : (x: number) => x;
  const src = spec.castTo === "f32" ? w : w.map(cast);
  const values = new Float32Array(rows * cols), scales = new Float32Array(br * bc);
  const f = Math.fround;
  for (let i = 0; i < br; i++) {
    const r0 = i * bm, r1 = Math.min(rows, r0 + bm);
    for (let j = 0; j < bc; j++) {
      const c0 = j * bn, c1 = Math.min(cols, c0 + bn);
      let amax = 0;
      for (let r = r0; r < r1; r++) for (let c = c0; c < c1; c++) amax = Math.max(amax, Math.abs(src[r * cols + c]!));
      const scale = f(Math.max(amax, f(AMAX_EPS)) / E4M3_MAX), inv = f(1 / scale);
      scales[i * bc + j] = scale;
      for (let r = r0; r < r1; r++) {
        for (let c = c0; c < c1; c++) {
          const q = roundE4m3Clamped(Math.max(-E4M3_MAX, Math.min(E4M3_MAX, f(src[r * cols + c]! * inv))));
          values[r * cols + c] = f(q * scale);
        }
      }
    }
  }
  return { values, scales };
}

/**
 * The inputs of the quantized products, in place: vLLM's block fp8 linear (verl's "1x128 quantization
 * for activations") rounds each token's activations to e4m3 in groups of `group` (the weight block's
 * columns) before the product, with scale = max(amax, 1e-10) / 448 and e4m3(clamp(x / scale, ±448)).
 * Rows [0, rows) of a row-major [*, cols] buffer.
 */
export function quantizeActivations(x: Float32Array, rows: number, cols: number, group: number): void {
  const f = Math.fround;
  for (let r = 0; r < rows; r++) {
    for (let c0 = 0; c0 < cols; c0 += group) {
      const at = r * cols, c1 = Math.min(cols, c0 + group);
      let amax = 0;
      for (let c = c0; c < c1; c++) amax = Math.max(amax, Math.abs(x[at + c]!));
      const scale = f(Math.max(amax, f(AMAX_EPS)) / E4M3_MAX);
      for (let c = c0; c < c1; c++) x[at + c] = f(roundE4m3Clamped(Math.max(-E4M3_MAX, Math.min(E4M3_MAX, f(x[at + c]! / scale)))) * scale);
    }
  }
}

/**
 * Whether vLLM quantizes this HF parameter under verl's fp8 rollout: the weights of its linear
 * layers (q/k/v/o, gate/up/down, each MoE expert's). Embeddings, norms, biases, lm_head (a vocab
 * embedding in vLLM) and the MoE router (built without a quant config) stay in full precision.
 */
export function isFp8Weight(name: string): boolean {
  return /^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|mlp\.experts\.\d+\.(gate|up|down)_proj)\.weight$/.test(name);
}

/**
 * One parameter as the quantized rollout sees it: `data` quantized-dequantized when vLLM would quantize it, else
 * itself. `fusedRows`: the rows of the matrix vLLM fuses it into (torchao's float8 checks them; torchao.ts).
 */
export function rolloutWeight(name: string, data: Float32Array, shape: readonly number[], spec: RolloutQuantSpec | undefined, fusedRows = shape[0]!): Float32Array {
  if (spec && isTorchao(spec)) return torchaoRolloutWeight(name, data, shape, spec, fusedRows);
  if (!spec || !isFp8Weight(name)) return data;
  if (shape.length !== 2) throw new Error(`fp8 quantization: ${name} has shape [${shape.join(", ")}], not a matrix`);
  return quantizeBlockwise(data, shape[0]!, shape[1]!, spec).values;
}

// The rollout's setting per model: the decoders' weight caches (host and WebGPU) read it, so
// every way of generating with this model (batch rollout, agent loops, validation) sees it.
const specs = new WeakMap<LlamaModel, RolloutQuantSpec>();

/** Set (or clear, with undefined) the quantized rollout for `model`; the decoders re-lay their weights on the next call. */
export function setRolloutQuantization(model: LlamaModel, spec: RolloutQuantSpec | undefined): void {
  if (spec) specs.set(model, spec);
  else specs.delete(model);
}

export const rolloutQuantization = (model: LlamaModel): RolloutQuantSpec | undefined => specs.get(model);

/**
 * The groups the inputs of the quantized products are rounded to e4m3 in, per token, for an input row of
 * `cols` values (fp8: the weight block's columns; torchao float8: the whole row); undefined when unrounded.
 */
export function activationGroup(spec: RolloutQuantSpec | undefined, cols: number): number | undefined {
  if (!spec) return undefined;
  return isTorchao(spec) ? torchaoActivationGroup(spec, cols) : spec.blockSize[1];
}
/** A string that changes when the setting does (part of the decoders' weight-cache keys). */
export const quantizationKey = (model: LlamaModel): string => {
  const s = specs.get(model);
  if (!s) return "none";
  return isTorchao(s) ? torchaoKey(s) : `fp8:${s.blockSize.join("x")}:${s.castTo}`;
};

/** What verl's vLLM server accepts for rollout.quantization (vllm_async_server.py). */
const VERL_QUANTIZATION = ["fp8", "torchao"];

/**
 * actor_rollout_ref.rollout.{quantization, quantization_config_file, dtype, name} as an fp8 or torchao spec,
 * or undefined when quantization is null. Refuses what is not built, by key and value.
 */
export function parseRolloutQuantization(
  r: { quantization: string | null; configFile: string | null; dtype: string; engine: string },
  keys: { quantization: string; configFile: string },
  warn: (line: string) => void = () => {},
): RolloutQuantSpec | undefined {
  const q = r.quantization;
  if (q === null || q === undefined) {
    // verl hands the file to vLLM only together with a quantization method
    if (r.configFile) warn(`${keys.configFile}=${r.configFile} has no effect without ${keys.quantization} (verl passes it to vLLM only with a quantization method)`);
    return undefined;
  }
  if (q !== "fp8" && q !== "torchao") {
    throw new Error(`${keys.quantization}=${q}: verl accepts ${VERL_QUANTIZATION.join(" or ")} here`);
  }
  if (r.engine === "llama_cpp") {
    throw new Error(`${keys.quantization}=${q} with rollout.name=llama_cpp: llama.cpp quantizes in its own formats (Q8_0, Q4_K, ...), not vLLM's; use rollout.name=tfjs, vllm, sglang or webgpu`);
  }
  // weights are cast to rollout.dtype first, as verl casts them to vLLM's dtype; the names as the WebGPU engine reads them
  const castTo = parsePrecision(r.dtype, keys.quantization.replace(/quantization$/, "dtype"));
  if (q === "torchao") {
    // verl's SGLang server takes fp8 only; its vLLM server hands vLLM the torchao config file
    if (r.engine === "sglang") throw new Error(`${keys.quantization}=torchao with rollout.name=sglang: verl's SGLang rollout quantizes with fp8 only (torchao goes through vLLM: rollout.name=vllm)`);
    return readTorchaoConfigFile(r.configFile, castTo, keys);
  }
  return { blockSize: r.configFile ? fileBlockSize(r.configFile, keys.configFile, warn) : [...FP8_BLOCK] as [number, number], castTo };
}

/**
 * The portable part of a quantization config file: weight_block_size (top level or under
 * quantization_config). verl's own fp8 path keeps [128, 128] whatever the file says; here the file's
 * block is honoured, with one line saying so. What would change the method is refused.
 */
function fileBlockSize(path: string, key: string, warn: (line: string) => void): [number, number] {
  if (!existsSync(path)) throw new Error(`${key}=${path}: no such file`);
  let json: unknown;
  try { json = JSON.parse(readFileSync(path, "utf8")); } catch (e) { throw new Error(`${key}=${path}: not JSON (${(e as Error).message})`); }
  if (json === null || typeof json !== "object" || Array.isArray(json)) throw new Error(`${key}=${path}: expected a JSON object`);
  const top = json as Record<string, unknown>;
  const cfg = (top.quantization_config && typeof top.quantization_config === "object" ? top.quantization_config : top) as Record<string, unknown>;
  const need = (field: string, ok: unknown[]) => {
    if (cfg[field] !== undefined && !ok.includes(cfg[field])) throw new Error(`${key}=${path}: ${field}=${JSON.stringify(cfg[field])} is not built (fp8 rollout here is ${field} ${ok.map((v) => JSON.stringify(v)).join(" or ")})`);
  };
  need("quant_method", ["fp8"]);
  need("fmt", ["e4m3"]);
  // activations stay float32 here whatever the scheme (documented): only a static activation scale, which needs calibration data, is refused
  need("activation_scheme", ["dynamic"]);
  const b = cfg.weight_block_size;
  if (b === undefined) return [...FP8_BLOCK] as [number, number];
  if (!Array.isArray(b) || b.length !== 2 || !b.every((v) => Number.isInteger(v) && (v as number) > 0)) {
    throw new Error(`${key}=${path}: weight_block_size must be two positive integers, got ${JSON.stringify(b)}`);
  }
  const block: [number, number] = [b[0] as number, b[1] as number];
  if (block[0] !== FP8_BLOCK[0] || block[1] !== FP8_BLOCK[1]) warn(`${key}: fp8 weight blocks of ${block.join(" x ")} (verl's vLLM/SGLang fp8 path keeps 128 x 128 whatever the file says)`);
  return block;
}

/** The rollout section's quantization spec (undefined when quantization is null); refusals name the key and value. */
export function readRolloutQuantization(rollout: ConfigView, warn?: (line: string) => void): RolloutQuantSpec | undefined {
  return parseRolloutQuantization(
    { quantization: rollout.optStr("quantization"), configFile: rollout.optStr("quantization_config_file"), dtype: rollout.str("dtype", "float32"), engine: rollout.str("name", "tfjs") },
    { quantization: rollout.key("quantization"), configFile: rollout.key("quantization_config_file") },
    warn,
  );
}
