// TensorBoard event files: TFRecord records, each holding one `Event` protobuf.
// Written by hand because no maintained npm package writes them (the npm
// TFRecord packages target tf.Example and pull in old protobuf stacks) and
// the subset needed is small:
//   record = u64le length | u32le masked_crc32c(length) | data | u32le masked_crc32c(data)
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
//   SessionLog { enum status = 1 (START = 1) }
// The reader below is the inverse, with both CRCs checked; tests and tools use it.
import { closeSync, fsyncSync, openSync, readFileSync, writeSync } from "node:fs";
import { maskedCrc32c } from "./crc32c.js";

// ---- protobuf wire format (the few field kinds used) ---------------------------------------

class ProtoWriter {
  private readonly parts: Uint8Array[] = [];

  private varint(v: bigint | number): void {
    let x = BigInt.asUintN(64, BigInt(v));
    const out: number[] = [];
    while (x >= 0x80n) {
      out.push(Number(x & 0x7fn) | 0x80);
      x >>= 7n;
    }
    out.push(Number(x));
    this.parts.push(Uint8Array.from(out));
  }

  private key(field: number, wire: number): void {
    this.varint((field << 3) | wire);
  }

  private fixed(field: number, wire: 1 | 5, bytes: Buffer): this {
    this.key(field, wire);
    this.parts.push(bytes);
    return this;
  }

  double(field: number, v: number): this {
    const b = Buffer.alloc(8);
    b.writeDoubleLE(v);
    return this.fixed(field, 1, b);
  }

  float(field: number, v: number): this {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    return this.fixed(field, 5, b);
  }

  int64(field: number, v: number): this {
    this.key(field, 0);
    this.varint(BigInt(Math.trunc(v)));
    return this;
  }

  bytes(field: number, v: Uint8Array): this {
    this.key(field, 2);
    this.varint(v.length);
    this.parts.push(v);
    return this;
  }

  string(field: number, v: string): this {
    return this.bytes(field, new TextEncoder().encode(v));
  }

  finish(): Uint8Array {
    return Buffer.concat(this.parts);
  }
}

export interface ScalarValue {
  tag: string;
  value: number;
}

export interface TbEvent {
  wallTime: number;
  step: number;
  fileVersion?: string;
  scalars?: ScalarValue[];
  /** SessionLog status (1 = START: TensorBoard drops data at or after this step from earlier runs). */
  sessionStatus?: number;
}

export function encodeEvent(e: TbEvent): Uint8Array {
  const w = new ProtoWriter().double(1, e.wallTime).int64(2, e.step);
  if (e.fileVersion !== undefined) w.string(3, e.fileVersion);
  if (e.scalars) {
    const summary = new ProtoWriter();
    for (const s of e.scalars) summary.bytes(1, new ProtoWriter().string(1, s.tag).float(2, s.value).finish());
    w.bytes(5, summary.finish());
  }
  if (e.sessionStatus !== undefined) w.bytes(7, new ProtoWriter().int64(1, e.sessionStatus).finish());
  return w.finish();
}

/** One TFRecord: length, its masked CRC, the data, the data's masked CRC. */
export function frameRecord(data: Uint8Array): Uint8Array {
  const out = new Uint8Array(12 + data.length + 4);
  const view = new DataView(out.buffer);
  view.setBigUint64(0, BigInt(data.length), true);
  view.setUint32(8, maskedCrc32c(out.subarray(0, 8)), true);
  out.set(data, 12);
  view.setUint32(12 + data.length, maskedCrc32c(data), true);
  return out;
}

// ---- writer --------------------------------------------------------------------------------

/** Appends events to one file; the first record is the `brain.Event:2` version record TensorBoard expects. */
export class EventFileWriter {
  private fd: number | null;

  constructor(readonly path: string, wallTime = Date.now() / 1000) {
    this.fd = openSync(path, "a");
    this.write([{ wallTime, step: 0, fileVersion: "brain.Event:2" }]);
  }

  /** All events of one call in one write, so a crash never leaves a partial step behind a whole one. */
  write(events: TbEvent[]): void {
    if (this.fd === null) throw new Error(`tensorboard event file ${this.path} is closed`);
    const buf = Buffer.concat(events.map((e) => frameRecord(encodeEvent(e))));
    let off = 0;
    while (off < buf.length) off += writeSync(this.fd, buf, off, buf.length - off);
  }

