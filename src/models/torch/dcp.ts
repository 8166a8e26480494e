// torch.distributed.checkpoint folders (what Megatron-Bridge's torch_dist format and dcp.save
// write): `.metadata` is a pickle of torch's Metadata dataclass (state_dict_metadata: fqn ->
// TensorStorageMetadata {properties (dtype, ...), size, chunks [{offsets, sizes}]} or
// BytesStorageMetadata; storage_data: MetadataIndex {fqn, offset} -> _StorageInfo {relative_path,
// offset, length}); each tensor chunk lies in a `.distcp` file at that offset, written there by
// torch.save (a zip stream of its own), or as raw bytes by savers that write them so. Chunks are
// placed at their offsets in the global tensor, so a checkpoint saved by several ranks reads whole.
// Only those torch.distributed.checkpoint classes (decoded field by field into PyObjects), torch
// dtypes, layouts (torch.serialization._get_layout, which names one), memory formats and
// torch.Size (and pathlib paths, which StorageMeta records) are allowed in `.metadata`.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { isTuple, PyCallable, PyObject, StreamReader, unpickle } from "./pickle.js";
import { describe, DTYPE_WIDTH, loadTorch, torchGlobals, TorchDtypeValue, TorchStorage, TorchTensor, type TorchDtype } from "./torch_save.js";
import { FileSource, SliceSource, type ByteSource } from "./zip.js";

