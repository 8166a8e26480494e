// `verl generate` (verl's main_generation): read prompts from a parquet file,
// sample data.n_samples responses per row and write the rows back, every
// original column kept, with a `responses` column (a list of strings).
import { existsSync, statSync } from "node:fs";
import { dirname } from "node:path";
import { getPath, type Config } from "../../config/index.js";
import { collateToDataProto, truncateIds } from "../../data/collate.js";
import type { Truncation } from "../../data/data_config.js";
import { expandHome } from "../../data/home_path.js";
import { readParquet, writeParquet } from "../../data/parquet.js";
import { createProgress } from "../../data/progress.js";
import { initBackend } from "../../engine/backend.js";
import { loadModel } from "../../models/load.js";
import type { ChatMessage, Tokenizer } from "../../models/tokenizer.js";
import { loadTokenizer } from "../../models/tokenizers/index.js";
import { generate } from "../../rollout/generate.js";
import { readParamsForDecode } from "../../rollout/decode_weights.js";
import { isGreedy, type SamplingParams } from "../../rollout/sampling.js";
import { logger } from "../../utils/logger.js";
import { Rng } from "../../utils/rng.js";
import { CliError, type CommandContext } from "../context.js";

function get(config: Config, key: string, fallback?: unknown): unknown {
  const v = getPath(config, key);
  return v === undefined || v === null ? fallback : v;
}

function str(config: Config, key: string, fallback?: string): string {
  const v = get(config, key, fallback);
  if (typeof v !== "string" || v === "") throw new CliError(`${key} must be set to a non-empty string (got ${JSON.stringify(v)})`, 2);
  return v;
}

function num(config: Config, key: string, fallback?: number, opts: { int?: boolean; min?: number } = {}): number {
  const v = get(config, key, fallback);
  if (typeof v !== "number" || !Number.isFinite(v) || (opts.int && !Number.isInteger(v)) || (opts.min !== undefined && v < opts.min)) {
    throw new CliError(`${key} must be ${opts.int ? "an integer" : "a number"}${opts.min !== undefined ? ` >= ${opts.min}` : ""} (got ${JSON.stringify(v)})`, 2);
  }
  return v;
}

/** Prompt token ids of one row: chat messages through the chat template, or plain text. */
export function promptIds(value: unknown, tok: Tokenizer, where: string): number[] {
  if (typeof value === "string") return tok.encode(value, { addSpecialTokens: true });
  if (!Array.isArray(value) || value.length === 0) throw new Error(`${where}: the prompt must be a string or a non-empty list of chat messages`);
  const messages = value.map((m, i) => {
    const msg = m as ChatMessage;
    if (msg === null || typeof msg !== "object" || typeof msg.role !== "string" || typeof msg.content !== "string") {
      throw new Error(`${where}: message ${i} must be {role: string, content: string}`);
    }
    return msg;
  });
  if (!tok.hasChatTemplate) return tok.encode(messages.map((m) => m.content).join("\n"), { addSpecialTokens: true });
  return tok.encode(tok.applyChatTemplate(messages, { addGenerationPrompt: true }), { addSpecialTokens: false });
}

