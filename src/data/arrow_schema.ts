// Infer an Arrow schema from plain JS rows, the way pyarrow infers one from a
// list of dicts: strings -> utf8, integers -> int64, other numbers -> double,
// arrays -> list<...>, plain objects -> struct (fields in first-seen order),
// all-null -> null. Whole-number floats cannot be told from integers in JS, so
// pass an explicit schema when a float column may hold only whole numbers.
import * as arrow from "apache-arrow";

type Kind = "string" | "boolean" | "int" | "float" | "bigint" | "list" | "struct" | "binary";

function kindOf(v: unknown, where: string): Kind {
  if (typeof v === "string") return "string";
  if (typeof v === "boolean") return "boolean";
  if (typeof v === "bigint") return "bigint";
  if (typeof v === "number") return Number.isSafeInteger(v) ? "int" : "float";
  if (Array.isArray(v)) return "list";
  if (v instanceof Uint8Array) return "binary";
  if (typeof v === "object" && v !== null && Object.getPrototypeOf(v) === Object.prototype) return "struct";
  throw new Error(`${where}: cannot store a ${v === null ? "null" : (v as object).constructor?.name ?? typeof v} in parquet`);
}

/** The Arrow type for the non-null values of one column (or nested field). */
export function inferType(values: unknown[], where: string): arrow.DataType {
  const kinds = new Set<Kind>();
  const present: unknown[] = [];
  values.forEach((v, i) => {
    if (v === null || v === undefined) return;
    kinds.add(kindOf(v, `${where} (row ${i})`));
    present.push(v);
  });
  if (kinds.size === 0) return new arrow.Null();
  if (kinds.has("int") && kinds.has("bigint") && kinds.size === 2) return new arrow.Int64();
  if (kinds.has("int") && kinds.has("float") && kinds.size === 2) return new arrow.Float64();
  if (kinds.size > 1) throw new Error(`${where}: mixed value types (${[...kinds].join(", ")}); pass an explicit schema or fix the data`);
  switch ([...kinds][0]!) {
    case "string": return new arrow.Utf8();
    case "boolean": return new arrow.Bool();
    case "int": case "bigint": return new arrow.Int64();
    case "float": return new arrow.Float64();
    case "binary": return new arrow.Binary();
    case "list": {
      const items = (present as unknown[][]).flat(1);
      return new arrow.List(new arrow.Field("item", inferType(items, `${where}[]`), true));
    }
    case "struct": {
      const keys: string[] = [];
      const seen = new Set<string>();
      for (const o of present as Record<string, unknown>[]) for (const k of Object.keys(o)) if (!seen.has(k)) { seen.add(k); keys.push(k); }
      const fields = keys.map((k) =>
        new arrow.Field(k, inferType((present as Record<string, unknown>[]).map((o) => o[k]), `${where}.${k}`), true));
      return new arrow.Struct(fields);
    }
  }
}

/** A schema for rows: columns in first-seen order, all nullable. */
export function inferArrowSchema(rows: Record<string, unknown>[]): arrow.Schema {
  if (rows.length === 0) throw new Error("cannot infer a parquet schema from 0 rows; pass a schema");
  const names: string[] = [];
  const seen = new Set<string>();
  for (const r of rows) for (const k of Object.keys(r)) if (!seen.has(k)) { seen.add(k); names.push(k); }
  return new arrow.Schema(names.map((n) => new arrow.Field(n, inferType(rows.map((r) => r[n]), `column '${n}'`), true)));
}
