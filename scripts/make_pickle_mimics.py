#!/usr/bin/env python3
"""Makes test/models/fixtures/torch_mimic/: files laid out as torch.save lays them out (zip and legacy
formats), written with Python's own pickle and zipfile modules, no torch needed. Stand-in classes
registered under torch's module names make the pickler emit exactly the references torch.save emits
(torch._utils._rebuild_tensor_v2, torch.FloatStorage, ... and persistent ids for storages); these
check the unpickler on machines without torch. The real torch-written files come from
scripts/make_torch_fixtures.py.

  mimic.pt / mimic_legacy.pt   the same object in both formats (mimic_zip64.pt: zip with ZIP64 records)
  megatron_dcp_stacked/        a torch_dist folder of a DoRA adapter, layers stacked on a leading axis (+ expected.json)
  megatron_canonical/          verl's mp_rank_00_adapter.pt under lora.type=canonical_lora (+ expected.json)
  mimic.json                   what they hold (tensors as {dtype, shape, values}, row-major)
  refused.pt                   a zip-format file whose pickle names os.system (must be refused)

Usage: python3 scripts/make_pickle_mimics.py [OUT_DIR]
"""
import collections, io, json, os, pickle, struct, sys, types, zipfile

OUT = sys.argv[1] if len(sys.argv) > 1 else "test/models/fixtures/torch_mimic"
os.makedirs(OUT, exist_ok=True)

torch = types.ModuleType("torch")
utils = types.ModuleType("torch._utils")
sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
torch._utils = utils

FMT = {"FloatStorage": ("f", 4), "HalfStorage": ("e", 2), "BFloat16Storage": ("H", 2), "DoubleStorage": ("d", 8),
       "LongStorage": ("q", 8), "IntStorage": ("i", 4), "ShortStorage": ("h", 2), "CharStorage": ("b", 1),
       "ByteStorage": ("B", 1), "BoolStorage": ("?", 1)}
DTYPE = {"FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16", "DoubleStorage": "float64",
         "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
         "ByteStorage": "uint8", "BoolStorage": "bool"}
for name in FMT:
    cls = type(name, (), {"__module__": "torch"})
    setattr(torch, name, cls)


def _rebuild_tensor_v2(*a):
    raise RuntimeError("stand-in")


def _rebuild_parameter(*a):
    raise RuntimeError("stand-in")


for f in (_rebuild_tensor_v2, _rebuild_parameter):
    f.__module__ = "torch._utils"
    setattr(utils, f.__name__, f)


class Storage:
    count = 0

    def __init__(self, kind, values):
        self.kind, self.values = kind, values
        self.key = str(Storage.count)
        Storage.count += 1

    def raw(self):
        fmt, _ = FMT[self.kind]
        if self.kind == "BFloat16Storage":
            return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in self.values)
        return struct.pack("<%d%s" % (len(self.values), fmt), *self.values)

    def decoded(self):
        if self.kind == "BFloat16Storage":
            return [struct.unpack("<f", struct.pack("<I", (struct.unpack("<I", struct.pack("<f", v))[0] >> 16) << 16))[0] for v in self.values]
        if self.kind == "HalfStorage":
            return [struct.unpack("<e", struct.pack("<e", v))[0] for v in self.values]
        if self.kind == "FloatStorage":
            return [struct.unpack("<f", struct.pack("<f", v))[0] for v in self.values]
        return list(self.values)


class Tensor:
    def __init__(self, storage, offset, size, stride, param=False):
        self.storage, self.offset, self.size, self.stride, self.param = storage, offset, tuple(size), tuple(stride), param

    def __reduce_ex__(self, proto):
        t = (utils._rebuild_tensor_v2, (self.storage, self.offset, self.size, self.stride, False, collections.OrderedDict()))
        if self.param:
            return (utils._rebuild_parameter, (Tensor(self.storage, self.offset, self.size, self.stride), True, collections.OrderedDict()))
        return t

    def expected(self):
        vals = self.storage.decoded()
        out = []

        def walk(d, at):
            if d == len(self.size):
                out.append(vals[at])
                return
            for i in range(self.size[d]):
                walk(d + 1, at + i * self.stride[d])

        walk(0, self.offset)
        if self.storage.kind == "BoolStorage":
            out = [bool(v) for v in out]
        return {"__tensor__": True, "dtype": DTYPE[self.storage.kind], "shape": list(self.size), "values": out}


