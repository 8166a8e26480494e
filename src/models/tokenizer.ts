// One interface for every tokenizer: llama2.c's tok512.bin, Hugging Face
// tokenizer.json, and the character-level tokenizer of the synthetic task.

export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool" | string;
  content: string;
  tool_calls?: unknown[];
  [k: string]: unknown;
}

export interface ChatTemplateOptions {
  addGenerationPrompt?: boolean;
  /** OpenAI function schemas rendered into the template where it supports tools. */
  tools?: unknown[];
  /** Extra variables passed to the template (verl's apply_chat_template_kwargs). */
  kwargs?: Record<string, unknown>;
}

export interface Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenId: number;
  /** The ids that end generation: generation_config.json's eos_token_id (int or list), else [eosTokenId]. */
  readonly eosTokenIds: number[];
  readonly padTokenId: number;
  /** Encode text. `addSpecialTokens` adds BOS where the tokenizer uses one. */
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
  decode(ids: ArrayLike<number>, opts?: { skipSpecialTokens?: boolean }): string;
  /** True when a chat template is available (from tokenizer_config.json or the built-in one). */
  readonly hasChatTemplate: boolean;
  /** Render messages through the chat template to text. Throws if there is none. */
  applyChatTemplate(messages: ChatMessage[], opts?: ChatTemplateOptions): string;
  /** The same tokenizer with `source` (Jinja) as its chat template, as verl's model.custom_chat_template sets it. */
  withChatTemplate(source: string): Tokenizer;
  /** Save tokenizer files into a Hugging Face folder (tokenizer.json etc.), where the format allows. */
  saveTo?(dir: string): void;
}
