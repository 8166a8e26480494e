// Chat templating for the agent loops. Turns appended mid-conversation (tool
// results, user replies) are templated on their own, and the default system
// prompt some templates insert (Qwen's "You are Qwen...") is cut off, as
// verl's remove_system_prompt does; we cut it as text, found by templating one
// and two empty user turns and taking what precedes the first.
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";

export interface TemplateOptions {
  tools?: unknown[];
  /** data.apply_chat_template_kwargs. */
  kwargs?: Record<string, unknown>;
  removeSystemPrompt?: boolean;
}

const systemPrompts = new WeakMap<Tokenizer, Map<string, string>>();

/** The text a template puts before the first message when there is no system message. */
export function defaultSystemPromptText(tokenizer: Tokenizer, kwargs: Record<string, unknown> = {}): string {
  let perKwargs = systemPrompts.get(tokenizer);
  if (!perKwargs) {
    perKwargs = new Map();
    systemPrompts.set(tokenizer, perKwargs);
  }
  const key = JSON.stringify(kwargs);
  let text = perKwargs.get(key);
  if (text === undefined) {
    const empty: ChatMessage = { role: "user", content: "" };
    const one = tokenizer.applyChatTemplate([empty], { addGenerationPrompt: false, kwargs });
    const two = tokenizer.applyChatTemplate([empty, empty], { addGenerationPrompt: false, kwargs });
    const turn = two.length - one.length;
    text = turn > 0 && turn <= one.length ? one.slice(0, one.length - turn) : "";
    perKwargs.set(key, text);
  }
  return text;
}

/** Token ids of the chat-templated messages with the generation prompt appended. */
export function chatTemplateIds(tokenizer: Tokenizer, messages: ChatMessage[], opts: TemplateOptions = {}): number[] {
  const kwargs = opts.kwargs ?? {};
  let text = tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true, tools: opts.tools, kwargs });
  if (opts.removeSystemPrompt) {
    const sys = defaultSystemPromptText(tokenizer, kwargs);
    if (sys && text.startsWith(sys)) text = text.slice(sys.length);
  }
  // The template spells out any special tokens itself (transformers' tokenize=True adds none either).
  return tokenizer.encode(text, { addSpecialTokens: false });
}

/** The row's raw_prompt as chat messages; errors name the row. */
export function rowMessages(raw: unknown, rowIndex: number): ChatMessage[] {
  if (!Array.isArray(raw)) throw new Error(`row ${rowIndex}: raw_prompt must be a list of {role, content} messages`);
  return raw.map((m: unknown, i) => {
    if (m === null || typeof m !== "object" || typeof (m as ChatMessage).role !== "string") {
      throw new Error(`row ${rowIndex}: raw_prompt[${i}] needs a string 'role'`);
    }
    return { ...(m as ChatMessage) };
  });
}
