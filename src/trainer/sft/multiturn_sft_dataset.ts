// verl's MultiTurnSFTDataset: one conversation per row (a list of {role, content, ...}
// messages in data.messages_key, optional tools and enable_thinking columns), rendered
// through the chat template one message at a time so each token knows its turn. Loss
// falls on the assistant turns only: every token an assistant message renders to,
// except its generation prompt (e.g. "<|im_start|>assistant\n"); system, user and tool
// turns carry none. Each message after the first drops the template's default system
// prompt (which rendering a lone message adds again); the concatenation must equal
// the whole conversation rendered at once (data.ignore_input_ids_mismatch=true accepts
// a difference). Loss masks here weigh the prediction of token t+1 from position t
// (as sft_dataset.ts), so verl's per-token mask is shifted left by one.
import type { ChatMessage, Tokenizer } from "../../models/tokenizer.js";
import { DataProto } from "../../protocol/data_proto.js";
import { readDataRows } from "../../data/data_rows.js";
import { collateSft, SFT_TRUNCATIONS, type SftExample, type SftTruncation } from "./sft_dataset.js";

export const SFT_PAD_MODES = ["right", "no_padding"] as const;
export type SftPadMode = (typeof SFT_PAD_MODES)[number];

export interface MultiTurnConfig {
  messagesKey: string;
  toolsKey: string;
  enableThinkingKey: string;
  maxLength: number;
  truncation: SftTruncation;
  padMode: SftPadMode;
  applyChatTemplateKwargs: Record<string, unknown>;
  ignoreInputIdsMismatch: boolean;
}

/**
 * The settings from the data section: the engine layout keeps the keys at data.* (messages_key,
 * pad_mode, ...), the legacy sft_trainer under data.multiturn.* (`where` names that prefix).
 */
export function readMultiTurnConfig(data: Record<string, unknown>, keys: Record<string, unknown>, where: string): MultiTurnConfig {
  const col = (k: string, fallback: string): string => {
    const v = keys[k] ?? fallback;
    if (typeof v !== "string" || v === "") throw new Error(`${where}.${k} must be a column name, got ${JSON.stringify(v)}`);
    return v;
  };
  const maxLength = data.max_length ?? 1024;
  if (!Number.isInteger(maxLength) || (maxLength as number) < 2) throw new Error(`data.max_length must be an integer >= 2, got ${JSON.stringify(maxLength)}`);
  const truncation = data.truncation ?? "error";
  if (!SFT_TRUNCATIONS.includes(truncation as SftTruncation)) throw new Error(`data.truncation must be one of ${SFT_TRUNCATIONS.join(", ")}, got ${JSON.stringify(truncation)}`);
  const padMode = data.pad_mode ?? "right";
  if (!SFT_PAD_MODES.includes(padMode as SftPadMode)) throw new Error(`data.pad_mode must be one of ${SFT_PAD_MODES.join(", ")}, got ${JSON.stringify(padMode)}`);
  const kwargs = data.apply_chat_template_kwargs ?? {};
  if (typeof kwargs !== "object" || Array.isArray(kwargs)) throw new Error(`data.apply_chat_template_kwargs must be a mapping, got ${JSON.stringify(kwargs)}`);
  return {
    messagesKey: col("messages_key", "messages"), toolsKey: col("tools_key", "tools"), enableThinkingKey: col("enable_thinking_key", "enable_thinking"),
    maxLength: maxLength as number, truncation: truncation as SftTruncation, padMode: padMode as SftPadMode,
    applyChatTemplateKwargs: kwargs as Record<string, unknown>, ignoreInputIdsMismatch: data.ignore_input_ids_mismatch === true,
  };
}

interface Conversation { messages: ChatMessage[]; tools?: unknown[]; enableThinking?: boolean; where: string }

function conversation(row: Record<string, unknown>, c: MultiTurnConfig, where: string): Conversation {
  if (!(c.messagesKey in row)) throw new Error(`${where}: no column '${c.messagesKey}' (data messages_key); columns: ${Object.keys(row).join(", ")}`);
  const msgs = row[c.messagesKey];
  if (!Array.isArray(msgs) || msgs.length === 0) throw new Error(`${where}: '${c.messagesKey}' must be a non-empty list of messages`);
  msgs.forEach((m, i) => {
    if (m === null || typeof m !== "object" || typeof (m as ChatMessage).role !== "string") {
      throw new Error(`${where}: message ${i} of '${c.messagesKey}' must be a mapping with a string 'role', got ${JSON.stringify(m)?.slice(0, 80)}`);
    }
  });
  const out: Conversation = { messages: msgs.map((m) => ({ ...(m as ChatMessage) })), where };
  const tools = row[c.toolsKey];
  if (tools !== undefined && tools !== null) {
    const list = typeof tools === "string" ? (JSON.parse(tools) as unknown) : tools;
    if (!Array.isArray(list)) throw new Error(`${where}: '${c.toolsKey}' must be a list of tool schemas`);
    out.tools = list;
  }
  const think = row[c.enableThinkingKey];
  if (think !== undefined && think !== null) out.enableThinking = Boolean(think);
  return out;
}

