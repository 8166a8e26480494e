// Writing a preprocessed data set: every split is encoded before any file is
// written, and each file is written atomically, so a bad row leaves no output.
import { join } from "node:path";
import { expandHome } from "../home_path.js";
import { writeFileAtomic } from "../../utils/fs.js";
import { logger } from "../../utils/logger.js";
import { rowsToParquetBytes } from "../parquet.js";
import type { PreprocessResult } from "./types.js";

/** Writes `<saveDir>/<split>.parquet` for every split. */
export function writeSplits(saveDir: string, splits: Record<string, Record<string, unknown>[]>): PreprocessResult {
  const dir = expandHome(saveDir);
  const encoded = Object.entries(splits).map(([split, rows]) => {
    try {
      return { split, path: join(dir, `${split}.parquet`), bytes: rowsToParquetBytes(rows), n: rows.length };
    } catch (e) {
      throw new Error(`encoding the ${split} split: ${(e as Error).message}`);
    }
  });
  for (const e of encoded) {
    writeFileAtomic(e.path, e.bytes);
    logger().info(`wrote ${e.path} (${e.n} rows, ${(e.bytes.length / 1024).toFixed(0)} KiB)`);
  }
  return { files: encoded.map((e) => e.path), rows: Object.fromEntries(encoded.map((e) => [e.split, e.n])) };
}

/** A numeric option that may arrive as a string from the command line. */
export function intOption(v: unknown, name: string, fallback: number, min = 0): number {
  if (v === undefined || v === null || v === "") return fallback;
  const n = typeof v === "number" ? v : Number(v);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got ${String(v)}`);
  return n;
}
