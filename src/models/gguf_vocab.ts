// The tokenizer table of a GGUF file, from our tokenizers. The rollout feeds
// llama.cpp token ids directly (no text round trip), so llama.cpp only needs a
// table it accepts, of the model's vocabulary size; still, where the format
// allows it is the real one, so the file also works as a standalone model:
// - llama.c's tok512.bin: sentencepiece ("llama") with its scores, byte tokens <0xXX>;
// - Hugging Face tokenizer.json BPE: byte-fallback (sentencepiece-converted) models
//   as "llama" with merge ranks as scores, byte-level models as "gpt2" with merges.
// Other tokenizers (the character tokenizer) are refused: llama.cpp aborts the process
// on a table without byte tokens.
// Ids the model has beyond the tokenizer (padded embeddings) get [PAD<id>] entries.
import type { Tokenizer } from "./tokenizer.js";
import { Llama2cTokenizer } from "./tokenizers/llama2c.js";
import { HfTokenizer } from "./tokenizers/hf.js";

export interface GgufVocab {
  model: "llama" | "gpt2";
  pre?: string;
  tokens: string[];
  tokenTypes: Int32Array;
  scores?: Float32Array;
  merges?: string[];
  bosId?: number | null;
  eosId?: number | null;
  unkId?: number | null;
  padId?: number | null;
}

// llama.cpp's token types
const NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6;
const SPM_SPACE = "\u2581";

type Json = Record<string, unknown>;

/** Pad a table to the model's vocabulary (entries a tokenizer leaves empty become [PAD<id>]). */
function fill(tokens: (string | undefined)[], types: number[], vocabSize: number, scores?: number[]): Pick<GgufVocab, "tokens" | "tokenTypes" | "scores"> {
  if (tokens.length > vocabSize) throw new Error(`gguf: the tokenizer has ${tokens.length} ids but the model's vocabulary is ${vocabSize}`);
  const seen = new Set<string>();
  const out: string[] = [];
  for (let i = 0; i < vocabSize; i++) {
    let t = tokens[i];
    if (t === undefined || seen.has(t)) { t = `[PAD${i}]`; types[i] = UNUSED; }
    seen.add(t);
    out.push(t);
    types[i] ??= NORMAL;
  }
  return { tokens: out, tokenTypes: Int32Array.from(types.slice(0, vocabSize)), ...(scores ? { scores: Float32Array.from({ length: vocabSize }, (_, i) => scores[i] ?? 0) } : {}) };
}

function llama2cVocab(tok: Llama2cTokenizer, vocabSize: number): GgufVocab {
  const tokens: string[] = [], types: number[] = [];
  for (let id = 0; id < tok.vocabSize; id++) {
    const text = tok.pieceText(id);
    tokens.push(id > 2 && id < 259 ? text : text.replaceAll(" ", SPM_SPACE));
    types.push(id === 0 ? UNKNOWN : id <= 2 ? CONTROL : id < 259 ? BYTE : NORMAL);
  }
  return { model: "llama", ...fill(tokens, types, vocabSize, Array.from(tok.scores)), bosId: tok.bosTokenId, eosId: tok.eosTokenId, unkId: 0, padId: tok.padTokenId };
}

function hfVocab(tok: HfTokenizer, vocabSize: number): GgufVocab {
  const tj = tok.tokenizerJson as Json;
  const model = (tj.model ?? {}) as Json;
  if (model.type !== "BPE") throw new Error(`gguf: tokenizer.json model type '${String(model.type)}' is not supported (BPE only)`);
  const tokens: (string | undefined)[] = [], types: number[] = [];
  for (const [t, id] of Object.entries((model.vocab ?? {}) as Record<string, number>)) { tokens[id] = t; types[id] = NORMAL; }
  for (const a of (tj.added_tokens ?? []) as Json[]) {
    const id = a.id as number;
    tokens[id] = a.content as string;
    types[id] = a.special ? CONTROL : USER_DEFINED;
  }
  const merges = ((model.merges ?? []) as (string | string[])[]).map((m) => (Array.isArray(m) ? m.join(" ") : m));
  const ids = { bosId: tok.bosTokenId, eosId: tok.eosTokenId, padId: tok.padTokenId };
  if (model.byte_fallback) {
    const unk = typeof model.unk_token === "string" ? (model.vocab as Record<string, number>)[model.unk_token] : undefined;
    if (unk !== undefined) types[unk] = UNKNOWN;
    tokens.forEach((t, id) => { if (t && /^<0x[0-9A-F]{2}>$/.test(t)) types[id] = BYTE; });
    // sentencepiece merges by score: earlier merges score higher
    const vocab = model.vocab as Record<string, number>, scores: number[] = [];
    merges.forEach((m, rank) => {
      const id = vocab[m.replace(" ", "")];
      if (id !== undefined && scores[id] === undefined) scores[id] = -rank;
    });
    return { model: "llama", ...fill(tokens, types, vocabSize, scores), ...ids, unkId: unk ?? null };
  }
  return { model: "gpt2", pre: "default", ...fill(tokens, types, vocabSize), merges, ...ids };
}

/**
 * llama.cpp looks up the newline token while loading a vocabulary (<0x0A> in a sentencepiece
 * table, "Ċ" in a byte-level one) and aborts the process when it is missing: check first.
 */
function checkNewline(v: GgufVocab, origin: string): GgufVocab {
  const nl = v.model === "llama" ? "<0x0A>" : "\u010a";
  if (!v.tokens.includes(nl)) throw new Error(`gguf: the ${origin} vocabulary has no newline token ${JSON.stringify(nl)}, which llama.cpp requires`);
  return v;
}

/** The GGUF tokenizer table for `tok`, padded to `vocabSize` (the model's embedding rows). */
export function ggufVocab(tok: Tokenizer, vocabSize: number): GgufVocab {
  if (tok instanceof Llama2cTokenizer) return checkNewline(llama2cVocab(tok, vocabSize), "llama.c");
  if (tok instanceof HfTokenizer && (tok.tokenizerJson.model as Json | undefined)?.type === "BPE") return checkNewline(hfVocab(tok, vocabSize), "tokenizer.json");
  throw new Error(`gguf: no GGUF tokenizer table for ${tok.constructor.name} (llama.c tokenizers and Hugging Face BPE tokenizer.json are supported; llama.cpp needs a real vocabulary to load)`);
}
