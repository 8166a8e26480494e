// llama2.c's tokenizer (tok512.bin and friends): a sentencepiece BPE exported
// as (score, bytes) per token. Encoding follows run.c exactly: BOS, a dummy
// space prefix, one token per UTF-8 code point (byte tokens where the
// vocabulary lacks it), then greedy merges of the adjacent pair whose
// concatenation has the highest score, leftmost first on ties.
import { readFileSync } from "node:fs";
import type { ChatMessage, ChatTemplateOptions, Tokenizer } from "../tokenizer.js";
import { MinHeap } from "./merge_queue.js";
import { renderChatTemplate } from "./chat_template.js";
import { saveLlama2cAsHf } from "./llama2c_export.js";

const BOS = 1;
const EOS = 2;
const BYTE_OFFSET = 3; // byte b is token b + 3
const SPECIAL_NAMES = ["<unk>", "<s>", "</s>"];

/** Bytes as a latin1 string: concatenation of keys equals concatenation of bytes. */
function byteKey(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("latin1");
}

interface MergeNode {
  id: number;
  start: number; // original position: orders nodes left to right
  prev: MergeNode | null;
  next: MergeNode | null;
  dead: boolean;
}

interface Candidate {
  left: MergeNode;
  right: MergeNode;
  id: number;
  score: number;
}

export interface Llama2cVocab {
  pieces: Uint8Array[];
  scores: Float32Array;
  maxTokenLength: number;
}

/** Parse tok512.bin: int32 max_token_length, then per token float32 score, int32 length, bytes. */
export function parseLlama2cTokenizer(buf: Uint8Array, path: string, vocabSize?: number): Llama2cVocab {
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  if (buf.byteLength < 4) throw new Error(`${path}: too short for a llama2.c tokenizer (${buf.byteLength} bytes)`);
  const maxTokenLength = view.getInt32(0, true);
  const pieces: Uint8Array[] = [];
  const scores: number[] = [];
  let off = 4;
  while (off < buf.byteLength && (vocabSize === undefined || pieces.length < vocabSize)) {
    if (off + 8 > buf.byteLength) throw new Error(`${path}: truncated at token ${pieces.length} (offset ${off})`);
    scores.push(view.getFloat32(off, true));
    const len = view.getInt32(off + 4, true);
    off += 8;
    if (len < 0 || off + len > buf.byteLength) {
      throw new Error(`${path}: token ${pieces.length} has byte length ${len}, past the end of the file (offset ${off})`);
    }
    pieces.push(buf.slice(off, off + len));
    off += len;
  }
  if (vocabSize !== undefined && pieces.length !== vocabSize) {
    throw new Error(`${path}: expected ${vocabSize} tokens, found ${pieces.length}`);
  }
  if (pieces.length < BYTE_OFFSET + 256) {
    throw new Error(`${path}: ${pieces.length} tokens; a llama2.c tokenizer needs <unk>, <s>, </s> and 256 byte tokens first`);
  }
  return { pieces, scores: Float32Array.from(scores), maxTokenLength };
}

