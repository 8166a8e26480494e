import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isTuple, StreamReader, unpickle } from "../../src/models/torch/pickle.js";
import { loadTorch, openTorchFile, readTorchStateDict, TorchTensor } from "../../src/models/torch/torch_save.js";
import { FileSource, SliceSource } from "../../src/models/torch/zip.js";

const MIMIC = "test/models/fixtures/torch_mimic";
const TORCH = "test/models/fixtures/torch";

/** A decoded value against make_*_fixtures.py's JSON form of it (tensors: dtype, shape, row-major values). */
function assertMatches(got: unknown, want: unknown, at: string): void {
  if (want !== null && typeof want === "object" && !Array.isArray(want)) {
    const w = want as Record<string, unknown>;
    if (w["__tensor__"]) {
      assert.ok(got instanceof TorchTensor, `${at}: a tensor`);
      const t = got as TorchTensor;
      assert.equal(t.dtype, w["dtype"], `${at}: dtype`);
      assert.deepEqual(t.shape, w["shape"], `${at}: shape`);
      const vals = Array.from(t.values() as ArrayLike<number | bigint>, (v) => (t.dtype === "bool" ? v !== 0 : Number(v)));
      assert.deepEqual(vals, w["values"], `${at}: values`);
      return;
    }
    if ("__dict__" in w) {
      assert.ok(got instanceof Map, `${at}: a dict`);
      const items = w["items"] as [string, unknown][];
      assert.deepEqual([...(got as Map<unknown, unknown>).keys()], items.map(([k]) => k), `${at}: keys in order`);
      for (const [k, v] of items) assertMatches((got as Map<unknown, unknown>).get(k), v, `${at}.${k}`);
      return;
    }
    if ("__tuple__" in w) {
      assert.ok(isTuple(got), `${at}: a tuple`);
      const items = w["__tuple__"] as unknown[];
      assert.equal((got as unknown[]).length, items.length);
      items.forEach((v, i) => assertMatches((got as unknown[])[i], v, `${at}[${i}]`));
      return;
    }
    if ("__bytes__" in w) {
      assert.ok(got instanceof Uint8Array, `${at}: bytes`);
      assert.deepEqual([...(got as Uint8Array)], w["__bytes__"]);
      return;
    }
  }
  if (Array.isArray(want)) {
    assert.ok(Array.isArray(got) && !isTuple(got), `${at}: a list`);
    assert.equal((got as unknown[]).length, want.length, `${at}: length`);
    want.forEach((v, i) => assertMatches((got as unknown[])[i], v, `${at}[${i}]`));
    return;
  }
  assert.equal(typeof got === "bigint" ? Number(got) : got, want, at);
  if (typeof got === "bigint") assert.equal(got, BigInt(want as number), `${at}: exact`);
}

function checkAgainstJson(pt: string, json: string): void {
  const f = openTorchFile(pt);
  try {
    assertMatches(f.value, JSON.parse(readFileSync(json, "utf8")), pt);
  } finally {
    f.close();
  }
}

test("torch files (pickle mimics): zip and legacy formats decode every dtype, views, shared storages and containers", () => {
  checkAgainstJson(`${MIMIC}/mimic.pt`, `${MIMIC}/mimic.json`);
  checkAgainstJson(`${MIMIC}/mimic_legacy.pt`, `${MIMIC}/mimic.json`);
  checkAgainstJson(`${MIMIC}/mimic_zip64.pt`, `${MIMIC}/mimic.json`);
  // the end record's fields saturated, as a writer leaves them past 4 GB: the ZIP64 end record is read instead
  const z64 = new Uint8Array(readFileSync(`${MIMIC}/mimic_zip64.pt`)), eocd = Buffer.from(z64).lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  z64.fill(0xff, eocd + 8, eocd + 20);
  assertMatches(loadTorch(SliceSource.of(z64, "saturated.pt")).value, JSON.parse(readFileSync(`${MIMIC}/mimic.json`, "utf8")), "saturated.pt");
  const zip = openTorchFile(`${MIMIC}/mimic.pt`), legacy = openTorchFile(`${MIMIC}/mimic_legacy.pt`);
  try {
    assert.equal(zip.format, "zip");
    assert.equal(legacy.format, "legacy");
    const m = zip.value as Map<string, TorchTensor>;
    // the three views of one storage share it; a storage is one object however many tensors use it
    assert.equal(m.get("transposed")!.storage, m.get("row")!.storage);
    assert.equal(m.get("block")!.storage, m.get("row")!.storage);
    assert.equal(m.get("transposed")!.contiguous, false);
    assert.equal(m.get("param")!.requiresGrad, false, "the inner tensor of a parameter");
    // every tensor on the shared storage read (the cache is dropped after the last), then one read
    // again: its values come back from the file, equal to what torch wrote
    for (const k of ["transposed", "block", "row"]) m.get(k)!.toFloat32();
    const expected = (JSON.parse(readFileSync(`${MIMIC}/mimic.json`, "utf8")) as { items: [string, { values: number[] }][] }).items.find(([k]) => k === "row")![1].values;
    assert.deepEqual(Array.from(m.get("row")!.toFloat32()), expected);
  } finally {
    zip.close();
    legacy.close();
  }
});