const DCP_CLASSES: Record<string, string[]> = {
  "torch.distributed.checkpoint.metadata": [
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "MetadataIndex", "StorageMeta",
    "TensorProperties", "_MEM_FORMAT_ENCODING",
  ],
  "torch.distributed._shard.sharded_tensor.metadata": ["TensorProperties", "MEM_FORMAT_ENCODING"],
  "torch.distributed.checkpoint.filesystem": ["_StorageInfo"],
};
/** torch.layout and torch.memory_format objects TensorProperties holds: kept as their names. */
const TORCH_ENUMS = new Set(["strided", "sparse_coo", "sparse_csr", "_mkldnn", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format"]);

function dcpGlobals(module: string, name: string): unknown {
  if (DCP_CLASSES[module]?.includes(name)) return new PyCallable(`${module}.${name}`, (args) => new PyObject(`${module}.${name}`, args));
  if (module === "torch" && TORCH_ENUMS.has(name)) return `torch.${name}`;
  // how torch pickles a layout (torch.strided): _get_layout("torch.strided"), kept as the name
  // StorageMeta.checkpoint_id: the folder it was saved to, a pathlib path rebuilt from its parts (kept as a string)
  if (module === "pathlib" && /^(Pure)?(Posix|Windows)?Path$/.test(name)) return new PyCallable(`pathlib.${name}`, (a) => a.map(String).join("/").replace(/^\/\//, "/"));
  if (module === "torch.serialization" && name === "_get_layout") return new PyCallable("torch.serialization._get_layout", (a) => String(a[0]));
  return undefined;
}

/** A PyObject's field: a dataclass attribute (BUILD state) or, by position, its __getstate__ tuple / constructor args. */
function field(o: unknown, name: string, position: number, file: string): unknown {
  if (!(o instanceof PyObject)) throw new Error(`${file}: expected a torch.distributed.checkpoint object, found ${describe(o)}`);
  if (name in o.attrs) return o.attrs[name];
  if (isTuple(o.state) && position < o.state.length) return o.state[position];
  if (position < o.args.length) return o.args[position];
  throw new Error(`${file}: ${o.cls} has no '${name}'`);
}

const shortName = (cls: string) => cls.split(".").pop()!;

export interface DcpTensor { dtype: TorchDtype; shape: number[]; data: Float32Array }

/**
 * The tensors of a torch.distributed.checkpoint folder as float32, by fully qualified name;
 * `want` picks which fqns to read (the others are not read). Bytes entries are skipped and listed.
 */
export function readDistributedCheckpoint(dir: string, want: (fqn: string) => boolean = () => true): { tensors: Map<string, DcpTensor>; skipped: string[] } {
  const metaPath = join(dir, ".metadata");
  if (!existsSync(metaPath)) throw new Error(`${dir}: no .metadata (not a torch.distributed.checkpoint folder)`);
  const metaSrc = new FileSource(metaPath);
  let meta: unknown;
  try {
    meta = unpickle(new StreamReader(metaSrc), { global: torchGlobals(metaPath, dcpGlobals) }, metaPath);
  } finally {
    metaSrc.close();
  }
  if (!(meta instanceof PyObject) || shortName(meta.cls) !== "Metadata") throw new Error(`${metaPath}: holds ${describe(meta)}, not torch.distributed.checkpoint's Metadata`);
  const sdm = field(meta, "state_dict_metadata", 0, metaPath), storage = field(meta, "storage_data", 2, metaPath);
  if (!(sdm instanceof Map) || !(storage instanceof Map)) throw new Error(`${metaPath}: Metadata without state_dict_metadata / storage_data dicts`);
  // storage_data by fqn, then offsets
  const where = new Map<string, { offsets: number[]; file: string; offset: number; length: number; transforms: unknown }[]>();
  for (const [idx, info] of storage) {
    const fqn = field(idx, "fqn", 0, metaPath), offsets = field(idx, "offset", 1, metaPath);
    if (typeof fqn !== "string") throw new Error(`${metaPath}: a MetadataIndex without fqn`);
    const transforms = info instanceof PyObject ? info.attrs["transform_descriptors"] : undefined;
    const entry = {
      offsets: Array.isArray(offsets) ? offsets as number[] : [], file: String(field(info, "relative_path", 0, metaPath)),
      offset: Number(field(info, "offset", 1, metaPath)), length: Number(field(info, "length", 2, metaPath)), transforms,
    };
    where.set(fqn, [...(where.get(fqn) ?? []), entry]);
  }
  const sources = new Map<string, FileSource>();
  const tensors = new Map<string, DcpTensor>(), skipped: string[] = [];
  try {
    for (const [fqn, md] of sdm) {
      if (typeof fqn !== "string") throw new Error(`${metaPath}: a state_dict_metadata key is ${describe(fqn)}`);
      if (!(md instanceof PyObject) || shortName(md.cls) !== "TensorStorageMetadata") { skipped.push(fqn); continue; }
      if (!want(fqn)) continue;
      const props = field(md, "properties", 0, metaPath), dt = field(props, "dtype", 0, metaPath);
      if (!(dt instanceof TorchDtypeValue) || dt.dtype === null) throw new Error(`${metaPath}: '${fqn}' has dtype ${describe(dt)}, not one read here`);
      const shape = [...(field(md, "size", 1, metaPath) as number[])], chunks = field(md, "chunks", 2, metaPath);
      if (!Array.isArray(chunks)) throw new Error(`${metaPath}: '${fqn}' has no chunk list`);
      const out = new Float32Array(shape.reduce((a, b) => a * b, 1));
      let covered = 0;
      for (const c of chunks) {
        const offsets = [...(field(c, "offsets", 0, metaPath) as number[])], sizes = [...(field(c, "sizes", 1, metaPath) as number[])];
        const at = (where.get(fqn) ?? []).find((e) => e.offsets.length === offsets.length && e.offsets.every((v, i) => v === offsets[i]));
        if (!at) throw new Error(`${metaPath}: '${fqn}' chunk at [${offsets}] has no storage entry`);
        const path = join(dir, at.file);
        if (!sources.has(at.file)) {
          if (!existsSync(path)) throw new Error(`${metaPath}: '${fqn}' is stored in ${at.file}, which is missing from ${dir}`);
          sources.set(at.file, new FileSource(path));
        }
        const values = chunkValues(new SliceSource(sources.get(at.file)!, at.offset, at.length, `${path} ('${fqn}' at byte ${at.offset})`), dt.dtype, sizes, at.transforms);
        place(out, shape, values, offsets, sizes);
        covered += values.length;
      }
      if (covered !== out.length) throw new Error(`${metaPath}: the chunks of '${fqn}' cover ${covered} of its ${out.length} elements`);
      tensors.set(fqn, { dtype: dt.dtype, shape, data: out });
    }
  } finally {
    for (const s of sources.values()) s.close();
  }
  return { tensors, skipped };
}

/** One chunk's values: a torch.save stream, or (with no stream transforms) raw little-endian elements. */
function chunkValues(src: ByteSource, dtype: TorchDtype, sizes: number[], transforms: unknown): Float32Array {
  const numel = sizes.reduce((a, b) => a * b, 1);
  if (Array.isArray(transforms) && transforms.length > 0) throw new Error(`${src.name}: stored through transforms ${JSON.stringify(transforms)} (compression or encryption), which are not read`);
  const head = src.size >= 4 ? src.read(0, 4) : new Uint8Array(0);
  if (head[0] === 0x50 && head[1] === 0x4b && head[2] === 0x03 && head[3] === 0x04) {
    const t = loadTorch(src).value;
    if (!(t instanceof TorchTensor)) throw new Error(`${src.name}: holds ${describe(t)}, not a tensor`);
    if (t.shape.join(",") !== sizes.join(",")) throw new Error(`${src.name}: a tensor of shape [${t.shape}] where the metadata says [${sizes}]`);
    return t.toFloat32();
  }
  if (src.size !== numel * DTYPE_WIDTH[dtype]) throw new Error(`${src.name}: ${src.size} bytes, neither a torch.save stream nor ${numel} raw ${dtype} elements`);
  return new TorchTensor(new TorchStorage("raw", dtype, numel, (off, len) => src.read(off, len)), 0, sizes, contiguousStrides(sizes), false, src.name).toFloat32();
}

function contiguousStrides(shape: number[]): number[] {
  const s: number[] = [];
  let acc = 1;
  for (let i = shape.length - 1; i >= 0; i--) { s[i] = acc; acc *= shape[i]!; }
  return s;
}

/** Copy a chunk [sizes] into the global row-major tensor [shape] at `offsets`. */
function place(out: Float32Array, shape: number[], chunk: Float32Array, offsets: number[], sizes: number[]): void {
  const nd = shape.length;
  if (nd === 0) { out[0] = chunk[0]!; return; }
  const gs = contiguousStrides(shape), inner = sizes[nd - 1]!;
  if (offsets.some((o, i) => o + sizes[i]! > shape[i]!)) throw new Error(`a chunk at [${offsets}] of size [${sizes}] lies outside [${shape}]`);
  const idx = new Array<number>(nd).fill(0);
  let src = 0;
  for (;;) {
    let dst = 0;
    for (let d = 0; d < nd; d++) dst += (offsets[d]! + (d === nd - 1 ? 0 : idx[d]!)) * gs[d]!;
    out.set(chunk.subarray(src, src + inner), dst);
    src += inner;
    let d = nd - 2;
    for (; d >= 0; d--) { if (++idx[d]! < sizes[d]!) break; idx[d] = 0; }
    if (d < 0) break;
  }
}
