// verl's SFTDataset: one (prompt, response) pair per row. The prompt is a single
// user turn rendered through the chat template with the generation prompt (the
// same ids the RL dataset gives the same question, so an SFT'd model starts RL
// where it was trained); the response is its text plus EOS. Rows are right-padded
// to data.max_length, and loss_mask is verl's: the attention mask with the prompt
// positions [0, prompt_len-1) and the last real position zeroed. Position t of
// the mask weighs the prediction of token t+1, so exactly the response tokens
// (EOS included) carry loss.
import { readFileSync } from "node:fs";
import type { ChatMessage, Tokenizer } from "../../models/tokenizer.js";
import { DataProto } from "../../protocol/data_proto.js";
import { tensor } from "../../protocol/tensor.js";
import { readParquetSync } from "../../data/parquet.js";
import { expandHome } from "../../data/home_path.js";

export type SftTruncation = "error" | "left" | "right";
export const SFT_TRUNCATIONS: readonly SftTruncation[] = ["error", "left", "right"];

export interface SftDataConfig {
  promptKey: string;
  responseKey: string;
  promptDictKeys: string[];
  responseDictKeys: string[];
  maxLength: number;
  truncation: SftTruncation;
  applyChatTemplateKwargs: Record<string, unknown>;
}

/** One tokenized, padded example: four rows of length maxLength. */
export interface SftExample {
  inputIds: Int32Array;
  attentionMask: Int32Array;
  positionIds: Int32Array;
  lossMask: Int32Array;
}

function keyList(v: unknown, key: string): string[] {
  if (v === undefined || v === null) return [];
  if (typeof v === "string") return [v];
  if (Array.isArray(v) && v.every((k) => typeof k === "string")) return v as string[];
  throw new Error(`data.${key} must be a key or a list of keys, got ${JSON.stringify(v)}`);
}

/** The `data` section of sft_trainer.yaml, checked. */
export function readSftDataConfig(data: Record<string, unknown>): SftDataConfig {
  const str = (k: string, fallback: string): string => {
    const v = data[k] ?? fallback;
    if (typeof v !== "string" || v === "") throw new Error(`data.${k} must be a column name, got ${JSON.stringify(v)}`);
    return v;
  };
  const maxLength = data.max_length ?? 1024;
  if (!Number.isInteger(maxLength) || (maxLength as number) < 2) throw new Error(`data.max_length must be an integer >= 2, got ${JSON.stringify(maxLength)}`);
  const truncation = data.truncation ?? "error";
  if (!SFT_TRUNCATIONS.includes(truncation as SftTruncation)) {
    throw new Error(`data.truncation must be one of ${SFT_TRUNCATIONS.join(", ")}, got ${JSON.stringify(truncation)}`);
  }
  const kwargs = data.apply_chat_template_kwargs ?? {};
  if (typeof kwargs !== "object" || Array.isArray(kwargs)) throw new Error(`data.apply_chat_template_kwargs must be a mapping, got ${JSON.stringify(kwargs)}`);
  return {
    promptKey: str("prompt_key", "question"),
    responseKey: str("response_key", "answer"),
    promptDictKeys: keyList(data.prompt_dict_keys, "prompt_dict_keys"),
    responseDictKeys: keyList(data.response_dict_keys, "response_dict_keys"),
    maxLength: maxLength as number,
    truncation: truncation as SftTruncation,
    applyChatTemplateKwargs: kwargs as Record<string, unknown>,
  };
}

interface SourcedRow { row: Record<string, unknown>; where: string }

export function readRows(file: string): SourcedRow[] {
  const path = expandHome(file);
  if (path.endsWith(".parquet")) return readParquetSync(path).map((row, i) => ({ row, where: `${file} row ${i}` }));
  if (path.endsWith(".jsonl") || path.endsWith(".json")) {
    let text: string;
    try { text = readFileSync(path, "utf8"); } catch (e) { throw new Error(`cannot read ${file}: ${(e as Error).message}`); }
    const out: SourcedRow[] = [];
    text.split("\n").forEach((line, i) => {
      if (line.trim() === "") return;
      try { out.push({ row: JSON.parse(line) as Record<string, unknown>, where: `${file}:${i + 1}` }); } catch (e) {
        throw new Error(`${file}:${i + 1}: not valid JSON (${(e as Error).message})`);
      }
    });
    return out;
  }
  throw new Error(`unsupported data file format: ${file} (use .parquet or JSON lines .jsonl)`);
}

/** row[column][k1][k2]...: the column, then each dict key in turn (verl's prompt_dict_keys). */
export function pickField(row: Record<string, unknown>, column: string, dictKeys: string[], where: string, configKey: string): unknown {
  if (!(column in row)) throw new Error(`${where}: no column '${column}' (data.${configKey}); columns: ${Object.keys(row).join(", ")}`);
  let v: unknown = row[column];
  let path = column;
  for (const k of dictKeys) {
    if (v === null || typeof v !== "object" || Array.isArray(v)) throw new Error(`${where}: '${path}' is not a mapping, so it has no key '${k}'`);
    const obj = v as Record<string, unknown>;
    if (!(k in obj)) throw new Error(`${where}: '${path}' has no key '${k}' (keys: ${Object.keys(obj).join(", ")})`);
    v = obj[k];
    path += `.${k}`;
  }
  return v;
}