  close(): void {
    if (this.fd === null) return;
    fsyncSync(this.fd);
    closeSync(this.fd);
    this.fd = null;
  }
}

// ---- reader --------------------------------------------------------------------------------

class ProtoReader {
  pos = 0;
  private readonly view: DataView;
  constructor(private readonly buf: Uint8Array) {
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }
  get done(): boolean {
    return this.pos >= this.buf.length;
  }
  varint(): bigint {
    let x = 0n, shift = 0n;
    for (;;) {
      if (this.pos >= this.buf.length) throw new Error("truncated varint");
      const b = this.buf[this.pos++]!;
      x |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return x;
      shift += 7n;
    }
  }
  /** The next field: number, wire type and its raw value (number for fixed/varint, bytes for length-delimited). */
  field(): { no: number; wire: number; num?: number; big?: bigint; bytes?: Uint8Array } {
    const key = Number(this.varint());
    const no = key >>> 3, wire = key & 7;
    if (wire === 0) return { no, wire, big: this.varint() };
    if (wire === 1) { const v = this.view.getFloat64(this.pos, true); this.pos += 8; return { no, wire, num: v }; }
    if (wire === 5) { const v = this.view.getFloat32(this.pos, true); this.pos += 4; return { no, wire, num: v }; }
    if (wire === 2) {
      const len = Number(this.varint());
      const bytes = this.buf.subarray(this.pos, this.pos + len);
      if (bytes.length !== len) throw new Error("truncated length-delimited field");
      this.pos += len;
      return { no, wire, bytes };
    }
    throw new Error(`unsupported protobuf wire type ${wire}`);
  }
}

export function decodeEvent(data: Uint8Array): TbEvent {
  const r = new ProtoReader(data);
  const e: TbEvent = { wallTime: 0, step: 0 };
  while (!r.done) {
    const f = r.field();
    if (f.no === 1 && f.wire === 1) e.wallTime = f.num!;
    else if (f.no === 2 && f.wire === 0) e.step = Number(BigInt.asIntN(64, f.big!));
    else if (f.no === 3 && f.bytes) e.fileVersion = new TextDecoder().decode(f.bytes);
    else if (f.no === 5 && f.bytes) {
      const s = new ProtoReader(f.bytes);
      e.scalars ??= [];
      while (!s.done) {
        const v = s.field();
        if (v.no !== 1 || !v.bytes) continue;
        const vr = new ProtoReader(v.bytes);
        const sv: ScalarValue = { tag: "", value: Number.NaN };
        while (!vr.done) {
          const g = vr.field();
          if (g.no === 1 && g.bytes) sv.tag = new TextDecoder().decode(g.bytes);
          else if (g.no === 2 && g.wire === 5) sv.value = g.num!;
        }
        e.scalars.push(sv);
      }
    } else if (f.no === 7 && f.bytes) {
      const s = new ProtoReader(f.bytes);
      while (!s.done) {
        const g = s.field();
        if (g.no === 1 && g.wire === 0) e.sessionStatus = Number(g.big!);
      }
    }
  }
  return e;
}

/** Every record's payload, with both masked CRCs checked; a bad or truncated record throws naming its offset. */
export function readRecords(path: string): Uint8Array[] {
  const buf = readFileSync(path);
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const out: Uint8Array[] = [];
  let off = 0;
  while (off < buf.length) {
    if (off + 12 > buf.length) throw new Error(`${path}: truncated record header at byte ${off}`);
    if (view.getUint32(off + 8, true) !== maskedCrc32c(buf.subarray(off, off + 8))) throw new Error(`${path}: length CRC mismatch at byte ${off}`);
    const len = Number(view.getBigUint64(off, true));
    const end = off + 12 + len;
    if (end + 4 > buf.length) throw new Error(`${path}: truncated record at byte ${off}`);
    const data = buf.subarray(off + 12, end);
    if (view.getUint32(end, true) !== maskedCrc32c(data)) throw new Error(`${path}: data CRC mismatch in the record at byte ${off}`);
    out.push(data);
    off = end + 4;
  }
  return out;
}

export function readEventFile(path: string): TbEvent[] {
  return readRecords(path).map(decodeEvent);
}
