// RL prompts from parquet (or JSON-lines) files, as verl's RLHFDataset: keeps the
// chat messages as `raw_prompt`, optionally drops prompts longer than
// data.max_prompt_length, and (with a tokenizer) gives each row its prompt ids:
// the chat template with the generation prompt, or the message contents joined
// by newlines when the tokenizer has no template (then BOS is added where the
// tokenizer uses one, since no template supplies it).
import { readDataRows, type SourcedRow } from "./data_rows.js";
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import type { DataProto } from "../protocol/data_proto.js";
import { Rng } from "../utils/rng.js";
import { logger } from "../utils/logger.js";
import { readDataConfig, type RLDataConfig } from "./data_config.js";
import { collateToDataProto, truncateIds } from "./collate.js";

export interface RLRow extends Record<string, unknown> {
  raw_prompt: ChatMessage[];
  /** Prompt token ids (chat-templated), when the dataset has a tokenizer. */
  input_ids?: number[];
  /** extra_info.index, or 0. */
  index: number;
  extra_info: Record<string, unknown>;
  tools_kwargs: Record<string, unknown>;
  interaction_kwargs: Record<string, unknown>;
}

export interface RLHFDatasetOptions {
  /** train_max_samples / val_max_samples: keep this many rows (-1 = all). */
  maxSamples?: number;
  /** Tool schemas rendered into the chat template (verl's tool_config_path). */
  tools?: unknown[];
}


function checkMessages(row: Record<string, unknown>, key: string, where: string): ChatMessage[] {
  if (!(key in row)) {
    throw new Error(`${where}: data.prompt_key=${key} is not a column of this file; its columns are ${Object.keys(row).join(", ")}`);
  }
  const v = row[key];
  if (!Array.isArray(v) || v.length === 0) throw new Error(`${where}: '${key}' must be a non-empty list of chat messages`);
  return v.map((m, i) => {
    const msg = m as ChatMessage;
    if (msg === null || typeof msg !== "object" || typeof msg.role !== "string" || typeof msg.content !== "string") {
      throw new Error(`${where}: '${key}'[${i}] must be {role: string, content: string}`);
    }
    return { ...msg };
  });
}

/** Rows whose reward_model holds a null ground truth: the built-in scorers refuse them at scoring time, so say so at load. */
function warnNullGroundTruth(rows: SourcedRow[]): void {
  const nulls = rows.filter(({ row }) => {
    const rm = row.reward_model;
    return rm !== null && typeof rm === "object" && !Array.isArray(rm) && (rm as Record<string, unknown>).ground_truth == null;
  });
  if (nulls.length === 0) return;
  const shown = nulls.slice(0, 5).map((r) => r.where).join("; ");
  logger().warn(`${nulls.length} row(s) have a null reward_model.ground_truth (${shown}${nulls.length > 5 ? "; ..." : ""}): `
    + "the built-in scorers refuse such rows; only a custom_reward_function or a reward model can score them");
}

const asObject = (v: unknown): Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : {};

/** A prompt's ids as RLHFDataset makes them: the chat template with the generation prompt, else the
 *  contents joined by newlines with the tokenizer's special tokens. `where` names the row in errors. */
export function promptTokenIds(tok: Tokenizer, messages: ChatMessage[], config: RLDataConfig, tools: unknown[] | undefined, where: string): number[] {
  try {
    if (!tok.hasChatTemplate) return tok.encode(messages.map((m) => m.content).join("\n"), { addSpecialTokens: true });
    const text = tok.applyChatTemplate(messages, { addGenerationPrompt: true, tools, kwargs: config.applyChatTemplateKwargs });
    return tok.encode(text, { addSpecialTokens: false });
  } catch (e) {
    throw new Error(`${where}: cannot tokenize the prompt: ${(e as Error).message}`);
  }
}

export class RLHFDataset {
  readonly config: RLDataConfig;
  private readonly rows: SourcedRow[];
  private readonly ids: (number[] | undefined)[];

  constructor(files: string | string[], readonly tokenizer: Tokenizer | null, dataConfig: Record<string, unknown> = {}, readonly opts: RLHFDatasetOptions = {}) {
    this.config = readDataConfig(dataConfig);
    const fileList = typeof files === "string" ? [files] : files;
    let rows = fileList.flatMap(readDataRows);
    if (rows.length === 0) throw new Error(`${fileList.join(", ")}: no rows (the file holds a schema but 0 rows); give a file with at least one prompt`);
    rows.forEach((r) => checkMessages(r.row, this.config.promptKey, r.where));
    warnNullGroundTruth(rows);
    const max = opts.maxSamples ?? -1;
    if (max > 0 && max < rows.length) {
      const pick = this.config.shuffle ? new Rng(this.config.seed).permutation(rows.length).slice(0, max) : [...Array(max).keys()];
      rows = pick.map((i) => rows[i]!);
      logger().info(`selected ${max} of the rows of ${String(files)}`);
    }
    let ids: (number[] | undefined)[] = rows.map(() => undefined);
    if (this.config.filterOverlongPrompts) {
      if (!tokenizer) throw new Error("data.filter_overlong_prompts needs a tokenizer to measure prompts");
      ids = rows.map((r) => this.promptIds(r));
      const keep = ids.map((x) => x!.length <= this.config.maxPromptLength);
      const before = rows.length;
      rows = rows.filter((_, i) => keep[i]);
      ids = ids.filter((_, i) => keep[i]);
      logger().info(`filtered prompts longer than ${this.config.maxPromptLength} tokens: ${before} -> ${rows.length} rows`);
    }
    this.rows = rows;
    this.ids = ids;
  }

  get length(): number {
    return this.rows.length;
  }

  /** Chat-templated prompt ids of one row, untruncated. */
  private promptIds(r: SourcedRow): number[] {
    return promptTokenIds(this.tokenizer!, checkMessages(r.row, this.config.promptKey, r.where), this.config, this.opts.tools, r.where);
  }

  get(i: number): RLRow {
    if (!Number.isInteger(i) || i < 0 || i >= this.rows.length) throw new Error(`RLHFDataset: index ${i} out of range for ${this.rows.length} rows`);
    const src = this.rows[i]!;
    const extra = asObject(src.row.extra_info);
    const out: RLRow = {
      ...src.row,
      raw_prompt: checkMessages(src.row, this.config.promptKey, src.where),
      extra_info: extra,
      index: typeof extra.index === "number" ? extra.index : 0,
      tools_kwargs: asObject(extra.tools_kwargs),
      interaction_kwargs: asObject(extra.interaction_kwargs),
    };
    const needTools = typeof extra.need_tools_kwargs === "boolean" ? extra.need_tools_kwargs : this.config.needToolsKwargs;
    if (needTools && Object.keys(out.tools_kwargs).length === 0) logger().warn(`${src.where}: tools_kwargs is empty but tools need them`);
    if (this.tokenizer) {
      const ids = this.ids[i] ?? this.promptIds(src);
      out.input_ids = truncateIds(ids, this.config.maxPromptLength, this.config.truncation, src.where);
    }
    return out;
  }

  /** The DataProto for a batch of this dataset's rows. */
  collate(rows: RLRow[]): DataProto {
    return collateToDataProto(rows, {
      maxPromptLength: this.config.maxPromptLength,
      padTokenId: this.tokenizer?.padTokenId ?? 0,
      truncation: this.config.truncation,
    });
  }
}
