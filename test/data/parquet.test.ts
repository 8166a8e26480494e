import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, existsSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import * as arrow from "apache-arrow";
import { readParquet, readParquetSchema, writeParquet } from "../../src/data/parquet.js";

const fixtureAt = (name: string): string => fileURLToPath(new URL(`../../../test/data/fixtures/${name}`, import.meta.url));
const fixture = fixtureAt("list_columns.parquet");
const parquetModule = new URL("../../src/data/parquet.js", import.meta.url).href;

function tmp(): string {
  return mkdtempSync(join(tmpdir(), "verl-pq-"));
}

// verl's GSM8K layout plus the awkward cases: int64 beyond 2^53, nulls at every level, empty lists, floats, bools.
const rows: Record<string, unknown>[] = [
  {
    data_source: "openai/gsm8k",
    prompt: [{ role: "system", content: "be brief" }, { role: "user", content: "What is 2+2? 😀" }],
    ability: "math",
    reward_model: { style: "rule", ground_truth: "4" },
    extra_info: { split: "train", index: 0, answer: "2+2=4\n#### 4", question: "What is 2+2?" },
    score: 0.25, ok: true, big: 9007199254740993n, tags: ["a", "b"], nothing: null,
  },
  {
    data_source: "openai/gsm8k",
    prompt: [{ role: "user", content: "" }],
    ability: null,
    reward_model: { style: "rule", ground_truth: null },
    extra_info: { split: "test", index: 1, answer: "", question: "q" },
    score: -1.5, ok: false, big: -3n, tags: [], nothing: null,
  },
  {
    data_source: "x",
    prompt: [],
    ability: "math",
    reward_model: null,
    extra_info: { split: "test", index: 2, answer: "a", question: null },
    score: 1e-30, ok: null, big: 5n, tags: [null, "c"], nothing: null,
  },
];
// Reading gives int64 back as number when it is safe.
const expected: Record<string, unknown>[] = rows.map((r) => ({ ...r, big: r.big === 9007199254740993n ? 9007199254740993n : Number(r.big) }));

