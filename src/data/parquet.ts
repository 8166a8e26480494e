// Parquet files as arrays of plain JS rows (parquet-wasm for the file format,
// apache-arrow for the in-memory tables). Arrow crosses the wasm boundary as an
// IPC *stream* (the 'file' format makes parquet-wasm fail with "failed to fill
// whole buffer"). Files are written with Snappy, as pyarrow does by default.
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import * as arrow from "apache-arrow";
import * as pw from "parquet-wasm";
import { writeFileAtomic } from "../utils/fs.js";
import { inferArrowSchema } from "./arrow_schema.js";
import { arrowTableToRows, rowsToArrowTable } from "./arrow_convert.js";

export interface ReadParquetOptions {
  /** Only these columns (an error names a missing one). */
  columns?: string[];
}

/** Decode parquet bytes into an Arrow table. */
export function parquetToArrow(bytes: Uint8Array): arrow.Table {
  const wasmTable = pw.readParquet(bytes);
  return arrow.tableFromIPC(wasmTable.intoIPCStream());
}

export function parquetBytesToRows(bytes: Uint8Array, opts: ReadParquetOptions = {}): Record<string, unknown>[] {
  return arrowTableToRows(parquetToArrow(bytes), opts.columns);
}

function decodeFile(path: string, bytes: Uint8Array, opts: ReadParquetOptions): Record<string, unknown>[] {
  try {
    return parquetBytesToRows(bytes, opts);
  } catch (e) {
    throw new Error(`${path}: ${e instanceof Error ? e.message : String(e)}`);
  }
}

function cannotRead(path: string, e: unknown): Error {
  return new Error(`cannot read parquet file ${path}: ${(e as Error).message}`);
}

/** Read every row of a parquet file as plain objects. */
export async function readParquet(path: string, opts: ReadParquetOptions = {}): Promise<Record<string, unknown>[]> {
  let bytes: Uint8Array;
  try { bytes = await readFile(path); } catch (e) { throw cannotRead(path, e); }
  return decodeFile(path, bytes, opts);
}

/** readParquet for synchronous callers (dataset constructors). */
export function readParquetSync(path: string, opts: ReadParquetOptions = {}): Record<string, unknown>[] {
  let bytes: Uint8Array;
  try { bytes = readFileSync(path); } catch (e) { throw cannotRead(path, e); }
  return decodeFile(path, bytes, opts);
}

/** The schema stored in a parquet file. */
export async function readParquetSchema(path: string): Promise<arrow.Schema> {
  return parquetToArrow(await readFile(path)).schema;
}

export function rowsToParquetBytes(rows: Record<string, unknown>[], schema?: arrow.Schema): Uint8Array {
  const table = rowsToArrowTable(rows, schema ?? inferArrowSchema(rows));
  const wasmTable = pw.Table.fromIPCStream(arrow.tableToIPC(table, "stream"));
  const props = new pw.WriterPropertiesBuilder().setCompression(pw.Compression.SNAPPY).setCreatedBy("verl-ts").build();
  return pw.writeParquet(wasmTable, props);
}

/** Write rows to a parquet file atomically. Without a schema one is inferred (see arrow_schema.ts). */
export async function writeParquet(path: string, rows: Record<string, unknown>[], schema?: arrow.Schema): Promise<void> {
  let bytes: Uint8Array;
  try {
    bytes = rowsToParquetBytes(rows, schema);
  } catch (e) {
    throw new Error(`writing ${path}: ${e instanceof Error ? e.message : String(e)}`);
  }
  writeFileAtomic(path, bytes);
}