def contiguous(kind, values, shape):
    stride, acc = [], 1
    for n in reversed(shape):
        stride.insert(0, acc)
        acc *= n
    return Tensor(Storage(kind, values), 0, shape, stride)


base = Storage("FloatStorage", [i / 7 for i in range(24)])  # a 4 x 6 matrix shared by three views
obj = collections.OrderedDict()
obj["f32"] = contiguous("FloatStorage", [0.5, -1.25, 3.0, 1e-3, 7.5, -0.0], [2, 3])
obj["f16"] = contiguous("HalfStorage", [1.5, -2.0, 65504.0, 2 ** -24], [4])
obj["bf16"] = contiguous("BFloat16Storage", [1.5, -2.0, 3.14159, 1e10], [2, 2])
obj["f64"] = contiguous("DoubleStorage", [1 / 3, -2.5e300], [2])
obj["i64"] = contiguous("LongStorage", [1, -2, 2 ** 40, -(2 ** 33)], [2, 2])
obj["i32"] = contiguous("IntStorage", [7, -8, 2 ** 31 - 1], [3])
obj["i16"] = contiguous("ShortStorage", [-32768, 5], [2])
obj["i8"] = contiguous("CharStorage", [-128, 0, 127], [3])
obj["u8"] = contiguous("ByteStorage", [0, 200, 255], [3])
obj["bool"] = contiguous("BoolStorage", [True, False, True], [3])
obj["scalar"] = Tensor(Storage("FloatStorage", [3.5]), 0, [], [])
obj["empty"] = Tensor(Storage("FloatStorage", []), 0, [0, 3], [3, 1])
obj["transposed"] = Tensor(base, 0, [6, 4], [1, 6])
obj["row"] = Tensor(base, 6, [6], [1])
obj["block"] = Tensor(base, 15, [2, 3], [6, 1])
obj["param"] = Tensor(contiguous("FloatStorage", [9.0, 8.0], [2]).storage, 0, [2], [1], param=True)
# what model.state_dict() carries: an instance attribute, pickled as BUILD state after the items
obj._metadata = collections.OrderedDict([("", {"version": 1})])
obj["nested"] = {"list": [1, 2.5, "three", None, True], "tuple": (4, "five"), "big": 2 ** 62, "neg": -3, "bytes": b"\x00\xff"}


