// Chat templates are real Jinja (Hugging Face's @huggingface/jinja), rendered
// with the variables transformers passes: messages, add_generation_prompt,
// tools (null when absent, like Python's None), the special-token strings,
// then the caller's extra kwargs (which win, as in apply_chat_template).
import { Template } from "@huggingface/jinja";
import type { ChatMessage, ChatTemplateOptions } from "../tokenizer.js";

const compiled = new Map<string, Template>();

function compile(source: string): Template {
  let t = compiled.get(source);
  if (!t) {
    try {
      t = new Template(source);
    } catch (e) {
      throw new Error(`chat template does not parse: ${(e as Error).message}`);
    }
    compiled.set(source, t);
  }
  return t;
}

/** Throws a clear error where a template does not parse (checked when a run starts, not at the first prompt). */
export function checkChatTemplate(source: string): void {
  compile(source);
}

export function renderChatTemplate(
  source: string,
  messages: ChatMessage[],
  opts: ChatTemplateOptions,
  specialTokens: Record<string, string | null>,
): string {
  if (!Array.isArray(messages)) throw new Error("applyChatTemplate: messages must be an array of {role, content}");
  messages.forEach((m, i) => {
    if (typeof m !== "object" || m === null || typeof m.role !== "string") {
      throw new Error(`applyChatTemplate: message ${i} needs a string 'role' (got ${JSON.stringify(m)})`);
    }
  });
  const vars: Record<string, unknown> = {
    ...specialTokens,
    messages,
    add_generation_prompt: opts.addGenerationPrompt ?? false,
    tools: opts.tools && opts.tools.length > 0 ? opts.tools : null,
    ...(opts.kwargs ?? {}),
  };
  try {
    return compile(source).render(vars);
  } catch (e) {
    throw new Error(`chat template failed to render: ${(e as Error).message}`);
  }
}