export async function run(ctx: CommandContext): Promise<void> {
  const { config } = ctx;
  const log = logger();
  const dataPath = expandHome(str(config, "data.path"));
  const outputPath = expandHome(str(config, "data.output_path"));
  const promptKey = str(config, "data.prompt_key", "prompt");
  const nSamples = num(config, "data.n_samples", 1, { int: true, min: 1 }) * num(config, "rollout.n", 1, { int: true, min: 1 });
  const batchSize = num(config, "data.batch_size", 128, { int: true, min: 1 });
  const modelPath = expandHome(str(config, "model.path"));
  const params: SamplingParams = {
    temperature: num(config, "rollout.temperature", 1, { min: 0 }),
    topK: num(config, "rollout.top_k", -1, { int: true }),
    topP: num(config, "rollout.top_p", 1),
    doSample: get(config, "rollout.do_sample", true) !== false,
    responseLength: num(config, "rollout.response_length", 512, { int: true, min: 1 }),
    eosTokenIds: [],
    padTokenId: 0,
    calculateLogProbs: false,
    n: nSamples,
  };
  if (isGreedy(params) && nSamples > 1) throw new CliError(`greedy decoding (temperature 0 or do_sample=false) gives identical samples: set data.n_samples=1 (got ${nSamples})`, 2);
  const promptLength = num(config, "rollout.prompt_length", 1536, { int: true, min: 1 });
  const truncation = str(config, "data.truncation", "error") as Truncation;

  const backend = await initBackend(String(get(config, "trainer.device", "auto")));
  const model = await loadModel(modelPath);
  await readParamsForDecode(model); // the host decoder's weight copy, read asynchronously (WebGPU has no sync read)
  const tokPath = get(config, "model.tokenizer_path");
  const tok = await loadTokenizer(typeof tokPath === "string" ? expandHome(tokPath) : statSync(modelPath).isFile() ? dirname(modelPath) : modelPath);
  params.eosTokenIds = [...tok.eosTokenIds];
  params.padTokenId = tok.padTokenId;
  const rng = new Rng(num(config, "trainer.seed", 42, { int: true }));

  if (!existsSync(dataPath)) throw new CliError(`data.path ${dataPath} does not exist`, 2);
  const rows = await readParquet(dataPath);
  if (rows.length === 0) throw new CliError(`${dataPath} has no rows`, 2);
  log.info({ rows: rows.length, model: modelPath, backend, n_samples: nSamples, response_length: params.responseLength }, "generating");
  const progress = createProgress("generate", rows.length);
  const out: Record<string, unknown>[] = [];
  let generated = 0;
  const t0 = Date.now();
  try {
    for (let r0 = 0; r0 < rows.length; r0 += batchSize) {
      const chunk = rows.slice(r0, r0 + batchSize);
      const withIds = chunk.map((row, i) => {
        const where = `${dataPath} row ${r0 + i}`;
        if (!(promptKey in row)) throw new CliError(`${where}: no column '${promptKey}' (data.prompt_key)`, 2);
        let ids: number[];
        try {
          ids = truncateIds(promptIds(row[promptKey], tok, where), promptLength, truncation, where);
        } catch (e) {
          throw new CliError((e as Error).message, 2);
        }
        return { input_ids: ids };
      });
      const P = Math.max(...withIds.map((r) => r.input_ids.length));
      const batch = collateToDataProto(withIds, { maxPromptLength: P, padTokenId: tok.padTokenId });
      const rowsNow = `rows ${r0 + 1}-${r0 + chunk.length}`;
      const result = generate(model, batch, params, rng, { onStep: (t, of) => progress.status(`${rowsNow}: token ${t}/${of}`) });
      const R = params.responseLength, resp = result.batch["responses"]!.data, mask = result.batch["response_mask"]!.data;
      chunk.forEach((row, i) => {
        const texts: string[] = [];
        for (let s = 0; s < nSamples; s++) {
          const b = i * nSamples + s, ids: number[] = [];
          for (let t = 0; t < R && mask[b * R + t]; t++) ids.push(resp[b * R + t]!);
          generated += ids.length;
          texts.push(tok.decode(ids, { skipSpecialTokens: true }));
        }
        out.push({ ...row, responses: texts });
      });
      progress.tick(chunk.length);
    }
  } finally {
    model.dispose();
  }
  const secs = (Date.now() - t0) / 1000;
  progress.done(`(${generated} tokens, ${(generated / Math.max(secs, 1e-9)).toFixed(0)} tokens/s)`);
  await writeParquet(outputPath, out);
  log.info({ output: outputPath, rows: out.length }, "wrote generations");
}
