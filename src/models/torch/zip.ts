// Random-access bytes (a file read by offset, never whole, or an in-memory buffer) and the zip
// container torch.save writes since PyTorch 1.6: entries stored uncompressed, each entry's data
// aligned by padding in its local header's extra field, ZIP64 records once the archive passes 4 GB.
// Only the central directory is read up front; an entry's bytes are read when asked for.
import { closeSync, fstatSync, openSync, readSync } from "node:fs";

/** Bytes readable at any offset; `name` is how errors name the source (a file path). */
export interface ByteSource {
  readonly name: string;
  readonly size: number;
  /** `length` bytes at `offset` (a fresh, unshared copy). */
  read(offset: number, length: number): Uint8Array;
}

/** A file read by offset: nothing is loaded until asked for, so files past 2 GB work. */
export class FileSource implements ByteSource {
  readonly size: number;
  private fd: number | null;

  constructor(readonly name: string) {
    this.fd = openSync(name, "r");
    this.size = fstatSync(this.fd).size;
  }

  read(offset: number, length: number): Uint8Array {
    if (this.fd === null) throw new Error(`${this.name}: read after close`);
    if (offset < 0 || length < 0 || offset + length > this.size) {
      throw new Error(`${this.name}: truncated (wanted bytes ${offset}..${offset + length} of ${this.size})`);
    }
    const out = new Uint8Array(length);
    let got = 0;
    while (got < length) {
      // readSync takes at most 2 GB per call
      const n = readSync(this.fd, out, got, Math.min(length - got, 0x40000000), offset + got);
      if (n === 0) throw new Error(`${this.name}: unexpected end of file at byte ${offset + got}`);
      got += n;
    }
    return out;
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/** An in-memory buffer, or a window [start, start + size) of another source. */
export class SliceSource implements ByteSource {
  constructor(readonly base: ByteSource | Uint8Array, readonly start: number, readonly size: number, readonly name: string) {
    const total = base instanceof Uint8Array ? base.byteLength : base.size;
    if (start < 0 || size < 0 || start + size > total) throw new Error(`${name}: bytes ${start}..${start + size} lie outside its ${total} bytes`);
  }

  static of(bytes: Uint8Array, name: string): SliceSource {
    return new SliceSource(bytes, 0, bytes.byteLength, name);
  }

  read(offset: number, length: number): Uint8Array {
    if (offset < 0 || length < 0 || offset + length > this.size) {
      throw new Error(`${this.name}: truncated (wanted bytes ${offset}..${offset + length} of ${this.size})`);
    }
    if (this.base instanceof Uint8Array) return this.base.slice(this.start + offset, this.start + offset + length);
    return this.base.read(this.start + offset, length);
  }
}

export interface ZipEntry {
  name: string;
  /** Where the entry's bytes start within the source (after its local header). */
  dataOffset: number;
  size: number;
}

const EOCD = 0x06054b50, ZIP64_LOCATOR = 0x07064b50, ZIP64_EOCD = 0x06064b50, CENTRAL = 0x02014b50, LOCAL = 0x04034b50;

function u64(dv: DataView, at: number, what: string, src: ByteSource): number {
  const v = dv.getBigUint64(at, true);
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`${src.name}: zip ${what} ${v} is past 2^53`);
  return Number(v);
}

const view = (b: Uint8Array) => new DataView(b.buffer, b.byteOffset, b.byteLength);

/**
 * The entries of a zip archive (by name). Only stored (uncompressed) entries can be read as torch
 * writes them; a compressed entry is refused when read (`entryBytes`), naming it.
 */
export function readZipDirectory(src: ByteSource): Map<string, ZipEntry & { method: number }> {
  const tailLen = Math.min(src.size, 22 + 0xffff);
  const tail = src.read(src.size - tailLen, tailLen), tdv = view(tail);
  let at = -1;
  for (let i = tailLen - 22; i >= 0; i--) if (tdv.getUint32(i, true) === EOCD) { at = i; break; }
  if (at < 0) throw new Error(`${src.name}: not a zip archive (no end-of-central-directory record)`);
  let count = tdv.getUint16(at + 10, true), cdSize = tdv.getUint32(at + 12, true), cdOffset = tdv.getUint32(at + 16, true);
  if (count === 0xffff || cdSize === 0xffffffff || cdOffset === 0xffffffff) {
    const locAt = src.size - tailLen + at - 20;
    if (locAt < 0) throw new Error(`${src.name}: ZIP64 archive without its locator`);
    const loc = view(src.read(locAt, 20));
    if (loc.getUint32(0, true) !== ZIP64_LOCATOR) throw new Error(`${src.name}: ZIP64 archive without its locator`);
    const e64At = u64(loc, 8, "ZIP64 record offset", src);
    const e64 = view(src.read(e64At, 56));
    if (e64.getUint32(0, true) !== ZIP64_EOCD) throw new Error(`${src.name}: bad ZIP64 end-of-central-directory record`);
    count = u64(e64, 32, "entry count", src);
    cdSize = u64(e64, 40, "central directory size", src);
    cdOffset = u64(e64, 48, "central directory offset", src);
  }
  const cd = src.read(cdOffset, cdSize), dv = view(cd), dec = new TextDecoder();
  const out = new Map<string, ZipEntry & { method: number }>();
  let p = 0;
  for (let n = 0; n < count; n++) {
    if (p + 46 > cd.byteLength || dv.getUint32(p, true) !== CENTRAL) throw new Error(`${src.name}: corrupt zip central directory (entry ${n})`);
    const method = dv.getUint16(p + 10, true);
    let comp = dv.getUint32(p + 20, true), size = dv.getUint32(p + 24, true), local = dv.getUint32(p + 42, true);
    const nameLen = dv.getUint16(p + 28, true), extraLen = dv.getUint16(p + 30, true), commentLen = dv.getUint16(p + 32, true);
    const name = dec.decode(cd.subarray(p + 46, p + 46 + nameLen));
    // ZIP64 extended information: 8-byte values for the fields saturated above, in this order
    for (let e = p + 46 + nameLen; e + 4 <= p + 46 + nameLen + extraLen;) {
      const id = dv.getUint16(e, true), len = dv.getUint16(e + 2, true);
      if (id === 0x0001) {
        let q = e + 4;
        if (size === 0xffffffff) { size = u64(dv, q, "entry size", src); q += 8; }
        if (comp === 0xffffffff) { comp = u64(dv, q, "entry size", src); q += 8; }
        if (local === 0xffffffff) { local = u64(dv, q, "entry offset", src); q += 8; }
      }
      e += 4 + len;
    }
    const lh = view(src.read(local, 30));
    if (lh.getUint32(0, true) !== LOCAL) throw new Error(`${src.name}: corrupt zip local header for '${name}'`);
    const dataOffset = local + 30 + lh.getUint16(26, true) + lh.getUint16(28, true);
    if (method === 0 && comp !== size) throw new Error(`${src.name}: zip entry '${name}' is stored but its sizes differ`);
    if (dataOffset + comp > src.size) throw new Error(`${src.name}: zip entry '${name}' runs past the end of the file (truncated?)`);
    out.set(name, { name, dataOffset, size, method });
    p += 46 + nameLen + extraLen + commentLen;
  }
  return out;
}

/** An entry's bytes, or `length` of them from `offset` within it; compressed entries are refused. */
export function entryBytes(src: ByteSource, e: ZipEntry & { method: number }, offset = 0, length = e.size - offset): Uint8Array {
  if (e.method !== 0) throw new Error(`${src.name}: zip entry '${e.name}' is compressed (method ${e.method}); torch.save stores entries uncompressed, so this is not a torch.save file`);
  if (offset < 0 || offset + length > e.size) throw new Error(`${src.name}: zip entry '${e.name}' holds ${e.size} bytes, wanted ${offset}..${offset + length}`);
  return src.read(e.dataOffset + offset, length);
}
