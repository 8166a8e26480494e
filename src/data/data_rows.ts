// The rows of one data file (data.train_files / val_files), each with where it came
// from for errors: parquet rows, or JSON lines. A JSON-lines file must be UTF-8: a
// line with invalid bytes is refused, naming the file, the line and the byte, where
// a lenient decode would put U+FFFD into the prompt and train on it.
import { readFileSync } from "node:fs";
import { expandHome } from "./home_path.js";
import { readParquetSync } from "./parquet.js";

export interface SourcedRow { row: Record<string, unknown>; where: string }

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Where the first invalid UTF-8 sequence of `bytes` starts (for the error; the decoder already refused them). */
function firstInvalidByte(bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length;) {
    const b = bytes[i]!;
    const n = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    if (n === 0) return i;
    for (let k = 1; k < n; k++) {
      const c = bytes[i + k];
      if (c === undefined || c < 0x80 || c > 0xbf) return i;
    }
    // (overlong 3- and 4-byte forms and surrogates are caught by the decoder; pointing at their lead is close enough)
    try { utf8.decode(bytes.subarray(i, i + n)); } catch { return i; }
    i += n;
  }
  return 0;
}

/** JSON lines: one object per non-blank line, UTF-8 checked per line. */
export function readJsonLines(path: string, file = path): SourcedRow[] {
  let bytes: Buffer;
  try { bytes = readFileSync(path); } catch (e) { throw new Error(`cannot read ${file}: ${(e as Error).message}`); }
  const out: SourcedRow[] = [];
  let start = 0, lineNo = 0;
  while (start <= bytes.length) {
    let end = bytes.indexOf(0x0a, start);
    if (end < 0) end = bytes.length;
    lineNo++;
    const raw = bytes.subarray(start, end);
    let line: string;
    try {
      line = utf8.decode(raw);
    } catch {
      const at = firstInvalidByte(raw);
      throw new Error(`${file}:${lineNo}: not valid UTF-8 (byte 0x${raw[at]!.toString(16).padStart(2, "0")} at column ${at + 1} of the line); JSON-lines data must be UTF-8: re-encode the file (iconv -f <encoding> -t utf-8)`);
    }
    start = end + 1;
    if (line.trim() === "") continue;
    try {
      out.push({ row: JSON.parse(line) as Record<string, unknown>, where: `${file}:${lineNo}` });
    } catch (e) {
      throw new Error(`${file}:${lineNo}: not valid JSON (${(e as Error).message})`);
    }
  }
  return out;
}

/** Rows of a .parquet or JSON-lines (.jsonl/.json) data file. */
export function readDataRows(file: string): SourcedRow[] {
  const path = expandHome(file);
  if (path.endsWith(".parquet")) return readParquetSync(path).map((row, i) => ({ row, where: `${file} row ${i}` }));
  if (path.endsWith(".jsonl") || path.endsWith(".json")) return readJsonLines(path, file);
  throw new Error(`unsupported data file format: ${file} (use .parquet or JSON lines .jsonl/.json)`);
}
