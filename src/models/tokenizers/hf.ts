// Hugging Face tokenizer folders: tokenizer.json through @huggingface/tokenizers,
// tokenizer_config.json for the special tokens and the chat template (or a
// chat_template.jinja file beside it), generation_config.json for extra stops.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer as HfCore } from "@huggingface/tokenizers";
import type { ChatMessage, ChatTemplateOptions, Tokenizer } from "../tokenizer.js";
import { renderChatTemplate } from "./chat_template.js";
import { writeFileAtomic } from "../../utils/fs.js";

type Json = Record<string, unknown>;

/** Added tokens that end an assistant turn in common chat formats. */
const TURN_END_TOKENS = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"];

function readJson(path: string): Json {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`cannot read ${path}: ${(e as Error).message}`);
  }
  try {
    const v: unknown = JSON.parse(text);
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error("not a JSON object");
    return v as Json;
  } catch (e) {
    throw new Error(`${path} is not valid JSON: ${(e as Error).message}`);
  }
}

/** tokenizer_config stores tokens as strings or as {content: ...} (AddedToken dumps). */
function tokenString(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (typeof v === "object" && v !== null && typeof (v as Json).content === "string") return (v as Json).content as string;
  return null;
}

/** chat_template may be a string or a list of {name, template}; tools prefer "tool_use" as transformers does. */
function pickTemplate(raw: unknown, wantTools: boolean): string | undefined {
  if (typeof raw === "string") return raw;
  if (Array.isArray(raw)) {
    const named = new Map<string, string>();
    for (const t of raw) {
      if (typeof t === "object" && t !== null && typeof (t as Json).name === "string" && typeof (t as Json).template === "string") {
        named.set((t as Json).name as string, (t as Json).template as string);
      }
    }
    if (wantTools && named.has("tool_use")) return named.get("tool_use");
    return named.get("default");
  }
  return undefined;
}

export interface HfTokenizerSources {
  tokenizerJson: Json;
  tokenizerConfig?: Json;
  generationConfig?: Json;
  /** A chat template from chat_template.jinja, which overrides the config's. */
  chatTemplate?: string;
  /** Where it came from, for error messages. */
  origin?: string;
}

