// Driver-side batch plumbing for one training step: group ids, the generation
// batch, lengths, decoded text, and the small host reductions the fit loop needs.
import { AGENT_LOOP_ROW_KEYS, needsAgentLoop } from "../../agent_loop/index.js";
import type { Tokenizer } from "../../models/index.js";
import { DataProto } from "../../protocol/index.js";
import type { TensorData } from "../../protocol/tensor.js";
import type { Rng } from "../../utils/rng.js";
import type { ConfigView } from "../../workers/config_view.js";

const GEN_KEYS = ["input_ids", "attention_mask", "position_ids"];

function hex32(x: number): string {
  return (x >>> 0).toString(16).padStart(8, "0");
}

/** A deterministic uuid-like id (from the driver's RNG, so a resumed run draws the same ones). */
export function drawUid(rng: Rng): string {
  const w = [rng.nextU32(), rng.nextU32(), rng.nextU32(), rng.nextU32()].map(hex32).join("");
  return `${w.slice(0, 8)}-${w.slice(8, 12)}-${w.slice(12, 16)}-${w.slice(16, 20)}-${w.slice(20, 32)}`;
}

export function assignUids(batch: DataProto, rng: Rng): void {
  batch.nonTensorBatch.uid = Array.from({ length: batch.length }, () => drawUid(rng));
}

/**
 * Pops the prompt tensors into the batch the rollout sees, repeated n times
 * (interleaved, like the prompts' other columns will be), with the non-tensor
 * `rowKeys` the rollout needs. With per-sample seeds each repeated row gets its
 * own seed from the driver's RNG.
 */
export function popGenBatch(batch: DataProto, n: number, rng: Rng | null, rowKeys: readonly string[] = []): DataProto {
  const keys = GEN_KEYS.filter((k) => k in batch.batch);
  if (!keys.includes("input_ids")) throw new Error("the prompt batch has no input_ids (is the tokenizer set for the dataset?)");
  const popped = batch.pop(keys, [], []);
  // Agent loops read per-row fields (raw_prompt, agent_name, tools_kwargs...): send copies along.
  for (const k of rowKeys) if (batch.nonTensorBatch[k]) popped.nonTensorBatch[k] = batch.nonTensorBatch[k]!;
  const gen = popped.repeat(n, true);
  if (rng) gen.nonTensorBatch.rollout_seed = Array.from({ length: gen.length }, () => rng.nextU32());
  return gen;
}

export function rowSums(t: TensorData, from = 0, to?: number): number[] {
  const [rows, width] = t.shape as [number, number];
  const end = to ?? width;
  const out = new Array<number>(rows).fill(0);
  for (let i = 0; i < rows; i++) for (let j = from; j < end; j++) out[i]! += Number(t.data[i * width + j]);
  return out;
}

export function requireTensor(batch: DataProto, key: string): TensorData {
  const t = batch.batch[key];
  if (!t) throw new Error(`batch has no '${key}' (present: ${Object.keys(batch.batch).join(", ")})`);
  return t;
}

/** The per-row fields the rollout needs: the agent loops' fields when they run, else none. */
export function agentRowKeys(cfg: ConfigView, batch: DataProto): readonly string[] {
  return needsAgentLoop(cfg.root, batch) ? AGENT_LOOP_ROW_KEYS : [];
}

/** Valid prompt ids (left padding removed) and valid response ids of row i. */
export function rowTokens(batch: DataProto, i: number): { prompt: number[]; response: number[] } {
  const prompts = requireTensor(batch, "prompts"), responses = requireTensor(batch, "responses");
  const am = requireTensor(batch, "attention_mask");
  const P = prompts.shape[1]!, R = responses.shape[1]!, W = am.shape[1]!;
  const prompt: number[] = [], response: number[] = [];
  for (let j = 0; j < P; j++) if (am.data[i * W + j]) prompt.push(Number(prompts.data[i * P + j]));
  for (let j = 0; j < R; j++) if (am.data[i * W + P + j]) response.push(Number(responses.data[i * R + j]));
  return { prompt, response };
}

/** input / output text, ground truth and score per row (rollout dumps and validation samples). */
export function decodeRows(batch: DataProto, tokenizer: Tokenizer, scores: number[]): { input: string; output: string; gts: unknown; score: number }[] {
  const rm = batch.nonTensorBatch.reward_model;
  return scores.map((score, i) => {
    const { prompt, response } = rowTokens(batch, i);
    const info = rm?.[i];
    const gts = info && typeof info === "object" ? (info as Record<string, unknown>).ground_truth ?? null : null;
    return {
      input: tokenizer.decode(prompt, { skipSpecialTokens: true }),
      output: tokenizer.decode(response, { skipSpecialTokens: true }),
      gts,
      score,
    };
  });
}

/** Worker metrics (dict of per-rank lists, possibly nested) as flat number lists. */
export function flattenMetricLists(metrics: unknown): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  if (!metrics || typeof metrics !== "object") return out;
  for (const [k, v] of Object.entries(metrics as Record<string, unknown>)) {
    const flat = (Array.isArray(v) ? (v as unknown[]).flat(Infinity) : [v]).filter((x): x is number => typeof x === "number");
    out[k] = flat;
  }
  return out;
}
