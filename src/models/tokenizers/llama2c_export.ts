// Export a llama2.c tokenizer as a Hugging Face folder. Sentencepiece BPE
// merges the highest-scoring pair first; HF BPE merges the lowest-ranked
// pair first, so every split (a, b) of a token into two tokens becomes a
// merge ranked by the token's score (as transformers' LlamaConverter does).
// The normalizer prepends the dummy-prefix "▁" and turns spaces into "▁";
// no pre-tokenizer, so merges may cross words exactly as in run.c.
// The raw tokenizer.bin is written too: loadTokenizer prefers it, which
// keeps llama2.c decoding (leading space kept unless after BOS).
import { join } from "node:path";
import { writeFileAtomic } from "../../utils/fs.js";
import type { Llama2cTokenizer } from "./llama2c.js";

const SPM_SPACE = "\u2581";

export interface HfTokenizerFiles {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  specialTokensMap: Record<string, unknown>;
}

export function llama2cToHfJson(tok: Llama2cTokenizer, chatTemplate?: string): HfTokenizerFiles {
  const firstPiece = 3 + 256; // <unk>, <s>, </s>, then 256 byte tokens
  const vocab: Record<string, number> = {};
  for (let id = 0; id < tok.vocabSize; id++) {
    const text = tok.pieceText(id);
    if (id >= firstPiece && text.includes(SPM_SPACE)) {
      throw new Error(`llama2.c token ${id} contains '${SPM_SPACE}', which the HF export uses for spaces`);
    }
    const key = id >= firstPiece ? text.replaceAll(" ", SPM_SPACE) : text;
    if (key in vocab) throw new Error(`llama2.c tokens ${vocab[key]} and ${id} have the same text ${JSON.stringify(text)}`);
    vocab[key] = id;
  }
  const merges: { pair: string; score: number; id: number; split: number }[] = [];
  for (let id = firstPiece; id < tok.vocabSize; id++) {
    const chars = Array.from(tok.pieceText(id).replaceAll(" ", SPM_SPACE));
    for (let k = 1; k < chars.length; k++) {
      const left = chars.slice(0, k).join("");
      const right = chars.slice(k).join("");
      const l = vocab[left], r = vocab[right];
      if (l !== undefined && r !== undefined && l >= firstPiece && r >= firstPiece) {
        merges.push({ pair: `${left} ${right}`, score: tok.scores[id]!, id, split: k });
      }
    }
  }
  merges.sort((a, b) => b.score - a.score || a.id - b.id || a.split - b.split);
  const special = (id: number, content: string) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  });
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Prepend", prepend: SPM_SPACE },
        { type: "Replace", pattern: { String: " " }, content: SPM_SPACE },
      ],
    },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: SPM_SPACE }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: {
      type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges: merges.map((m) => m.pair),
    },
  };
  const tokenizerConfig: Record<string, unknown> = {
    tokenizer_class: "LlamaTokenizerFast",
    add_bos_token: true,
    add_eos_token: false,
    bos_token: "<s>",
    eos_token: "</s>",
    unk_token: "<unk>",
    pad_token: null,
    clean_up_tokenization_spaces: false,
    legacy: false,
    model_max_length: 1_000_000,
  };
  if (chatTemplate !== undefined) tokenizerConfig.chat_template = chatTemplate;
  return { tokenizerJson, tokenizerConfig, specialTokensMap: { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>" } };
}

/** The tok512.bin layout: int32 max_token_length, then per token float32 score, int32 length, bytes. */
export function llama2cToBinary(tok: Llama2cTokenizer, maxTokenLength: number): Uint8Array {
  const parts: Buffer[] = [];
  const head = Buffer.alloc(4);
  head.writeInt32LE(maxTokenLength, 0);
  parts.push(head);
  for (let id = 0; id < tok.vocabSize; id++) {
    const piece = tok.pieces[id]!;
    const h = Buffer.alloc(8);
    h.writeFloatLE(tok.scores[id]!, 0);
    h.writeInt32LE(piece.byteLength, 4);
    parts.push(h, Buffer.from(piece));
  }
  return Buffer.concat(parts);
}

export function saveLlama2cAsHf(tok: Llama2cTokenizer, dir: string, chatTemplate?: string): void {
  const files = llama2cToHfJson(tok, chatTemplate);
  const json = (o: unknown) => JSON.stringify(o, null, 2) + "\n";
  writeFileAtomic(join(dir, "tokenizer.json"), json(files.tokenizerJson));
  writeFileAtomic(join(dir, "tokenizer_config.json"), json(files.tokenizerConfig));
  writeFileAtomic(join(dir, "special_tokens_map.json"), json(files.specialTokensMap));
  writeFileAtomic(join(dir, "tokenizer.bin"), llama2cToBinary(tok, tok.maxTokenLength));
}
