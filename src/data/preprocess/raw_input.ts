// Locating and reading a raw split of a data set: `<dir>/<split>.jsonl`, or the
// Hugging Face layout `<dir>/main/<split>-00000-of-00001.parquet` (shards in
// name order), or `<dir>/<split>-*.parquet`. Every record carries its origin
// ("file:line" or "file row N") so bad rows can be reported precisely.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { readParquet } from "../parquet.js";

export interface RawRecord {
  value: Record<string, unknown>;
  where: string;
}

function parquetShards(dir: string, split: string): string[] {
  if (!existsSync(dir)) return [];
  const re = new RegExp(`^${split}-\\d+-of-\\d+\\.parquet$`);
  return readdirSync(dir).filter((f) => re.test(f)).sort().map((f) => join(dir, f));
}

/** The files holding one split, or an error saying what was looked for. */
export function findSplitFiles(dir: string, split: string): string[] {
  if (!existsSync(dir)) throw new Error(`input folder ${dir} does not exist`);
  const jsonl = join(dir, `${split}.jsonl`);
  if (existsSync(jsonl)) return [jsonl];
  for (const sub of [join(dir, "main"), dir]) {
    const shards = parquetShards(sub, split);
    if (shards.length) return shards;
  }
  throw new Error(`no ${split} split in ${dir}: looked for ${split}.jsonl, main/${split}-00000-of-0000N.parquet and ${split}-00000-of-0000N.parquet`);
}

export async function readRawRecords(files: string[]): Promise<RawRecord[]> {
  const out: RawRecord[] = [];
  for (const file of files) {
    if (file.endsWith(".jsonl")) {
      const lines = readFileSync(file, "utf8").split("\n");
      lines.forEach((line, i) => {
        if (line.trim() === "") return;
        const where = `${file}:${i + 1}`;
        let v: unknown;
        try { v = JSON.parse(line); } catch (e) { throw new Error(`${where}: not valid JSON (${(e as Error).message})`); }
        if (v === null || typeof v !== "object" || Array.isArray(v)) throw new Error(`${where}: expected a JSON object`);
        out.push({ value: v as Record<string, unknown>, where });
      });
    } else {
      (await readParquet(file)).forEach((value, i) => out.push({ value, where: `${file} row ${i}` }));
    }
  }
  return out;
}

export function requireString(rec: RawRecord, key: string): string {
  const v = rec.value[key];
  if (typeof v !== "string") throw new Error(`${rec.where}: field '${key}' must be a string, got ${v === undefined ? "nothing" : JSON.stringify(v)}`);
  return v;
}