/** A prompt field as chat messages: a string is one user turn; a list of {role, content} is used as is. */
export function promptMessages(v: unknown, where: string): ChatMessage[] {
  if (typeof v === "string") return [{ role: "user", content: v }];
  if (Array.isArray(v) && v.length > 0 && v.every((m) => m !== null && typeof m === "object" && typeof (m as ChatMessage).role === "string" && typeof (m as ChatMessage).content === "string")) {
    return v.map((m) => ({ ...(m as ChatMessage) }));
  }
  throw new Error(`${where}: the prompt must be a string or a list of {role, content} messages, got ${JSON.stringify(v)?.slice(0, 80)}`);
}

/** Prompt ids as the RL dataset makes them: chat template + generation prompt, or contents with BOS when there is no template. */
export function sftPromptIds(tokenizer: Tokenizer, messages: ChatMessage[], kwargs: Record<string, unknown>): number[] {
  if (!tokenizer.hasChatTemplate) return tokenizer.encode(messages.map((m) => m.content).join("\n"), { addSpecialTokens: true });
  return tokenizer.encode(tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true, kwargs }), { addSpecialTokens: false });
}

/**
 * Concatenate, pad or truncate to maxLength, and build the masks exactly as verl's
 * SFTDataset.__getitem__ does (position ids: cumsum(mask) - 1, clipped at 0).
 */
export function buildSftExample(
  promptIds: readonly number[], responseIds: readonly number[],
  opts: { maxLength: number; padTokenId: number; truncation: SftTruncation; where: string },
): SftExample {
  const L = opts.maxLength;
  let ids = [...promptIds, ...responseIds];
  let attn = ids.map(() => 1);
  if (ids.length > L) {
    if (opts.truncation === "error") {
      throw new Error(`${opts.where}: prompt + response is ${ids.length} tokens, longer than data.max_length=${L} (raise data.max_length or set data.truncation=left|right)`);
    }
    ids = opts.truncation === "left" ? ids.slice(ids.length - L) : ids.slice(0, L);
    attn = attn.slice(0, L);
  }
  const ex: SftExample = {
    inputIds: new Int32Array(L).fill(opts.padTokenId),
    attentionMask: new Int32Array(L),
    positionIds: new Int32Array(L),
    lossMask: new Int32Array(L),
  };
  ex.inputIds.set(ids);
  ex.attentionMask.set(attn);
  let c = 0;
  for (let t = 0; t < L; t++) {
    c += ex.attentionMask[t]!;
    ex.positionIds[t] = Math.max(0, c - 1);
  }
  ex.lossMask.set(ex.attentionMask);
  const P = promptIds.length, R = responseIds.length;
  if (P > 1) ex.lossMask.fill(0, 0, Math.min(P, L) - 1);
  ex.lossMask[Math.min(P + R, L) - 1] = 0;
  return ex;
}

/** Rows -> DataProto of [B, maxLength] int32 tensors: input_ids, attention_mask, position_ids, loss_mask. */
export function collateSft(examples: SftExample[], maxLength: number): DataProto {
  const B = examples.length;
  const cat = (pick: (e: SftExample) => Int32Array) => {
    const out = new Int32Array(B * maxLength);
    examples.forEach((e, i) => out.set(pick(e), i * maxLength));
    return tensor(out, [B, maxLength], "int32");
  };
  return new DataProto({
    input_ids: cat((e) => e.inputIds),
    attention_mask: cat((e) => e.attentionMask),
    position_ids: cat((e) => e.positionIds),
    loss_mask: cat((e) => e.lossMask),
  });
}

export class SFTDataset {
  readonly config: SftDataConfig;
  private readonly prompts: ChatMessage[][] = [];
  private readonly responses: string[] = [];
  private readonly where: string[] = [];

  constructor(files: string[], readonly tokenizer: Tokenizer, data: Record<string, unknown>) {
    this.config = readSftDataConfig(data);
    const c = this.config;
    for (const { row, where } of files.flatMap(readRows)) {
      const prompt = pickField(row, c.promptKey, c.promptDictKeys, where, "prompt_key");
      const response = pickField(row, c.responseKey, c.responseDictKeys, where, "response_key");
      if (typeof response !== "string") throw new Error(`${where}: the response must be a string, got ${JSON.stringify(response)?.slice(0, 80)}`);
      this.prompts.push(promptMessages(prompt, where));
      this.responses.push(response);
      this.where.push(where);
    }
    if (this.prompts.length === 0) throw new Error(`no rows in ${files.join(", ")}`);
  }

  get length(): number {
    return this.prompts.length;
  }

  /** The prompt and response ids of row i, before padding. */
  tokens(i: number): { prompt: number[]; response: number[] } {
    const tok = this.tokenizer;
    const where = this.where[i]!;
    try {
      return {
        prompt: sftPromptIds(tok, this.prompts[i]!, this.config.applyChatTemplateKwargs),
        response: [...tok.encode(this.responses[i]!, { addSpecialTokens: false }), tok.eosTokenId],
      };
    } catch (e) {
      throw new Error(`${where}: cannot tokenize: ${(e as Error).message}`);
    }
  }

  get(i: number): SftExample {
    if (!Number.isInteger(i) || i < 0 || i >= this.length) throw new Error(`SFTDataset: index ${i} out of range for ${this.length} rows`);
    const { prompt, response } = this.tokens(i);
    return buildSftExample(prompt, response, {
      maxLength: this.config.maxLength, padTokenId: this.tokenizer.padTokenId, truncation: this.config.truncation, where: this.where[i]!,
    });
  }

  collate(rows: SftExample[]): DataProto {
    return collateSft(rows, this.config.maxLength);
  }
}
