// Small test doubles for the data tests: a real (if tiny) character tokenizer.
import type { ChatMessage, ChatTemplateOptions, Tokenizer } from "../../src/models/tokenizer.js";

/** ids: pad 0, bos 1, eos 2, then code point + 3. With `template`, renders "<role>:content\n" lines
 *  and "assistant:" for the generation prompt. */
export class TinyTokenizer implements Tokenizer {
  readonly vocabSize = 0x110000 + 3;
  readonly bosTokenId = 1;
  readonly eosTokenId = 2;
  readonly eosTokenIds = [2];
  readonly padTokenId = 0;
  constructor(readonly hasChatTemplate: boolean) {}
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[] {
    const ids = Array.from(text, (c) => c.codePointAt(0)! + 3);
    return opts?.addSpecialTokens ? [this.bosTokenId, ...ids] : ids;
  }
  decode(ids: ArrayLike<number>): string {
    return Array.from(ids).filter((i) => i > 2).map((i) => String.fromCodePoint(i - 3)).join("");
  }
  applyChatTemplate(messages: ChatMessage[], opts?: ChatTemplateOptions): string {
    if (!this.hasChatTemplate) throw new Error("no chat template");
    const tools = opts?.tools?.length ? `tools:${opts.tools.length}\n` : "";
    const body = messages.map((m) => `${m.role}:${m.content}\n`).join("");
    return tools + body + (opts?.addGenerationPrompt ? "assistant:" : "");
  }
  withChatTemplate(): Tokenizer {
    throw new Error("TinyTokenizer renders one fixed template");
  }
}