test("rows survive a write/read round trip exactly, with the inferred types", async () => {
  const dir = tmp();
  try {
    const p = join(dir, "rows.parquet");
    await writeParquet(p, rows);
    assert.deepEqual(await readParquet(p), expected);
    const schema = await readParquetSchema(p);
    const types = Object.fromEntries(schema.fields.map((f) => [f.name, String(f.type)]));
    assert.equal(types.prompt, "List<Struct<{role:Utf8, content:Utf8}>>");
    assert.equal(types.extra_info, "Struct<{split:Utf8, index:Int64, answer:Utf8, question:Utf8}>");
    assert.equal(types.big, "Int64");
    assert.equal(types.score, "Float64");
    assert.deepEqual(await readParquet(p, { columns: ["ability", "score"] }), expected.map((r) => ({ ability: r.ability, score: r.score })));
    await assert.rejects(readParquet(p, { columns: ["nope"] }), /no column 'nope'/);
    assert.deepEqual(readdirSync(dir), ["rows.parquet"], "no temporary files left behind");
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("a file written here reads back in a second process", async () => {
  const dir = tmp();
  try {
    const p = join(dir, "rows.parquet");
    await writeParquet(p, rows);
    const script = `import(${JSON.stringify(parquetModule)}).then(async (m) => {
      const r = await m.readParquet(${JSON.stringify(p)});
      process.stdout.write(JSON.stringify(r, (k, v) => typeof v === "bigint" ? { bigint: v.toString() } : v));
    });`;
    const out = execFileSync(process.execPath, ["-e", script], { encoding: "utf8" });
    const back = JSON.parse(out, (_k, v: unknown) =>
      v !== null && typeof v === "object" && "bigint" in v ? BigInt((v as { bigint: string }).bigint) : v) as unknown;
    assert.deepEqual(back, expected);
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("a file pandas/pyarrow wrote reads (list<int64>, list<utf8>, nulls)", async () => {
  assert.deepEqual(await readParquet(fixture), [
    { int64_list: [1, 2, 3], utf8_list: ["abc", "efg", "hij"] },
    { int64_list: [null, 1], utf8_list: null },
    { int64_list: [4], utf8_list: ["efg", null, "hij", "xyz"] },
  ]);
});

test("pandas index columns named in the metadata are dropped; large_utf8 reads", async () => {
  const dir = tmp();
  try {
    // Build the shape pandas produces: an `__index_level_0__` column recorded in the `pandas` metadata, large strings.
    const schema = new arrow.Schema(
      [new arrow.Field("q", new arrow.LargeUtf8(), true), new arrow.Field("__index_level_0__", new arrow.Int64(), true)],
      new Map([["pandas", JSON.stringify({ index_columns: ["__index_level_0__"], columns: [] })]]),
    );
    const p = join(dir, "pd.parquet");
    await writeParquet(p, [{ q: "a", __index_level_0__: 7 }, { q: "b", __index_level_0__: 9 }], schema);
    assert.deepEqual(await readParquet(p), [{ q: "a" }, { q: "b" }]);
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("a 0-row file pyarrow wrote (verl's schema, one empty row group) reads as no rows", async () => {
  const p = fixtureAt("empty_rows.parquet");
  assert.deepEqual(await readParquet(p), []);
  assert.deepEqual((await readParquetSchema(p)).fields.map((f) => f.name), ["data_source", "prompt", "ability", "reward_model", "extra_info"]);
});

test("large_list columns polars writes read like list (prompt structs, int64 ids)", async () => {
  const p = fixtureAt("large_list.parquet");
  const schema = await readParquetSchema(p);
  assert.equal(schema.fields.find((f) => f.name === "prompt")!.type.typeId, arrow.Type.LargeList, "the fixture really holds large_list");
  const got = await readParquet(p);
  assert.deepEqual(got.map((r) => r.prompt), [
    [{ role: "user", content: "1+1=" }],
    [{ role: "system", content: "be brief" }, { role: "user", content: "2+3=" }],
  ]);
  assert.deepEqual(got.map((r) => r.ids), [[1, 2, 3], [4]]);
  assert.deepEqual(got[1]!.reward_model, { ground_truth: "5", style: "rule" });
  const dir = tmp();
  try {
    const back = join(dir, "back.parquet");
    await writeParquet(back, got, schema);
    assert.deepEqual(await readParquet(back), got, "rows write back under the large_list schema");
  } finally { rmSync(dir, { recursive: true, force: true }); }
});

test("bad input: errors name the column and row, and nothing is written", async () => {
  const dir = tmp();
  try {
    const p = join(dir, "bad.parquet");
    await assert.rejects(writeParquet(p, [{ a: 1 }, { a: "x" }]), /column 'a': mixed value types \(int, string\)/);
    await assert.rejects(writeParquet(p, [{ s: { k: 1 } }, { s: { k: [1] } }]), /column 's'\.k: mixed value types/);
    const schema = new arrow.Schema([new arrow.Field("a", new arrow.Utf8(), false)]);
    await assert.rejects(writeParquet(p, [{ a: "x" }, { a: 3 }], schema), /column 'a' row 1: expected a string, got 3/);
    await assert.rejects(writeParquet(p, [{ a: null }], schema), /column 'a' row 0: null in a non-nullable column/);
    await assert.rejects(writeParquet(p, [{ a: "x", b: 1 }], schema), /row 0: column 'b' is not in the schema/);
    await assert.rejects(writeParquet(p, []), /cannot infer a parquet schema from 0 rows/);
    await assert.rejects(writeParquet(p, [{ d: new Date(0) }]), /column 'd' \(row 0\): cannot store a Date/);
    assert.equal(existsSync(p), false);
    await assert.rejects(readParquet(join(dir, "missing.parquet")), /cannot read parquet file .*missing\.parquet/);
  } finally { rmSync(dir, { recursive: true, force: true }); }
});
