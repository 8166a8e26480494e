// Shared fixtures for model tests: the stories260K checkpoint and a minimal
// id -> piece table read from tok512.bin (only to print and compare text; the
// real tokenizer lives in src/models/tokenizers).
import { readFileSync } from "node:fs";
import { sharedPath } from "../../src/utils/paths.js";

export const STORIES_MISSING = "../shared/models/stories260K absent";
export const storiesBin = (): string | undefined => sharedPath("models", "stories260K", "stories260K.bin");
export const tok512Bin = (): string | undefined => sharedPath("models", "stories260K", "tok512.bin");

/** "Once upon a time" as tok512 ids, BOS first. */
export const ONCE_UPON_A_TIME = [1, 403, 407, 261, 378];
/** The README's greedy continuation of the prompt. */
export const README_CONTINUATION = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball.";

export function tok512Pieces(path: string): string[] {
  const buf = readFileSync(path);
  const pieces: string[] = [];
  let off = 4;
  for (let i = 0; i < 512; i++) {
    const len = buf.readInt32LE(off + 4);
    pieces.push(buf.subarray(off + 8, off + 8 + len).toString("utf8"));
    off += 8 + len;
  }
  return pieces;
}

/** Concatenate pieces (no byte tokens occur in this story text). */
export function decodePieces(pieces: string[], ids: ArrayLike<number>): string {
  let s = "";
  for (let i = 0; i < ids.length; i++) s += pieces[ids[i]!];
  return s;
}
