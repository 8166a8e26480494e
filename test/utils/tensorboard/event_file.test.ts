// TensorBoard event files: CRC-32C against published vectors, every record's two
// masked CRCs checked by a bit-by-bit CRC written here (independent of the table
// in src), the Event protos decoded, the backend's directory and resume layout,
// and, where python3 has the tensorboard package, TensorBoard's own reader.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { crc32c, maskedCrc32c } from "../../../src/utils/tensorboard/crc32c.js";
import { EventFileWriter, readEventFile } from "../../../src/utils/tensorboard/event_file.js";
import { TensorboardBackend, tensorboardDir } from "../../../src/utils/tensorboard/backend.js";
import { Tracking } from "../../../src/utils/tracking.js";

function bitwiseCrc32c(bytes: Uint8Array): number {
  let c = ~0 >>> 0;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0x82f63b78 & -(c & 1));
  }
  return ~c >>> 0;
}
const mask = (c: number) => ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;

/** Every record of a file as TFRecord frames it, both CRCs checked with the bitwise CRC above. */
function checkedRecords(buf: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let off = 0;
  while (off < buf.length) {
    const len = Number(buf.readBigUInt64LE(off));
    assert.equal(buf.readUInt32LE(off + 8), mask(bitwiseCrc32c(buf.subarray(off, off + 8))), `length CRC at ${off}`);
    const data = buf.subarray(off + 12, off + 12 + len);
    assert.equal(buf.readUInt32LE(off + 12 + len), mask(bitwiseCrc32c(data)), `data CRC at ${off}`);
    out.push(data);
    off += 16 + len;
  }
  assert.equal(off, buf.length, "no trailing bytes");
  return out;
}

test("CRC-32C matches the published check values; the mask is TFRecord's", () => {
  assert.equal(crc32c(new TextEncoder().encode("123456789")), 0xe3069283);
  assert.equal(crc32c(new Uint8Array(32)), 0x8a9136aa); // RFC 3720 B.4: 32 bytes of zeros
  assert.equal(crc32c(new Uint8Array(32).fill(0xff)), 0x62a8ab43);
  const rnd = Uint8Array.from({ length: 1000 }, (_, i) => (i * 7919 + 13) & 0xff);
  assert.equal(crc32c(rnd), bitwiseCrc32c(rnd));
  assert.equal(maskedCrc32c(rnd), mask(bitwiseCrc32c(rnd)));
});