/** verl's extract_system_prompt_and_generation: the template's default system prompt and its generation prompt, as ids. */
export function systemAndGenerationPrompt(tok: Tokenizer, kwargs: Record<string, unknown>): { system: number[]; generation: number[] } {
  const enc = (messages: ChatMessage[], addGenerationPrompt: boolean) =>
    tok.encode(tok.applyChatTemplate(messages, { addGenerationPrompt, kwargs }), { addSpecialTokens: false });
  const empty: ChatMessage = { role: "user", content: "" };
  const one = enc([empty], false), two = enc([empty, empty], false), gen = enc([empty], true);
  const turn = two.length - one.length;
  return { system: turn > 0 ? one.slice(0, one.length - turn) : [], generation: gen.slice(one.length) };
}

/** Token ids and verl's per-token loss mask (1 on assistant tokens past the generation prompt) of one conversation. */
export function tokenizeConversation(tok: Tokenizer, conv: Conversation, c: MultiTurnConfig, prompts: { system: number[]; generation: number[] }): { ids: number[]; tokenMask: number[] } {
  const kwargs = { ...c.applyChatTemplateKwargs, ...(conv.enableThinking !== undefined ? { enable_thinking: conv.enableThinking } : {}) };
  const ids: number[] = [], tokenMask: number[] = [];
  conv.messages.forEach((m, i) => {
    let part = tok.encode(tok.applyChatTemplate([m], { addGenerationPrompt: false, kwargs, ...(i === 0 && conv.tools ? { tools: conv.tools } : {}) }), { addSpecialTokens: false });
    if (i !== 0 && m.role !== "system") part = part.slice(prompts.system.length);
    ids.push(...part);
    tokenMask.push(...part.map((_, t) => (m.role === "assistant" && t >= prompts.generation.length ? 1 : 0)));
  });
  const whole = tok.encode(tok.applyChatTemplate(conv.messages, { addGenerationPrompt: false, kwargs, ...(conv.tools ? { tools: conv.tools } : {}) }), { addSpecialTokens: false });
  if (!c.ignoreInputIdsMismatch && (whole.length !== ids.length || whole.some((x, t) => x !== ids[t]))) {
    throw new Error(
      `${conv.where}: the chat template rendered one message at a time (${ids.length} tokens) differs from the whole conversation (${whole.length} tokens); ` +
      "multi-turn SFT needs them equal to find each turn (set data.ignore_input_ids_mismatch=true to train on the per-message ids)",
    );
  }
  return { ids, tokenMask };
}

/** Pad or truncate to maxLength as verl does (no_padding truncates on the right, whatever data.truncation says). */
export function buildMultiTurnExample(ids: number[], tokenMask: number[], c: MultiTurnConfig, padTokenId: number, where: string): SftExample {
  const L = c.maxLength;
  let x = ids, m = tokenMask;
  if (x.length > L) {
    const side = c.padMode === "no_padding" ? "right" : c.truncation;
    if (side === "error") throw new Error(`${where}: the conversation is ${x.length} tokens, longer than data.max_length=${L} (raise data.max_length or set data.truncation=left|right)`);
    [x, m] = side === "left" ? [x.slice(x.length - L), m.slice(m.length - L)] : [x.slice(0, L), m.slice(0, L)];
  }
  const ex: SftExample = { inputIds: new Int32Array(L).fill(padTokenId), attentionMask: new Int32Array(L), positionIds: new Int32Array(L), lossMask: new Int32Array(L) };
  ex.inputIds.set(x);
  for (let t = 0; t < x.length; t++) {
    ex.attentionMask[t] = 1;
    ex.positionIds[t] = t;
    // position t predicts token t+1: it carries loss when token t+1 does
    if (t + 1 < x.length) ex.lossMask[t] = m[t + 1]!;
  }
  return ex;
}

export class MultiTurnSFTDataset {
  private readonly rows: Conversation[] = [];
  private readonly prompts: { system: number[]; generation: number[] };

  constructor(files: string[], readonly tokenizer: Tokenizer, readonly config: MultiTurnConfig) {
    if (!tokenizer.hasChatTemplate) throw new Error("multi-turn SFT renders conversations with the chat template, and this tokenizer has none (set data.chat_template or model.custom_chat_template)");
    for (const { row, where } of files.flatMap((f) => readDataRows(f))) this.rows.push(conversation(row, config, where));
    if (this.rows.length === 0) throw new Error(`no rows in ${files.join(", ")}`);
    this.prompts = systemAndGenerationPrompt(tokenizer, config.applyChatTemplateKwargs);
  }

  get length(): number {
    return this.rows.length;
  }

  /** The ids and verl's per-token loss mask of row i, before padding. */
  tokens(i: number): { ids: number[]; tokenMask: number[] } {
    const conv = this.rows[i]!;
    try {
      return tokenizeConversation(this.tokenizer, conv, this.config, this.prompts);
    } catch (e) {
      const msg = (e as Error).message;
      throw new Error(msg.startsWith(conv.where) ? msg : `${conv.where}: cannot tokenize: ${msg}`);
    }
  }

  get(i: number): SftExample {
    if (!Number.isInteger(i) || i < 0 || i >= this.length) throw new Error(`MultiTurnSFTDataset: index ${i} out of range for ${this.length} rows`);
    const { ids, tokenMask } = this.tokens(i);
    return buildMultiTurnExample(ids, tokenMask, this.config, this.tokenizer.padTokenId, this.rows[i]!.where);
  }

  collate(rows: SftExample[]): DataProto {
    return collateSft(rows, this.config.maxLength);
  }
}