test("torch files: a name outside the allowed table is refused with the name and file; nothing runs", () => {
  assert.throws(() => openTorchFile(`${MIMIC}/refused.pt`), (e: Error) => e.message.includes("os.system") && e.message.includes("refused.pt") && e.message.includes("not read"));
  // a pickle naming builtins.eval, and a non-torch pickle
  const evil = Uint8Array.from([0x80, 0x02, ...Buffer.from("cbuiltins\neval\n"), 0x58, 1, 0, 0, 0, 0x31, 0x85, 0x52, 0x2e]);
  assert.throws(() => unpickle(new StreamReader(SliceSource.of(evil, "e.pkl")), { global: (m, n) => { throw new Error(`e.pkl: ${m}.${n} refused`); } }, "e.pkl"), /builtins\.eval refused/);
  assert.throws(() => loadTorch(SliceSource.of(Uint8Array.from([0x80, 0x02, 0x4b, 0x05, 0x2e]), "five.pt")), /five\.pt: a pickle, but not a torch\.save file/);
  assert.throws(() => loadTorch(SliceSource.of(Buffer.from("hello world"), "x.pt")), /x\.pt: not a torch\.save file/);
  // protocol 0 text opcodes are not read
  assert.throws(() => unpickle(new StreamReader(SliceSource.of(Buffer.from("I5\n."), "p0")), { global: () => null }, "p0"), /opcode INT/);
});

test("torch files: truncated and corrupt files are refused naming the file", () => {
  const dir = mkdtempSync(join(tmpdir(), "torchpk-"));
  const full = readFileSync(`${MIMIC}/mimic.pt`);
  writeFileSync(join(dir, "cut.pt"), full.subarray(0, full.length - 30));
  assert.throws(() => openTorchFile(join(dir, "cut.pt")), /cut\.pt/);
  const legacy = readFileSync(`${MIMIC}/mimic_legacy.pt`);
  writeFileSync(join(dir, "cut_legacy.pt"), legacy.subarray(0, legacy.length - 5));
  assert.throws(() => openTorchFile(join(dir, "cut_legacy.pt")), /cut_legacy\.pt: truncated/);
  // a state dict reader refuses a non-tensor entry by name
  assert.throws(() => readTorchStateDict(`${MIMIC}/mimic.pt`), /mimic\.pt: 'nested' is dict of 5, not a tensor/);
});

test("torch files: a torch.save stream inside a larger file (distributed checkpoint chunks) reads through a window", () => {
  const full = readFileSync(`${MIMIC}/mimic.pt`);
  const padded = new Uint8Array(full.length + 100);
  padded.set(full, 37);
  const src = new FileSource(`${MIMIC}/mimic.pt`);
  try {
    const direct = loadTorch(src).value as Map<string, TorchTensor>;
    const inner = loadTorch(new SliceSource(padded, 37, full.length, "chunk")).value as Map<string, TorchTensor>;
    assert.deepEqual(Array.from(inner.get("block")!.toFloat32()), Array.from(direct.get("block")!.toFloat32()));
  } finally {
    src.close();
  }
});

test("torch files written by torch (fixtures of scripts/make_torch_fixtures.py): basic.pt and basic_legacy.pt", () => {
  checkAgainstJson(`${TORCH}/basic.pt`, `${TORCH}/basic.json`);
  checkAgainstJson(`${TORCH}/basic_legacy.pt`, `${TORCH}/basic.json`);
});
