// Plain JS rows <-> Arrow tables. Writing checks every value against the schema
// (errors name the column path and row); reading turns Arrow values back into
// plain objects, arrays, strings and numbers (int64 -> number when it is a safe
// integer, else bigint).
import * as arrow from "apache-arrow";

const T = arrow.Type;

/** Convert one value so that vectorFromArray accepts it for `type`. */
function toArrowValue(v: unknown, type: arrow.DataType, where: string): unknown {
  if (v === null || v === undefined) return null;
  const fail = (want: string): never => { throw new Error(`${where}: expected ${want}, got ${JSON.stringify(v) ?? typeof v}`); };
  switch (type.typeId) {
    case T.Null: return fail("null");
    case T.Utf8: case T.LargeUtf8: return typeof v === "string" ? v : fail("a string");
    case T.Bool: return typeof v === "boolean" ? v : fail("a boolean");
    case T.Binary: case T.LargeBinary: return v instanceof Uint8Array ? v : fail("a Uint8Array");
    case T.Float: return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : fail("a number");
    case T.Int: {
      const t = type as arrow.Int;
      if (typeof v === "bigint") return t.bitWidth === 64 ? v : Number(v);
      if (typeof v !== "number" || !Number.isInteger(v)) return fail("an integer");
      return t.bitWidth === 64 ? BigInt(v) : v;
    }
    case T.List: case T.LargeList: case T.FixedSizeList: {
      if (!Array.isArray(v)) return fail("an array");
      const child = (type as arrow.List).children[0]!.type;
      return v.map((x, i) => toArrowValue(x, child, `${where}[${i}]`));
    }
    case T.Struct: {
      if (typeof v !== "object" || Array.isArray(v)) return fail("an object");
      const o = v as Record<string, unknown>;
      const fields = (type as arrow.Struct).children;
      for (const k of Object.keys(o)) {
        if (!fields.some((f) => f.name === k)) throw new Error(`${where}: field '${k}' is not in the schema (has: ${fields.map((f) => f.name).join(", ")})`);
      }
      return Object.fromEntries(fields.map((f) => [f.name, toArrowValue(o[f.name], f.type, `${where}.${f.name}`)]));
    }
    default:
      throw new Error(`${where}: writing Arrow type ${String(type)} is not supported`);
  }
}

export function rowsToArrowTable(rows: Record<string, unknown>[], schema: arrow.Schema): arrow.Table {
  const known = new Set(schema.fields.map((f) => f.name));
  rows.forEach((r, i) => {
    for (const k of Object.keys(r)) if (!known.has(k)) throw new Error(`row ${i}: column '${k}' is not in the schema`);
  });
  const columns: Record<string, arrow.Vector> = {};
  for (const f of schema.fields) {
    const values = rows.map((r, i) => {
      const v = toArrowValue(r[f.name], f.type, `column '${f.name}' row ${i}`);
      if (v === null && !f.nullable) throw new Error(`column '${f.name}' row ${i}: null in a non-nullable column`);
      return v;
    });
    columns[f.name] = arrow.vectorFromArray(values, f.type);
  }
  return new arrow.Table(schema, columns);
}

function fromScalar(v: unknown): unknown {
  if (typeof v === "bigint") {
    const n = Number(v);
    return Number.isSafeInteger(n) ? n : v;
  }
  return v;
}

/** Convert a whole Arrow vector to plain JS values, recursing column-wise into structs. */
export function vectorToJs(vec: arrow.Vector, type: arrow.DataType = vec.type): unknown[] {
  // An empty chunk (a 0-row file, an empty row group) may carry no child data at all: drop such chunks.
  if (vec.data.some((d) => d.length === 0)) {
    const kept = vec.data.filter((d) => d.length > 0);
    if (kept.length === 0) return [];
    vec = new arrow.Vector(kept);
  }
  const n = vec.length;
  switch (type.typeId) {
    case T.Struct: {
      const fields = (type as arrow.Struct).children;
      const cols = fields.map((f, k) => vectorToJs(vec.getChildAt(k)!, f.type));
      const out: unknown[] = new Array(n);
      for (let i = 0; i < n; i++) {
        if (!vec.isValid(i)) { out[i] = null; continue; }
        const o: Record<string, unknown> = {};
        fields.forEach((f, k) => { o[f.name] = cols[k]![i]; });
        out[i] = o;
      }
      return out;
    }
    case T.List: case T.LargeList: {
      // Convert each chunk's child column once, then cut it at the offsets (far cheaper than a sub-vector per row).
      // large_list (what polars writes) differs only in 64-bit offsets.
      const child = (type as arrow.List | arrow.LargeList).children[0]!.type;
      const out: unknown[] = [];
      for (const data of vec.data) {
        const offsets = data.valueOffsets as Int32Array | BigInt64Array;
        const at = (i: number): number => Number(offsets[data.offset + i]!);
        const items = vectorToJs(new arrow.Vector([data.children[0]!]), child);
        const chunk = new arrow.Vector([data]);
        for (let i = 0; i < data.length; i++) out.push(chunk.isValid(i) ? items.slice(at(i), at(i + 1)) : null);
      }
      return out;
    }
    case T.FixedSizeList: {
      const child = (type as arrow.FixedSizeList).children[0]!.type;
      return Array.from({ length: n }, (_, i) => {
        const sub = vec.get(i) as arrow.Vector | null;
        return sub === null ? null : vectorToJs(sub, child);
      });
    }
    case T.Map: {
      return Array.from({ length: n }, (_, i) => {
        const m = vec.get(i) as { toJSON(): Record<string, unknown> } | null;
        if (m === null) return null;
        return Object.fromEntries(Object.entries(m.toJSON()).map(([k, x]) => [k, fromScalar(x)]));
      });
    }
    case T.Dictionary: {
      const valueType = (type as arrow.Dictionary).dictionary;
      if (valueType.typeId === T.Struct || valueType.typeId === T.List) throw new Error(`reading dictionary-encoded ${String(valueType)} is not supported`);
      return Array.from({ length: n }, (_, i) => fromScalar(vec.get(i)));
    }
    default: {
      const out: unknown[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = fromScalar(vec.get(i));
      return out;
    }
  }
}

/** Rows of plain objects. Pandas index columns recorded in the file's metadata are dropped. */
export function arrowTableToRows(table: arrow.Table, columns?: string[]): Record<string, unknown>[] {
  const pandasIndex = new Set<string>();
  const pandasMeta = table.schema.metadata.get("pandas");
  if (pandasMeta) {
    try {
      const idx = (JSON.parse(pandasMeta) as { index_columns?: unknown[] }).index_columns ?? [];
      for (const c of idx) if (typeof c === "string") pandasIndex.add(c);
    } catch { /* malformed pandas metadata: keep every column */ }
  }
  const names = table.schema.fields.map((f) => f.name).filter((n) => !pandasIndex.has(n));
  if (columns) {
    for (const c of columns) if (!names.includes(c)) throw new Error(`no column '${c}' (has: ${names.join(", ")})`);
  }
  const chosen = columns ?? names;
  const cols = chosen.map((name) => vectorToJs(table.getChild(name)!));
  const rows: Record<string, unknown>[] = new Array(table.numRows);
  for (let i = 0; i < table.numRows; i++) {
    const r: Record<string, unknown> = {};
    chosen.forEach((name, k) => { r[name] = cols[k]![i]; });
    rows[i] = r;
  }
  return rows;
}