export class Llama2cTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId = BOS;
  readonly eosTokenId = EOS;
  readonly eosTokenIds = [EOS];
  /** llama2.c has no pad token; like verl's tokenizer helper we pad with EOS. */
  readonly padTokenId = EOS;
  readonly pieces: readonly Uint8Array[];
  readonly scores: Float32Array;
  readonly maxTokenLength: number;
  private readonly idByKey = new Map<string, number>();
  private readonly keys: string[];
  private readonly spaceId: number;

  constructor(private readonly vocab: Llama2cVocab, private readonly chatTemplate?: string) {
    this.pieces = vocab.pieces;
    this.scores = vocab.scores;
    this.maxTokenLength = vocab.maxTokenLength;
    this.vocabSize = vocab.pieces.length;
    this.keys = vocab.pieces.map(byteKey);
    // First id wins on duplicate strings; run.c's bsearch leaves that undefined.
    this.keys.forEach((k, id) => { if (!this.idByKey.has(k)) this.idByKey.set(k, id); });
    const space = this.idByKey.get(" ");
    if (space === undefined) throw new Error("llama2.c tokenizer has no single-space token (needed for the dummy prefix)");
    this.spaceId = space;
  }

  static fromFile(path: string, chatTemplate?: string): Llama2cTokenizer {
    let buf: Buffer;
    try {
      buf = readFileSync(path);
    } catch (e) {
      throw new Error(`cannot read llama2.c tokenizer ${path}: ${(e as Error).message}`);
    }
    return new Llama2cTokenizer(parseLlama2cTokenizer(buf, path), chatTemplate);
  }

  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    const ids = this.initialTokens(text);
    const merged = this.mergeGreedy(ids);
    return (opts.addSpecialTokens ?? true) ? [BOS, ...merged] : merged;
  }

  /** The dummy-prefix space, then one token per code point (or its bytes). */
  private initialTokens(text: string): number[] {
    if (text.length === 0) return [];
    const ids = [this.spaceId];
    for (const ch of text) {
      const bytes = Buffer.from(ch, "utf8");
      const id = this.idByKey.get(bytes.toString("latin1"));
      if (id !== undefined) ids.push(id);
      else for (const b of bytes) ids.push(b + BYTE_OFFSET);
    }
    return ids;
  }

  private mergeGreedy(ids: number[]): number[] {
    if (ids.length < 2) return ids;
    const nodes: MergeNode[] = ids.map((id, start) => ({ id, start, prev: null, next: null, dead: false }));
    for (let i = 0; i < nodes.length; i++) {
      nodes[i]!.prev = nodes[i - 1] ?? null;
      nodes[i]!.next = nodes[i + 1] ?? null;
    }
    // Highest score first; on equal scores the leftmost pair, as run.c's strict '>' scan does.
    const heap = new MinHeap<Candidate>((a, b) => a.score > b.score || (a.score === b.score && a.left.start < b.left.start));
    const consider = (left: MergeNode | null): void => {
      const right = left?.next;
      if (!left || !right) return;
      const id = this.idByKey.get(this.keys[left.id]! + this.keys[right.id]!);
      if (id !== undefined && this.scores[id]! > -1e10) heap.push({ left, right, id, score: this.scores[id]! });
    };
    for (const n of nodes) consider(n);
    let head: MergeNode = nodes[0]!;
    for (let c = heap.pop(); c; c = heap.pop()) {
      const { left, right } = c;
      if (left.dead || right.dead || left.next !== right) continue;
      // The merged token replaces both; stale candidates touching them are skipped.
      const merged: MergeNode = { id: c.id, start: left.start, prev: left.prev, next: right.next, dead: false };
      left.dead = right.dead = true;
      if (merged.prev) merged.prev.next = merged; else head = merged;
      if (merged.next) merged.next.prev = merged;
      consider(merged.prev);
      consider(merged);
    }
    const out: number[] = [];
    for (let n: MergeNode | null = head; n; n = n.next) out.push(n.id);
    return out;
  }

  /** A token's bytes as decoded text would carry them (byte tokens are their byte). */
  tokenBytes(id: number): Uint8Array {
    if (id >= BYTE_OFFSET && id < BYTE_OFFSET + 256) return Uint8Array.of(id - BYTE_OFFSET);
    return this.pieces[id]!;
  }

  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    const chunks: Uint8Array[] = [];
    let prev = -1;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new Error(`token id ${id} at position ${i} is outside the vocabulary [0, ${this.vocabSize})`);
      }
      if (id <= EOS) {
        if (!opts.skipSpecialTokens) chunks.push(Buffer.from(SPECIAL_NAMES[id]!, "utf8"));
      } else {
        let bytes = this.tokenBytes(id);
        // run.c drops the dummy-prefix space of the first piece after BOS.
        if (prev === BOS && bytes[0] === 0x20) bytes = bytes.subarray(1);
        chunks.push(bytes);
      }
      prev = id;
    }
    return Buffer.concat(chunks).toString("utf8");
  }

  get hasChatTemplate(): boolean {
    return this.chatTemplate !== undefined;
  }

  applyChatTemplate(messages: ChatMessage[], opts: ChatTemplateOptions = {}): string {
    if (this.chatTemplate === undefined) {
      throw new Error(
        "this llama2.c tokenizer has no chat template; use raw prompts (data.apply_chat_template_kwargs / a plain-text prompt) " +
          "or save it as a Hugging Face folder with a chat_template in tokenizer_config.json",
      );
    }
    return renderChatTemplate(this.chatTemplate, messages, opts, { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>" });
  }

  withChatTemplate(source: string): Llama2cTokenizer {
    return new Llama2cTokenizer(this.vocab, source);
  }

  /** Writes tokenizer.json (BPE + byte fallback), tokenizer_config.json, special_tokens_map.json and the raw tok512.bin. */
  saveTo(dir: string): void {
    saveLlama2cAsHf(this, dir, this.chatTemplate);
  }

  /** The raw piece strings (spaces kept as spaces), for the HF export. */
  pieceText(id: number): string {
    if (id <= EOS) return SPECIAL_NAMES[id]!;
    if (id < BYTE_OFFSET + 256) return `<0x${(id - BYTE_OFFSET).toString(16).toUpperCase().padStart(2, "0")}>`;
    return Buffer.from(this.pieces[id]!).toString("utf8");
  }
}