export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenId: number;
  readonly eosTokenIds: number[];
  readonly padTokenId: number;
  private readonly core: HfCore;
  private readonly specialIds: Set<number>;
  private readonly specialStrings: Record<string, string | null>;
  private readonly origin: string;

  constructor(private readonly sources: HfTokenizerSources) {
    this.origin = sources.origin ?? "tokenizer.json";
    const config = sources.tokenizerConfig ?? {};
    try {
      this.core = new HfCore(sources.tokenizerJson, {
        ...config,
        clean_up_tokenization_spaces: config.clean_up_tokenization_spaces ?? false,
      });
    } catch (e) {
      throw new Error(`${this.origin}: @huggingface/tokenizers cannot load it: ${(e as Error).message}`);
    }
    const vocab = this.core.get_vocab(true);
    let maxId = -1;
    for (const id of vocab.values()) maxId = Math.max(maxId, id);
    this.vocabSize = maxId + 1;
    this.specialIds = new Set([...this.core.get_added_tokens_decoder()].filter(([, t]) => t.special).map(([id]) => id));

    const idOf = (key: string): number | null => {
      const s = tokenString(config[key]);
      if (s === null) return null;
      const id = this.core.token_to_id(s);
      if (id === undefined) throw new Error(`${this.origin}: tokenizer_config ${key} ${JSON.stringify(s)} is not in the vocabulary`);
      return id;
    };
    this.bosTokenId = idOf("bos_token");
    const genEos = sources.generationConfig?.eos_token_id;
    const genEosList = (Array.isArray(genEos) ? genEos : genEos === undefined || genEos === null ? [] : [genEos])
      .filter((x): x is number => typeof x === "number");
    const eos = idOf("eos_token") ?? genEosList[0] ?? this.firstPresent(TURN_END_TOKENS);
    if (eos === null || eos === undefined) {
      throw new Error(`${this.origin}: no eos_token in tokenizer_config.json, no eos_token_id in generation_config.json, and none of ${TURN_END_TOKENS.join(", ")} in the vocabulary`);
    }
    this.eosTokenId = eos;
    // Generation stops where transformers' generate stops: generation_config.json's eos ids, else the
    // tokenizer's eos; not on every special token (a chat model's <|endoftext|> is not its turn end).
    this.eosTokenIds = genEosList.length > 0 ? [...new Set(genEosList)] : [eos];
    // verl's tokenizer helper pads with EOS when the tokenizer has no pad token.
    this.padTokenId = idOf("pad_token") ?? eos;
    this.specialStrings = {
      bos_token: tokenString(config.bos_token),
      eos_token: tokenString(config.eos_token),
      pad_token: tokenString(config.pad_token),
      unk_token: tokenString(config.unk_token),
    };
  }

  private firstPresent(tokens: string[]): number | null {
    for (const t of tokens) {
      const id = this.core.token_to_id(t);
      if (id !== undefined) return id;
    }
    return null;
  }

  static fromDir(dir: string): HfTokenizer {
    const tokPath = join(dir, "tokenizer.json");
    if (!existsSync(tokPath)) throw new Error(`${dir}: no tokenizer.json`);
    const cfgPath = join(dir, "tokenizer_config.json");
    const genPath = join(dir, "generation_config.json");
    const jinjaPath = join(dir, "chat_template.jinja");
    return new HfTokenizer({
      tokenizerJson: readJson(tokPath),
      tokenizerConfig: existsSync(cfgPath) ? readJson(cfgPath) : undefined,
      generationConfig: existsSync(genPath) ? readJson(genPath) : undefined,
      chatTemplate: existsSync(jinjaPath) ? readFileSync(jinjaPath, "utf8") : undefined,
      origin: tokPath,
    });
  }

  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    if (typeof text !== "string") throw new Error(`encode expects a string, got ${typeof text}`);
    if (text.length === 0 && !(opts.addSpecialTokens ?? true)) return [];
    return this.core.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids;
  }

  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    const list = Array.from(ids);
    list.forEach((id, i) => {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new Error(`token id ${id} at position ${i} is outside the vocabulary [0, ${this.vocabSize})`);
      }
    });
    const kept = opts.skipSpecialTokens ? list.filter((id) => !this.specialIds.has(id)) : list;
    if (kept.length === 0) return "";
    return this.core.decode(kept, { skip_special_tokens: false });
  }

  tokenToId(token: string): number | undefined {
    return this.core.token_to_id(token);
  }

  private template(wantTools: boolean): string | undefined {
    return this.sources.chatTemplate ?? pickTemplate(this.sources.tokenizerConfig?.chat_template, wantTools);
  }

  /** The parsed tokenizer.json (read-only; the GGUF export reads its vocabulary and merges). */
  get tokenizerJson(): Readonly<Json> {
    return this.sources.tokenizerJson;
  }

  get hasChatTemplate(): boolean {
    return this.template(false) !== undefined;
  }

  applyChatTemplate(messages: ChatMessage[], opts: ChatTemplateOptions = {}): string {
    const source = this.template((opts.tools?.length ?? 0) > 0);
    if (source === undefined) {
      throw new Error(`${this.origin}: no chat_template in tokenizer_config.json (nor chat_template.jinja); cannot apply a chat template`);
    }
    return renderChatTemplate(source, messages, opts, this.specialStrings);
  }

  /** The template replaces the config's (and a tool_use variant) as chat_template.jinja does. */
  withChatTemplate(source: string): HfTokenizer {
    return new HfTokenizer({ ...this.sources, chatTemplate: source });
  }

  saveTo(dir: string): void {
    const json = (o: unknown) => JSON.stringify(o, null, 2) + "\n";
    writeFileAtomic(join(dir, "tokenizer.json"), json(this.sources.tokenizerJson));
    const config: Json = { ...(this.sources.tokenizerConfig ?? {}) };
    if (this.sources.chatTemplate !== undefined) config.chat_template = this.sources.chatTemplate;
    writeFileAtomic(join(dir, "tokenizer_config.json"), json(config));
    const map: Json = {};
    for (const [k, v] of Object.entries(this.specialStrings)) if (v !== null) map[k] = v;
    writeFileAtomic(join(dir, "special_tokens_map.json"), json(map));
  }
}