test("event file: version record first, scalars with wall time and step, CRCs valid, bytes as protobuf encodes them", () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-tb-"));
  try {
    const path = join(dir, "events.out.tfevents.test");
    const w = new EventFileWriter(path, 1700000000.5);
    w.write([{ wallTime: 1700000001.25, step: 3, scalars: [{ tag: "critic/score/mean", value: 0.75 }, { tag: "x", value: -2 }] }]);
    w.write([{ wallTime: 1700000002, step: 2 ** 40, scalars: [{ tag: "big", value: 1e-3 }] }]);
    w.close();
    const records = checkedRecords(readFileSync(path));
    assert.equal(records.length, 3);
    // Event{wall_time=1700000000.5 (field 1, double), step=0 (field 2), file_version="brain.Event:2" (field 3)}
    const wall = Buffer.alloc(8);
    wall.writeDoubleLE(1700000000.5);
    assert.deepEqual(records[0], Buffer.concat([Buffer.from([0x09]), wall, Buffer.from([0x10, 0x00, 0x1a, 13]), Buffer.from("brain.Event:2")]));
    // Summary.Value{tag="x" (field 1), simple_value=-2 (field 2, float)} inside the second event.
    const value = Buffer.concat([Buffer.from([0x0a, 1]), Buffer.from("x"), Buffer.from([0x15]), Buffer.from(new Float32Array([-2]).buffer)]);
    assert.ok(records[1]!.includes(value), "the scalar's Value bytes");
    const events = readEventFile(path);
    assert.deepEqual(events[0], { wallTime: 1700000000.5, step: 0, fileVersion: "brain.Event:2" });
    assert.deepEqual(events[1], { wallTime: 1700000001.25, step: 3, scalars: [{ tag: "critic/score/mean", value: 0.75 }, { tag: "x", value: -2 }] });
    assert.equal(events[2]!.step, 2 ** 40);
    assert.equal(events[2]!.scalars![0]!.value, Math.fround(1e-3));
    // A flipped byte in the data is caught.
    const bad = readFileSync(path);
    bad[bad.length - 6] ^= 1;
    writeFileSync(path, bad);
    assert.throws(() => readEventFile(path), /data CRC mismatch in the record at byte/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("tensorboard backend: verl's directory ($TENSORBOARD_DIR, else tensorboard_log/{project}/{experiment}); a resume opens a new file with SessionLog START", () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-tb-"));
  const prev = process.env.TENSORBOARD_DIR;
  try {
    delete process.env.TENSORBOARD_DIR;
    assert.equal(tensorboardDir("proj", "exp"), resolve("tensorboard_log", "proj", "exp"));
    process.env.TENSORBOARD_DIR = dir;
    const t = new Tracking({ projectName: "p", experimentName: "e", backends: ["tensorboard"] });
    for (let s = 1; s <= 3; s++) t.log({ "actor/pg_loss": s / 4, "training/flag": true, note: "text is not a scalar" }, s);
    t.finish();
    const resumed = new TensorboardBackend("p", "e");
    resumed.begin(2);
    resumed.log({ "actor/pg_loss": 9 }, 3);
    resumed.finish();
    const files = readdirSync(dir).sort();
    assert.equal(files.length, 2);
    for (const f of files) assert.match(f, /^events\.out\.tfevents\.\d{10}\.[^.]+.*\.\d+\.\d+$/);
    const all = files.map((f) => readEventFile(join(dir, f)));
    const first = all.find((evs) => evs.some((e) => e.sessionStatus === undefined && e.step === 1))!;
    assert.deepEqual(first.slice(1).map((e) => [e.step, e.scalars]), [1, 2, 3].map((s) => [s, [{ tag: "actor/pg_loss", value: s / 4 }, { tag: "training/flag", value: 1 }]]));
    const second = all.find((evs) => evs !== first)!;
    assert.equal(second[0]!.fileVersion, "brain.Event:2");
    assert.deepEqual([second[1]!.step, second[1]!.sessionStatus], [3, 1]);
    assert.deepEqual(second[2]!.scalars, [{ tag: "actor/pg_loss", value: 9 }]);
  } finally {
    if (prev === undefined) delete process.env.TENSORBOARD_DIR;
    else process.env.TENSORBOARD_DIR = prev;
    rmSync(dir, { recursive: true, force: true });
  }
});

const hasTensorboard = spawnSync("python3", ["-c", "import tensorboard"], { stdio: "ignore" }).status === 0;

test("TensorBoard's EventAccumulator reads the scalars back", { skip: hasTensorboard ? false : "python3 with the tensorboard package is not installed here" }, () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-tb-"));
  try {
    const w = new EventFileWriter(join(dir, "events.out.tfevents.1700000000.host"), 1700000000);
    for (let s = 1; s <= 3; s++) w.write([{ wallTime: 1700000000 + s, step: s, scalars: [{ tag: "critic/score/mean", value: s / 2 }] }]);
    w.close();
    const py = [
      "import sys, json",
      "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator",
      "acc = EventAccumulator(sys.argv[1]); acc.Reload()",
      "print(json.dumps([[e.step, e.value] for e in acc.Scalars('critic/score/mean')]))",
    ].join("\n");
    const r = spawnSync("python3", ["-c", py, dir], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), [[1, 0.5], [2, 1], [3, 1.5]]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