def as_json(x):
    if isinstance(x, Tensor):
        return x.expected()
    if isinstance(x, dict):
        return {"__dict__": type(x).__name__, "items": [[k, as_json(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"__tuple__": [as_json(v) for v in x]}
    if isinstance(x, list):
        return [as_json(v) for v in x]
    if isinstance(x, bytes):
        return {"__bytes__": list(x)}
    return x


def storages_of(x, seen):
    if isinstance(x, Tensor):
        if x.storage.key not in seen:
            seen[x.storage.key] = x.storage
    elif isinstance(x, dict):
        for v in x.values():
            storages_of(v, seen)
    elif isinstance(x, (list, tuple)):
        for v in x:
            storages_of(v, seen)
    return seen


class TorchPickler(pickle.Pickler):
    def __init__(self, f, legacy):
        super().__init__(f, protocol=2)
        self.legacy = legacy

    def persistent_id(self, o):
        if isinstance(o, Storage):
            cls = getattr(torch, o.kind)
            if self.legacy:
                return ("storage", cls, o.key, "cpu", len(o.values), None)
            return ("storage", cls, o.key, "cpu", len(o.values))
        return None


def put(z, name, data):
    """A zip entry with a fixed timestamp, so the files are the same each time they are made."""
    z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)


def dumps(o, legacy):
    b = io.BytesIO()
    TorchPickler(b, legacy).dump(o)
    return b.getvalue()


def save_zip(path, archive, o):
    """torch.save's zip layout: <archive>/data.pkl, byteorder, data/<key> per storage, version."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        put(z, f"{archive}/data.pkl", dumps(o, False))
        put(z, f"{archive}/byteorder", "little")
        for key, st in storages_of(o, {}).items():
            put(z, f"{archive}/data/{key}", st.raw())
        put(z, f"{archive}/version", "3\n")


storages = storages_of(obj, {})
save_zip(os.path.join(OUT, "mimic.pt"), "mimic", obj)

# the same archive with ZIP64 records throughout (torch writes them once a file passes 4 GB): zipfile's
# limits lowered so every size and offset goes to the ZIP64 extra field, and the end record is ZIP64's
limits = (zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT)
zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 16, 1
save_zip(os.path.join(OUT, "mimic_zip64.pt"), "mimic", obj)
zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits

with open(os.path.join(OUT, "mimic_legacy.pt"), "wb") as f:
    pickle.dump(0x1950A86A20F9469CFC6C, f, protocol=2)
    pickle.dump(1001, f, protocol=2)
    pickle.dump({"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}, f, protocol=2)
    f.write(dumps(obj, True))
    keys = list(storages)
    pickle.dump(keys, f, protocol=2)
    for key in keys:
        f.write(struct.pack("<q", len(storages[key].values)))
        f.write(storages[key].raw())

with open(os.path.join(OUT, "mimic.json"), "w") as f:
    json.dump(as_json(obj), f)

with zipfile.ZipFile(os.path.join(OUT, "refused.pt"), "w", zipfile.ZIP_STORED) as z:
    put(z, "refused/data.pkl", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00echo\x85R.")
    put(z, "refused/version", "3\n")


# ---- A torch.distributed.checkpoint folder laid out as Megatron-Bridge's torch_dist saves a DoRA adapter:
# the layers of each key stacked on a leading axis (decoder.layers.<module>... of [layers, ...]), one key
# in two chunks (raw bf16 elements), others as torch.save streams inside the .distcp, plus base-weight and
# optimizer keys that are not the adapter's. For the qwen3 family fixture's shape (3 layers, hidden 64,
# 4 heads of 24), rank 4, target_modules [linear_proj, linear_fc2].
import dataclasses, enum, random

def module(name):
    m = types.ModuleType(name)
    sys.modules[name] = m
    return m

meta_mod = module("torch.distributed.checkpoint.metadata")
fs_mod = module("torch.distributed.checkpoint.filesystem")
ser_mod = module("torch.serialization")


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


Size.__module__, Size.__qualname__ = "torch", "Size"
torch.Size = Size


class DType:
    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name


DType.__module__ = "torch"
torch.bfloat16 = DType("bfloat16")
torch.float32 = DType("float32")


def _get_layout(name):
    raise RuntimeError("stand-in")


_get_layout.__module__ = "torch.serialization"
ser_mod._get_layout = _get_layout


class Layout:
    def __reduce__(self):
        return (_get_layout, ("torch.strided",))


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0


def dc(name, fields, frozen=False, mod=meta_mod):
    cls = dataclasses.make_dataclass(name, fields, frozen=frozen)
    cls.__module__ = mod.__name__
    setattr(mod, name, cls)
    return cls


ChunkStorageMetadata = dc("ChunkStorageMetadata", ["offsets", "sizes"])
TensorStorageMetadata = dc("TensorStorageMetadata", ["properties", "size", "chunks"])
BytesStorageMetadata = dc("BytesStorageMetadata", [])
Metadata = dc("Metadata", ["state_dict_metadata", "planner_data", "storage_data"])
MetadataIndex = dc("MetadataIndex", ["fqn", "offset", "index"], frozen=True)
_StorageInfo = dc("_StorageInfo", ["relative_path", "offset", "length"], mod=fs_mod)
_MEM_FORMAT_ENCODING.__module__ = meta_mod.__name__
meta_mod._MEM_FORMAT_ENCODING = _MEM_FORMAT_ENCODING


class TensorProperties:
    def __init__(self, dtype):
        self.dtype = dtype

    def __getstate__(self):
        return (self.dtype, Layout(), False, _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT, False)


TensorProperties.__module__ = meta_mod.__name__
meta_mod.TensorProperties = TensorProperties

rnd = random.Random(5)
L, H, QD, I, R = 3, 64, 4 * 24, 96, 4
bf = lambda n, s: [float(struct.unpack("<f", struct.pack("<I", (struct.unpack("<I", struct.pack("<f", rnd.gauss(0, s)))[0] >> 16) << 16))[0]) for _ in range(n)]
keys = {
    "decoder.layers.self_attention.linear_proj.adapter.linear_in.weight": [L, R, QD],
    "decoder.layers.self_attention.linear_proj.adapter.linear_out.weight": [L, H, R],
    "decoder.layers.self_attention.linear_proj.adapter.weight_magnitude": [L, H],
    "decoder.layers.mlp.linear_fc2.adapter.linear_in.weight": [L, R, I],
    "decoder.layers.mlp.linear_fc2.adapter.linear_out.weight": [L, H, R],
    "decoder.layers.mlp.linear_fc2.adapter.weight_magnitude": [L, H],
    "decoder.layers.mlp.linear_fc2.weight": [L, H, I],  # a base weight: not the adapter's
    "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.adapter.linear_in.weight": [L, R, I],
}
values = {k: bf(int.__mul__(*shape[:2]) * (shape[2] if len(shape) > 2 else 1), 0.5) for k, shape in keys.items()}


def torch_stream(vals, shape):
    b = io.BytesIO()
    st = Storage("BFloat16Storage", vals)
    stride, acc = [], 1
    for n in reversed(shape):
        stride.insert(0, acc)
        acc *= n
    save_zip(b, "archive", Tensor(st, 0, shape, stride))
    return b.getvalue()


d = os.path.join(OUT, "megatron_dcp_stacked")
os.makedirs(d, exist_ok=True)
blob, sdm, storage = io.BytesIO(), {}, {}
blob.write(b"\0" * 11)  # chunks need not start the file
for k, shape in keys.items():
    vals = values[k]
    if k.endswith("linear_proj.adapter.linear_in.weight"):  # two chunks along the layer axis, raw bf16
        per = len(vals) // L
        chunks = [([0, 0, 0], [2, R, QD], vals[:2 * per]), ([2, 0, 0], [1, R, QD], vals[2 * per:])]
        for offs, sizes, part in chunks:
            at = blob.tell()
            blob.write(Storage("BFloat16Storage", part).raw())
            storage[MetadataIndex(k, Size(offs), None)] = _StorageInfo("__0_0.distcp", at, blob.tell() - at)
        sdm[k] = TensorStorageMetadata(TensorProperties(torch.bfloat16), Size(shape), [ChunkStorageMetadata(Size(o), Size(s)) for o, s, _ in chunks])
        continue
    at = blob.tell()
    blob.write(torch_stream(vals, shape))
    zero = Size([0] * len(shape))
    storage[MetadataIndex(k, zero, 0)] = _StorageInfo("__0_0.distcp", at, blob.tell() - at)
    sdm[k] = TensorStorageMetadata(TensorProperties(torch.bfloat16), Size(shape), [ChunkStorageMetadata(zero, Size(shape))])
sdm["common.rng_state"] = BytesStorageMetadata()
with open(os.path.join(d, "__0_0.distcp"), "wb") as f:
    f.write(blob.getvalue())
with open(os.path.join(d, ".metadata"), "wb") as f:
    pickle.dump(Metadata(sdm, None, storage), f, protocol=4)
with open(os.path.join(d, "expected.json"), "w") as f:
    json.dump({k: {"shape": keys[k], "values": values[k]} for k in keys if ".adapter." in k and not k.startswith("optimizer.")}, f)


# ---- verl's adapter file under lora.type=canonical_lora (Megatron-Bridge's LoRALinearSplitQKV /
# LoRALinearSplitFC1UpGate: adapter_q/k/v and adapter_gate/up, each in the HF projection's own row order),
# for the qwen3 family fixture's shape, rank 4, target_modules [linear_q, linear_v, linear_fc1_up].
KV = 2 * 24
canon = collections.OrderedDict()
for layer in range(L):
    for mod, (fan_in, fan_out) in {"self_attention.linear_qkv.adapter.adapter_q": (H, QD), "self_attention.linear_qkv.adapter.adapter_v": (H, KV),
                                   "mlp.linear_fc1.adapter.adapter_up": (H, I)}.items():
        for part, shape in (("linear_in", [R, fan_in]), ("linear_out", [fan_out, R])):
            canon[f"decoder.layers.{layer}.{mod}.{part}.weight"] = contiguous("BFloat16Storage", bf(shape[0] * shape[1], 0.3), shape)
d = os.path.join(OUT, "megatron_canonical")
os.makedirs(d, exist_ok=True)
save_zip(os.path.join(d, "mp_rank_00_adapter.pt"), "mp_rank_00_adapter", {"adapter_state_dict": canon})
with open(os.path.join(d, "expected.json"), "w") as f:
    json.dump({k: as_json(v) for k, v in canon.items()}, f)
