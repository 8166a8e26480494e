// Files written by torch.save, read without torch, in both of its formats:
//   zip (PyTorch >= 1.6, the default): a stored zip holding <archive>/data.pkl (the object's
//     pickle), <archive>/data/<key> (one entry per storage, raw little-endian elements),
//     <archive>/byteorder and <archive>/version;
//   legacy (_use_new_zipfile_serialization=False, and files from before 1.6): five things one
//     after the other: a pickled magic number, the protocol version (1001), a system-info dict, the
//     object's pickle, the list of storage keys, then per key an int64 element count and the
//     storage's raw elements.
// The object pickle refers to storages by persistent id; tensors are rebuilt by
// torch._utils._rebuild_tensor_v2 (storage, element offset, size, stride, ...). Here a tensor is a
// view (TorchTensor) whose values are read from the file only when asked for, by offset: a
// storage is read once however many tensors share it, and a storage used by one tensor is read
// only over that tensor's span, so a multi-GB pytorch_model.bin is never one Buffer.
import { halfToFloat } from "../safetensors.js";
import { isTuple, PyCallable, PyObject, StreamReader, unpickle, type PickleHooks } from "./pickle.js";
import { entryBytes, FileSource, readZipDirectory, SliceSource, type ByteSource } from "./zip.js";

export type TorchDtype = "float32" | "float16" | "bfloat16" | "float64" | "int64" | "int32" | "int16" | "int8" | "uint8" | "bool";

export const DTYPE_WIDTH: Record<TorchDtype, number> = {
  float32: 4, float16: 2, bfloat16: 2, float64: 8, int64: 8, int32: 4, int16: 2, int8: 1, uint8: 1, bool: 1,
};

/** torch's legacy typed-storage classes (what torch.save names a tensor's storage type by) and their dtypes. */
const STORAGE_DTYPES: Record<string, TorchDtype> = {
  FloatStorage: "float32", HalfStorage: "float16", BFloat16Storage: "bfloat16", DoubleStorage: "float64",
  LongStorage: "int64", IntStorage: "int32", ShortStorage: "int16", CharStorage: "int8", ByteStorage: "uint8",
  BoolStorage: "bool", UntypedStorage: "uint8",
};

/** torch's dtype objects by attribute name (torch.float32, torch.half, ...), as pickled. */
const DTYPE_NAMES: Record<string, TorchDtype> = {
  float32: "float32", float: "float32", float16: "float16", half: "float16", bfloat16: "bfloat16", float64: "float64",
  double: "float64", int64: "int64", long: "int64", int32: "int32", int: "int32", int16: "int16", short: "int16",
  int8: "int8", uint8: "uint8", bool: "bool",
};

/** A storage class named by a pickle (torch.FloatStorage, ...). */
export class StorageType {
  constructor(readonly name: string, readonly dtype: TorchDtype) {}
}

/** A torch dtype object named by a pickle (torch.bfloat16); `dtype` is null for one not read here. */
export class TorchDtypeValue {
  constructor(readonly name: string, readonly dtype: TorchDtype | null) {}
}

/** One storage of a file: `numel` elements of `dtype`, read from the file on demand. */
export class TorchStorage {
  /** Tensors built on this storage that have not been materialised yet. */
  private pending = 0;
  private cache: Uint8Array | null = null;

  constructor(
    readonly key: string, readonly dtype: TorchDtype, readonly numel: number,
    private readonly reader: (byteOffset: number, byteLength: number) => Uint8Array,
  ) {}

  /** @internal a tensor was built on this storage */
  addUser(): void {
    this.pending++;
  }

  /** @internal bytes [offset, offset + length) of the storage; cached while other tensors on it are still unread */
  bytes(offset: number, length: number, first: boolean): Uint8Array {
    if (first) this.pending--;
    if (this.cache) {
      const out = this.cache.subarray(offset, offset + length);
      if (this.pending <= 0) this.cache = null;
      return out;
    }
    if (this.pending > 0) {
      this.cache = this.reader(0, this.numel * DTYPE_WIDTH[this.dtype]);
      return this.cache.subarray(offset, offset + length);
    }
    return this.reader(offset, length);
  }
}

type Values = Float32Array | Float64Array | BigInt64Array | Int32Array | Int16Array | Int8Array | Uint8Array;

/** A tensor of a torch file: a strided view of a storage, read when its values are asked for. */
export class TorchTensor {
  private read = false;

