// A character-level tokenizer for models trained from scratch (the synthetic
// arithmetic task): <pad>=0, <bos>=1, <eos>=2, then one id per character of
// the alphabet in order. Saved as a verl-ts specific tokenizer.json (marked
// by `verl_ts_tokenizer: "char"`) that loadTokenizer reads back.
import { join } from "node:path";
import type { ChatMessage, ChatTemplateOptions, Tokenizer } from "../tokenizer.js";
import { renderChatTemplate } from "./chat_template.js";
import { writeFileAtomic } from "../../utils/fs.js";

export const CHAR_SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"] as const;
/** Contents joined in order; a char-level model needs no role markup. */
export const DEFAULT_CHAR_CHAT_TEMPLATE = "{% for message in messages %}{{ message.content }}{% endfor %}";
export const CHAR_TOKENIZER_TYPE = "char";

export interface CharTokenizerJson {
  verl_ts_tokenizer: typeof CHAR_TOKENIZER_TYPE;
  version: 1;
  special_tokens: string[];
  alphabet: string[];
  chat_template: string;
}

export class CharTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId = 1;
  readonly eosTokenId = 2;
  readonly eosTokenIds = [2];
  readonly padTokenId = 0;
  readonly hasChatTemplate = true;
  readonly alphabet: readonly string[];
  private readonly idOf = new Map<string, number>();

  constructor(alphabet: string | readonly string[], readonly chatTemplate: string = DEFAULT_CHAR_CHAT_TEMPLATE) {
    const chars = typeof alphabet === "string" ? Array.from(alphabet) : [...alphabet];
    if (chars.length === 0) throw new Error("char tokenizer: the alphabet is empty");
    chars.forEach((c, i) => {
      if (Array.from(c).length !== 1) throw new Error(`char tokenizer: alphabet entry ${i} ${JSON.stringify(c)} is not one character`);
      if (this.idOf.has(c)) throw new Error(`char tokenizer: character ${JSON.stringify(c)} appears twice in the alphabet`);
      this.idOf.set(c, CHAR_SPECIAL_TOKENS.length + i);
    });
    this.alphabet = chars;
    this.vocabSize = CHAR_SPECIAL_TOKENS.length + chars.length;
  }

  /** `char:<alphabet>` with \n, \t, \\ escapes, e.g. `char:0123456789+=\n`. */
  static fromSpec(spec: string): CharTokenizer {
    if (!spec.startsWith("char:")) throw new Error(`char tokenizer spec must start with 'char:' (got ${JSON.stringify(spec)})`);
    const body = spec.slice(5).replace(/\\(.)/gu, (_, c: string) => ({ n: "\n", t: "\t", "\\": "\\" })[c] ?? `\\${c}`);
    return new CharTokenizer(body);
  }

  static fromJson(json: unknown, origin: string): CharTokenizer {
    const j = json as Partial<CharTokenizerJson>;
    if (j.verl_ts_tokenizer !== CHAR_TOKENIZER_TYPE) throw new Error(`${origin}: not a verl-ts char tokenizer (verl_ts_tokenizer != "char")`);
    if (!Array.isArray(j.alphabet) || !j.alphabet.every((c) => typeof c === "string")) {
      throw new Error(`${origin}: 'alphabet' must be an array of one-character strings`);
    }
    if (j.special_tokens !== undefined && JSON.stringify(j.special_tokens) !== JSON.stringify(CHAR_SPECIAL_TOKENS)) {
      throw new Error(`${origin}: special_tokens must be ${JSON.stringify(CHAR_SPECIAL_TOKENS)}`);
    }
    return new CharTokenizer(j.alphabet, typeof j.chat_template === "string" ? j.chat_template : DEFAULT_CHAR_CHAT_TEMPLATE);
  }

  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    const ids = (opts.addSpecialTokens ?? true) ? [this.bosTokenId] : [];
    let pos = 0;
    for (const ch of text) {
      const id = this.idOf.get(ch);
      if (id === undefined) {
        throw new Error(`char tokenizer: character ${JSON.stringify(ch)} (U+${ch.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}) at position ${pos} is not in the alphabet ${JSON.stringify(this.alphabet.join(""))}`);
      }
      ids.push(id);
      pos++;
    }
    return ids;
  }

  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    let out = "";
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new Error(`token id ${id} at position ${i} is outside the vocabulary [0, ${this.vocabSize})`);
      }
      if (id < CHAR_SPECIAL_TOKENS.length) {
        if (!opts.skipSpecialTokens) out += CHAR_SPECIAL_TOKENS[id];
      } else {
        out += this.alphabet[id - CHAR_SPECIAL_TOKENS.length];
      }
    }
    return out;
  }

  applyChatTemplate(messages: ChatMessage[], opts: ChatTemplateOptions = {}): string {
    return renderChatTemplate(this.chatTemplate, messages, opts, { bos_token: "<bos>", eos_token: "<eos>", pad_token: "<pad>" });
  }

  withChatTemplate(source: string): CharTokenizer {
    return new CharTokenizer(this.alphabet, source);
  }

  toJson(): CharTokenizerJson {
    return {
      verl_ts_tokenizer: CHAR_TOKENIZER_TYPE,
      version: 1,
      special_tokens: [...CHAR_SPECIAL_TOKENS],
      alphabet: [...this.alphabet],
      chat_template: this.chatTemplate,
    };
  }

  saveTo(dir: string): void {
    writeFileAtomic(join(dir, "tokenizer.json"), JSON.stringify(this.toJson(), null, 2) + "\n");
    const config = { tokenizer_class: "verl-ts-char", bos_token: "<bos>", eos_token: "<eos>", pad_token: "<pad>", chat_template: this.chatTemplate };
    writeFileAtomic(join(dir, "tokenizer_config.json"), JSON.stringify(config, null, 2) + "\n");
  }
}