  constructor(
    readonly storage: TorchStorage, readonly storageOffset: number, readonly shape: number[], readonly stride: number[],
    readonly requiresGrad: boolean, readonly file: string,
  ) {
    const bad = (why: string) => new Error(`${file}: a tensor of shape [${shape}] on storage '${storage.key}' ${why}`);
    if (shape.length !== stride.length) throw bad(`has ${stride.length} strides`);
    if (![...shape, ...stride, storageOffset].every((v) => Number.isSafeInteger(v) && v >= 0)) throw bad(`has a negative or non-integer size, stride or offset (stride [${stride}], offset ${storageOffset})`);
    if (this.numel > 0) {
      const last = storageOffset + shape.reduce((s, n, i) => s + (n - 1) * stride[i]!, 0);
      if (last >= storage.numel) throw bad(`(stride [${stride}], offset ${storageOffset}) reaches element ${last} of a storage of ${storage.numel}`);
    }
    storage.addUser();
  }

  get dtype(): TorchDtype {
    return this.storage.dtype;
  }

  get numel(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** Whether the view is row-major contiguous (then its elements are one run of the storage). */
  get contiguous(): boolean {
    let expect = 1;
    for (let i = this.shape.length - 1; i >= 0; i--) {
      if (this.shape[i] !== 1 && this.stride[i] !== expect) return false;
      expect *= this.shape[i]!;
    }
    return true;
  }

  /** The elements in row-major order as little-endian bytes, in a fresh buffer starting at offset 0. */
  bytes(): Uint8Array {
    const w = DTYPE_WIDTH[this.dtype], n = this.numel, first = !this.read;
    // a view may repeat elements (stride 0): its contiguous copy must still fit one buffer
    if (n * w > 2 ** 32) throw new Error(`${this.file}: a tensor of shape [${this.shape}] ${this.dtype} is ${n * w} bytes as one array, past the 4 GB a buffer holds`);
    this.read = true;
    if (n === 0) { if (first) this.storage.bytes(0, 0, true); return new Uint8Array(0); }
    const span = this.shape.reduce((s, d, i) => s + (d - 1) * this.stride[i]!, 0) + 1;
    const raw = this.storage.bytes(this.storageOffset * w, span * w, first);
    if (this.contiguous) return raw.byteOffset === 0 && raw.byteLength === raw.buffer.byteLength ? raw : raw.slice();
    // a strided view: gather element by element (the last axis as the inner loop)
    const out = new Uint8Array(n * w), nd = this.shape.length, idx = new Array<number>(nd).fill(0);
    const inner = this.shape[nd - 1]!, innerStride = this.stride[nd - 1]! * w;
    let o = 0;
    for (;;) {
      let base = 0;
      for (let d = 0; d < nd - 1; d++) base += idx[d]! * this.stride[d]!;
      base *= w;
      for (let j = 0; j < inner; j++, o += w) out.set(raw.subarray(base + j * innerStride, base + j * innerStride + w), o);
      let d = nd - 2;
      for (; d >= 0; d--) { if (++idx[d]! < this.shape[d]!) break; idx[d] = 0; }
      if (d < 0) break;
    }
    return out;
  }

  /** The values in row-major order: f16 / bf16 widened to float32, int64 as BigInt64Array, bool as 0 / 1 bytes. */
  values(): Values {
    const b = this.bytes(), n = this.numel;
    switch (this.dtype) {
      case "float32": return new Float32Array(b.buffer, 0, n);
      case "float64": return new Float64Array(b.buffer, 0, n);
      case "int64": return new BigInt64Array(b.buffer, 0, n);
      case "int32": return new Int32Array(b.buffer, 0, n);
      case "int16": return new Int16Array(b.buffer, 0, n);
      case "int8": return new Int8Array(b.buffer, 0, n);
      case "uint8": case "bool": return b;
      case "float16": case "bfloat16": {
        const h = new Uint16Array(b.buffer, 0, n), out = new Float32Array(n);
        if (this.dtype === "bfloat16") { const u = new Uint32Array(out.buffer); for (let i = 0; i < n; i++) u[i] = h[i]! << 16; }
        else for (let i = 0; i < n; i++) out[i] = halfToFloat(h[i]!);
        return out;
      }
    }
  }

  /** The values as float32 (what the models compute in). */
  toFloat32(): Float32Array {
    const v = this.values();
    if (v instanceof Float32Array) return v;
    if (v instanceof BigInt64Array) return Float32Array.from(v, (x) => Number(x));
    return Float32Array.from(v);
  }
}

/** A short description of a decoded value, for errors. */
export function describe(v: unknown): string {
  if (v === null) return "None";
  if (v instanceof TorchTensor) return `tensor ${v.dtype} [${v.shape}]`;
  if (v instanceof Map) return `dict of ${v.size}`;
  if (isTuple(v)) return `tuple of ${v.length}`;
  if (Array.isArray(v)) return `list of ${v.length}`;
  if (v instanceof PyObject) return v.cls;
  if (v instanceof Uint8Array) return `bytes of ${v.byteLength}`;
  return typeof v === "string" ? `str ${JSON.stringify(v.slice(0, 40))}` : `${typeof v} ${String(v)}`;
}

function intTuple(v: unknown, what: string, file: string): number[] {
  if (!Array.isArray(v) || !v.every((x) => typeof x === "number")) throw new Error(`${file}: ${what} is ${describe(v)}, not a tuple of ints`);
  return v as number[];
}

/**
 * The names a torch.save pickle may use: tensor and parameter rebuilding, storage classes, dtypes,
 * torch.Size, OrderedDict, set / frozenset and protocol 2's bytes (_codecs.encode). `extra` adds
 * classes for a caller (torch.distributed.checkpoint's metadata). Anything else is refused.
 */
export function torchGlobals(file: string, extra: (module: string, name: string) => unknown = () => undefined): (module: string, name: string) => unknown {
  return (module, name) => {
    const q = `${module}.${name}`;
    const fromExtra = extra(module, name);
    if (fromExtra !== undefined) return fromExtra;
    if (module === "torch" || module === "torch.storage") {
      if (name in STORAGE_DTYPES && (module === "torch" || name === "UntypedStorage")) return new StorageType(name, STORAGE_DTYPES[name]!);
      if (module === "torch" && name in DTYPE_NAMES) return new TorchDtypeValue(name, DTYPE_NAMES[name]!);
      if (module === "torch" && name === "Size") return new PyCallable(q, (a) => Object.freeze([...intTuple(a[0] ?? [], "torch.Size's argument", file)]));
    }
    if (module === "torch._utils") {
      const tensor = (a: readonly unknown[], n: number) => {
        const [storage, offset, size, stride] = a;
        if (!(storage instanceof TorchStorage)) throw new Error(`${file}: ${q} on ${describe(storage)}, not a storage`);
        if (typeof offset !== "number") throw new Error(`${file}: ${q} with storage offset ${describe(offset)}`);
        return new TorchTensor(storage, offset, intTuple(size, `${q}'s size`, file), intTuple(stride, `${q}'s stride`, file), n > 4 && a[4] === true, file);
      };
      if (name === "_rebuild_tensor_v2") return new PyCallable(q, (a) => tensor(a, a.length));
      if (name === "_rebuild_tensor") return new PyCallable(q, (a) => tensor(a, 4));
      if (name === "_rebuild_parameter" || name === "_rebuild_parameter_with_state") {
        return new PyCallable(q, (a) => {
          if (!(a[0] instanceof TorchTensor)) throw new Error(`${file}: ${q} of ${describe(a[0])}, not a tensor`);
          return a[0];
        });
      }
    }
    if (q === "collections.OrderedDict") {
      return new PyCallable(q, (a) => new Map(a.length > 0 && Array.isArray(a[0]) ? (a[0] as unknown[][]).map((kv) => [kv[0], kv[1]] as const) : []));
    }
    if (q === "builtins.set" || q === "builtins.frozenset" || q === "__builtin__.set" || q === "__builtin__.frozenset") {
      return new PyCallable(q, (a) => new Set(Array.isArray(a[0]) ? a[0] : []));
    }
    if (q === "_codecs.encode") {
      return new PyCallable(q, (a) => {
        if (typeof a[0] !== "string" || a[1] !== "latin1") throw new Error(`${file}: _codecs.encode with ${describe(a[1])}; only protocol 2's latin1 bytes are read`);
        return Uint8Array.from(a[0], (c) => c.charCodeAt(0));
      });
    }
    const storageHint = module === "torch" && /Storage$/.test(name) ? ` (a storage of a dtype not read here; read: ${Object.values(STORAGE_DTYPES).filter((d, i, all) => all.indexOf(d) === i).join(", ")})` : "";
    throw new Error(`${file}: the pickle names ${q}, which is not read${storageHint}: torch files are read for their tensors, containers and plain values only, and nothing in them is run`);
  };
}

/** A decoded torch file: its object, with tensors read lazily from the source until `close`. */
export interface TorchFile {
  value: unknown;
  format: "zip" | "legacy";
  close(): void;
}

const LEGACY_MAGIC = 0x1950a86a20f9469cfc6cn;

function storagePid(pid: unknown, file: string): { type: StorageType; key: string; numel: number; view: unknown } {
  if (!isTuple(pid) || pid[0] !== "storage") {
    const what = isTuple(pid) && pid[0] === "module" ? "a pickled nn.Module class (torch.save of a whole model): save its state_dict instead" : describe(pid);
    throw new Error(`${file}: persistent id ${what} is not a storage`);
  }
  const [, type, key, , numel, view] = pid;
  if (!(type instanceof StorageType)) throw new Error(`${file}: storage '${String(key)}' has type ${describe(type)}, not a torch storage class`);
  if (typeof key !== "string" || typeof numel !== "number") throw new Error(`${file}: corrupt storage reference ${describe(pid)}`);
  return { type, key, numel, view };
}

/** Decode a torch.save stream from `src` (a file, or a window of one: torch.distributed.checkpoint's chunks). */
export function loadTorch(src: ByteSource, extraGlobals?: (module: string, name: string) => unknown, onClose: () => void = () => {}): TorchFile {
  const file = src.name;
  if (src.size < 4) throw new Error(`${file}: too short to be a torch.save file`);
  const head = src.read(0, 4);
  const globals = torchGlobals(file, extraGlobals);
  if (head[0] === 0x50 && head[1] === 0x4b && head[2] === 0x03 && head[3] === 0x04) {
    const entries = readZipDirectory(src);
    const pkls = [...entries.keys()].filter((n) => /^[^/]+\/data\.pkl$/.test(n));
    if (pkls.length !== 1) {
      const jit = [...entries.keys()].some((n) => n.endsWith("/constants.pkl") || n.includes("/code/"));
      throw new Error(`${file}: a zip archive with ${pkls.length} <archive>/data.pkl entries${jit ? " (a TorchScript archive from torch.jit.save, which is not read)" : ""}; not a torch.save file`);
    }
    const prefix = pkls[0]!.slice(0, -"data.pkl".length);
    const order = entries.get(`${prefix}byteorder`);
    if (order) {
      const s = new TextDecoder().decode(entryBytes(src, order));
      if (s !== "little") throw new Error(`${file}: byteorder is '${s}'; only little-endian files are read`);
    }
    const storages = new Map<string, TorchStorage>();
    const hooks: PickleHooks = {
      global: globals,
      persistentLoad(pid) {
        const { type, key, numel } = storagePid(pid, file);
        const have = storages.get(key);
        if (have) return have;
        const e = entries.get(`${prefix}data/${key}`);
        if (!e) throw new Error(`${file}: storage '${key}' has no entry ${prefix}data/${key}`);
        const w = DTYPE_WIDTH[type.dtype];
        if (e.size < numel * w) throw new Error(`${file}: storage '${key}' holds ${e.size} bytes, too few for ${numel} ${type.dtype} elements`);
        const s = new TorchStorage(key, type.dtype, numel, (off, len) => entryBytes(src, e, off, len));
        storages.set(key, s);
        return s;
      },
    };
    const pkl = entries.get(pkls[0]!)!;
    const value = unpickle(new StreamReader(SliceSource.of(entryBytes(src, pkl), `${file} (${pkls[0]})`)), hooks, file);
    return { value, format: "zip", close: onClose };
  }
  if (head[0] !== 0x80) throw new Error(`${file}: not a torch.save file (neither a zip archive nor a pickle)`);
  // legacy: magic number, protocol version, system info, the object, storage keys, storages
  const r = new StreamReader(src);
  const plain: PickleHooks = { global: globals };
  const magic = unpickle(r, plain, file);
  if (typeof magic !== "bigint" || magic !== LEGACY_MAGIC) throw new Error(`${file}: a pickle, but not a torch.save file (no torch magic number)`);
  const protocol = unpickle(r, plain, file);
  if (protocol !== 1001) throw new Error(`${file}: torch legacy format version ${String(protocol)}; 1001 is read`);
  const sys = unpickle(r, plain, file);
  if (sys instanceof Map && sys.get("little_endian") === false) throw new Error(`${file}: written on a big-endian machine; only little-endian files are read`);
  const roots = new Map<string, { dtype: TorchDtype; at: number | null; count: number }>();
  const storages = new Map<string, TorchStorage>();
  const rootBytes = (key: string) => {
    const root = roots.get(key)!;
    if (root.at === null) throw new Error(`${file}: storage '${key}' is not in the file's storage list`);
    return root;
  };
  const hooks: PickleHooks = {
    global: globals,
    persistentLoad(pid) {
      const { type, key, numel, view } = storagePid(pid, file);
      const w = DTYPE_WIDTH[type.dtype];
      if (!roots.has(key)) roots.set(key, { dtype: type.dtype, at: null, count: 0 });
      else if (roots.get(key)!.dtype !== type.dtype) throw new Error(`${file}: storage '${key}' is used as both ${roots.get(key)!.dtype} and ${type.dtype}`);
      // (view_key, element offset, view size) on old files: a window of the root storage
      let sub = 0, name = key, n = numel;
      if (view !== null && view !== undefined) {
        if (!isTuple(view) || typeof view[1] !== "number" || typeof view[2] !== "number") throw new Error(`${file}: corrupt storage view ${describe(view)}`);
        [name, sub, n] = [String(view[0]), view[1], view[2]];
      }
      const have = storages.get(name);
      if (have) return have;
      const s = new TorchStorage(name, type.dtype, n, (off, len) => {
        const root = rootBytes(key);
        if ((sub + n) * w > root.count * w) throw new Error(`${file}: storage '${name}' reaches past its root storage '${key}'`);
        return src.read(root.at! + sub * w + off, len);
      });
      storages.set(name, s);
      return s;
    },
  };
  const value = unpickle(r, hooks, file);
  const keys = unpickle(r, plain, file);
  if (!Array.isArray(keys) || !keys.every((k) => typeof k === "string")) throw new Error(`${file}: corrupt legacy file (the storage key list is ${describe(keys)})`);
  let at = r.pos;
  for (const key of keys as string[]) {
    const root = roots.get(key);
    if (!root) throw new Error(`${file}: storage '${key}' is listed but no tensor uses it`);
    if (at + 8 > src.size) throw new Error(`${file}: truncated (storage '${key}' is missing)`);
    const count = Number(new DataView(src.read(at, 8).buffer).getBigInt64(0, true));
    root.at = at + 8;
    root.count = count;
    at += 8 + count * DTYPE_WIDTH[root.dtype];
    if (at > src.size) throw new Error(`${file}: truncated (storage '${key}' of ${count} ${root.dtype} elements runs past the end)`);
  }
  return { value, format: "legacy", close: onClose };
}

/** Open a torch.save file; its tensors are read from the file while it is open (close it after). */
export function openTorchFile(path: string, extraGlobals?: (module: string, name: string) => unknown): TorchFile {
  const src = new FileSource(path);
  try {
    return loadTorch(src, extraGlobals, () => src.close());
  } catch (e) {
    src.close();
    throw e;
  }
}

/**
 * A state dict (name -> tensor, as torch.save(model.state_dict()) and pytorch_model.bin hold) as
 * float32 arrays; with `wrapper`, the state dict is the value of that key of the saved dict when it
 * has one (verl's {"adapter_state_dict": ...}). Non-tensor values and non-string keys are refused,
 * naming them and the file.
 */
export function readTorchStateDict(path: string, wrapper?: string): Map<string, { data: Float32Array; shape: number[] }> {
  const f = openTorchFile(path);
  try {
    const saved = f.value;
    const root = wrapper !== undefined && saved instanceof Map && saved.has(wrapper) ? saved.get(wrapper) : saved;
    if (!(root instanceof Map)) throw new Error(`${path}: holds a ${describe(root)}, not a state dict (a dict of name -> tensor${wrapper ? `, or {"${wrapper}": state dict}` : ""})`);
    const out = new Map<string, { data: Float32Array; shape: number[] }>();
    for (const [k, v] of root) {
      if (typeof k !== "string") throw new Error(`${path}: a state dict key is ${describe(k)}, not a str`);
      if (!(v instanceof TorchTensor)) throw new Error(`${path}: '${k}' is ${describe(v)}, not a tensor`);
      out.set(k, { data: v.toFloat32(), shape: [...v.shape] });
    }
    return out;
  } finally {
    f.close();
  }
}
