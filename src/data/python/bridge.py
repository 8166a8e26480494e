"""Serves verl data classes to verl-ts: data.custom_cls datasets and data.sampler samplers.

Started as `python3 bridge.py <path of src/reward/python/runner.py>`; one process holds every
Python data object of a run (train and validation datasets, the sampler), so a sampler is handed
the very dataset object it orders, as in verl.

Requests on stdin, one JSON line each: {"id": N, "op": ..., ...}; replies on stdout:
{"id": N, "ok": true, "value": ...} or {"id": N, "ok": false, "error", "traceback", "at"}.
While a request runs, Python may ask Node for data with {"callback": "row" | "rows" | "field", ...};
Node answers on stdin with {"callback_reply": value} or {"callback_error": message}.
Batched ops (get_many, next_many) write {"at": k} before their k-th item: Node's worker re-arms
data.python_timeout_s on it, so the timeout holds per row / per index, and a failure, a hang or an
exit is pinned on item k ("at" in the error reply).
The user's prints go to stderr.
"""

import importlib.util
import json
import math
import os
import sys
import threading
import traceback


def _load_runner(path):
    spec = importlib.util.spec_from_file_location("verl_ts_python_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BridgeError(Exception):
    """A failure whose message says everything: sent without a traceback."""


def _plain(o):
    # torch tensors and numpy arrays/scalars become lists and numbers
    if hasattr(o, "item") and tuple(getattr(o, "shape", (0,))) == ():
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    kind = type(o).__module__ + "." + type(o).__name__
    if kind.startswith("PIL."):
        raise TypeError("a PIL image (verl-ts trains text models only; multi-modal rows are not supported)")
    raise TypeError(f"a {kind} cannot be sent to verl-ts (rows hold JSON values, lists, numpy arrays or torch tensors)")


def _finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return {"$nonfinite": "nan" if o != o else ("inf" if o > 0 else "-inf")}
    if isinstance(o, dict):
        return {str(k): _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "tolist") or hasattr(o, "item") or isinstance(o, (set, frozenset)):
        return _finite(_plain(o))
    return o


def _encode(obj):
    return json.dumps(_finite(obj), allow_nan=False, default=_plain)


class Encoded(str):
    """A value already encoded as JSON (each item of a batch is encoded alone, so a failure names its item)."""


class Channel:
    def __init__(self, out, requests):
        self.out = out
        self.requests = requests

    def send(self, obj):
        self.write(_encode(obj))

    def write(self, line):
        self.out.write(line + "\n")
        self.out.flush()

    def read(self):
        line = self.requests.readline()
        if not line:
            os._exit(0)  # Node closed the pipe: the run is over
        return json.loads(line)

    def callback(self, request, **kw):
        self.send({"callback": request, **kw})
        reply = self.read()
        if "callback_error" in reply:
            raise RuntimeError(reply["callback_error"])
        return reply["callback_reply"]


CHANNEL = None
AT = None  # the item of a batched op now running (None outside one)


def _items(values):
    """(k, value) for each item, announcing each to Node first (see the module's doc)."""
    global AT
    for k, v in enumerate(values):
        AT = k
        CHANNEL.write('{"at": %d}' % k)
        yield k, v


class DataConfig(dict):
    """`data` when omegaconf is missing: dict access, attribute access and .get, nested alike."""

    def __init__(self, d):
        super().__init__({k: _wrap(v) for k, v in d.items()})

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _wrap(v):
    if isinstance(v, dict):
        return DataConfig(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def _config(d):
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return DataConfig(d)
    return OmegaConf.create(d)


def _load_class(path, name, key):
    if path.startswith("pkg://"):
        module = importlib.import_module(path[len("pkg://"):].replace("/", "."))
    else:
        if path.startswith("file://"):
            path = path[len("file://"):]
        if not os.path.exists(path):
            raise BridgeError(f"{key}={path}: no such file")
        # one module per file: a sampler in the dataset's file sees the very class the dataset was built from
        module_name = f"verl_ts_data_{abs(hash(os.path.abspath(path)))}"
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise BridgeError(f"{key}={path}: cannot load a Python module from it")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
    if not hasattr(module, name):
        classes = sorted(n for n in dir(module) if not n.startswith("_") and isinstance(getattr(module, n), type))
        raise BridgeError(f"{path} has no class '{name}' (classes: {', '.join(classes) or 'none'})")
    cls = getattr(module, name)
    if not isinstance(cls, type):
        raise BridgeError(f"{path}: '{name}' is a {type(cls).__name__}, not a class")
    return cls


_tokenizers = {}


def _tokenizer(path, trust_remote_code):
    try:
        import transformers
    except ImportError as e:
        raise BridgeError(
            "verl builds dataset classes with a Hugging Face tokenizer (AutoTokenizer.from_pretrained of "
            f"actor_rollout_ref.model.path), but {sys.executable} cannot import transformers ({e}); install it there "
            "(pip install transformers) or set VERL_PYTHON to a python3 that has it"
        ) from None
    if path not in _tokenizers:
        tok = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if tok.pad_token_id is None and tok.eos_token is not None:
            tok.pad_token = tok.eos_token  # as verl's hf_tokenizer does
        _tokenizers[path] = tok
    return _tokenizers[path]


class NodeRows:
    """verl-ts's own dataset seen from Python: len() and [i] give its row dicts (fetched from Node)."""

    def __init__(self, handle, length):
        self._handle = handle
        self._length = length

    def __len__(self):
        return self._length

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._rows(list(range(*i.indices(self._length))))
        i = int(i)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError(f"row {i} out of range for {self._length} rows")
        return CHANNEL.callback("row", handle=self._handle, index=i)

    def _rows(self, indices):
        return CHANNEL.callback("rows", handle=self._handle, indices=indices) if indices else []

    def __iter__(self):
        # a chunk per callback: a sampler reading every row costs len/256 round trips, not len
        for start in range(0, self._length, 256):
            yield from self._rows(list(range(start, min(start + 256, self._length))))


class _Fields(dict):
    """A batch's columns, each fetched from Node on first read (only while update() runs)."""

    def __init__(self, kind, keys, convert):
        super().__init__()
        self._kind = kind
        self._keys = list(keys)
        self._convert = convert

    def __missing__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        value = self._convert(CHANNEL.callback("field", kind=self._kind, key=key))
        self[key] = value
        return value

    def keys(self):
        return list(self._keys)

    def __contains__(self, key):
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def items(self):
        return [(k, self[k]) for k in self._keys]

    def values(self):
        return [self[k] for k in self._keys]

    def get(self, key, default=None):
        return self[key] if key in self._keys else default


def _as_tensor(t):
    values = t["values"]
    try:
        import torch

        dtype = {"float32": torch.float32, "int32": torch.int64, "bool": torch.bool}[t["dtype"]]
        return torch.tensor(values, dtype=dtype).reshape(t["shape"])
    except ImportError:
        pass
    try:
        import numpy as np

        dtype = {"float32": np.float32, "int32": np.int64, "bool": np.bool_}[t["dtype"]]
        return np.array(values, dtype=dtype).reshape(t["shape"])
    except ImportError:
        pass
    return _nest(values, t["shape"])


def _nest(flat, shape):
    if len(shape) <= 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _as_column(values):
    try:
        import numpy as np
    except ImportError:
        return values
    col = np.empty(len(values), dtype=object)
    col[:] = values
    return col


class BatchView:
    """The trained batch a curriculum sampler's update(batch=...) gets, shaped like verl's DataProto:
    .batch (tensors: torch if importable, else numpy, else nested lists), .non_tensor_batch (numpy
    object arrays, else lists), .meta_info (dict), len(batch). Columns are fetched when first read,
    so they can be read only during update()."""

    def __init__(self, size, tensor_keys, non_tensor_keys, meta_info):
        self.batch = _Fields("tensor", tensor_keys, _as_tensor)
        self.non_tensor_batch = _Fields("non_tensor", non_tensor_keys, _as_column)
        self.meta_info = meta_info
        self._size = size

    def __len__(self):
        return self._size

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.batch[key] if key in self.batch else self.non_tensor_batch[key]
        raise TypeError("a BatchView is indexed by column name")


objects = {}
iterators = {}


def _sampler_bases():
    try:
        from verl.experimental.dataset.sampler import AbstractCurriculumSampler, AbstractSampler
    except ImportError:
        return None, None
    return AbstractSampler, AbstractCurriculumSampler


def op_dataset(req):
    cls = _load_class(req["path"], req["name"], "data.custom_cls.path")
    try:
        from torch.utils.data import Dataset
    except ImportError:
        Dataset = None
    if Dataset is not None and not issubclass(cls, Dataset):
        raise BridgeError("it must inherit from torch.utils.data.Dataset (verl checks the same)")
    tokenizer = _tokenizer(req["tokenizer_path"], req["trust_remote_code"])
    ds = cls(data_files=req["data_files"], tokenizer=tokenizer, processor=None, config=_config(req["config"]), max_samples=req["max_samples"])
    objects[req["handle"]] = ds
    return {"length": len(ds)}


def op_get_many(req):
    ds = objects[req["handle"]]
    rows = []
    for _, i in _items(req["indices"]):
        row = ds[i]
        if not isinstance(row, dict):
            raise BridgeError(f"returned a {type(row).__name__}, not a dict (verl's rows are dicts)")
        try:
            rows.append(_encode(row))
        except (TypeError, ValueError) as e:
            raise BridgeError(f"the row cannot be sent to verl-ts: {e}") from None
    return Encoded("[" + ", ".join(rows) + "]")


def op_sampler(req):
    cls = _load_class(req["path"], req["name"], "data.sampler.class_path")
    source = objects[req["dataset"]] if req.get("dataset") is not None else NodeRows(req["rows"], req["length"])
    sampler = cls(data_source=source, data_config=_config(req["config"]))
    base, curriculum = _sampler_bases()
    if base is not None and not isinstance(sampler, base):
        raise BridgeError("it must inherit from verl.experimental.dataset.sampler.AbstractSampler (verl checks the same)")
    objects[req["handle"]] = sampler
    length = None
    if hasattr(sampler, "__len__"):
        length = len(sampler)
    return {
        "length": length,
        "curriculum": (curriculum is not None and isinstance(sampler, curriculum)) or (curriculum is None and callable(getattr(sampler, "update", None))),
        "stateful": callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None)),
    }


def op_iter(req):
    iterators[req["handle"]] = iter(objects[req["handle"]])
    return None


def op_next_many(req):
    """The iterator's next `count` indices, fewer only where it ends: the very draws `count` next() calls make."""
    it = iterators[req["handle"]]
    out = []
    for _ in _items(range(req["count"])):
        try:
            out.append(int(next(it)))
        except StopIteration:
            break
    return out


def op_update(req):
    b = req["batch"]
    objects[req["handle"]].update(batch=BatchView(b["size"], b["tensor_keys"], b["non_tensor_keys"], b["meta_info"]))
    return None


def op_state_dict(req):
    return objects[req["handle"]].state_dict()


def op_load_state_dict(req):
    objects[req["handle"]].load_state_dict(req["state"])
    return None


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}


def _failure(e):
    if isinstance(e, BridgeError):
        return {"error": str(e), "traceback": "", "plain": True}
    msg = f"{type(e).__name__}: {e}"
    if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "verl":
        msg += (f" ({sys.executable} has no verl installed; verl-ts supplies only verl.DataProto and "
                "verl.experimental.dataset.sampler to it: install verl there for the rest)")
    return {"error": msg, "traceback": traceback.format_exc()}


def main():
    global CHANNEL
    runner = _load_runner(sys.argv[1])
    out = runner._reply_stream()
    requests = runner._request_stream()
    threading.Thread(target=runner._watch_parent, daemon=True).start()
    CHANNEL = Channel(out, requests)
    # as under `python -m verl.trainer.main_ppo`: modules beside the working directory import;
    # verl's sampler interface is there even when verl is not installed (a real verl wins)
    sys.path.insert(0, os.getcwd())
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim"))
    CHANNEL.send({"ready": True})
    global AT
    while True:
        req = CHANNEL.read()
        AT = None
        try:
            value = OPS[req["op"]](req)
            if isinstance(value, Encoded):
                CHANNEL.write('{"id": %d, "ok": true, "value": %s}' % (req["id"], value))
                continue
            try:
                CHANNEL.send({"id": req["id"], "ok": True, "value": value})
            except (TypeError, ValueError) as e:
                CHANNEL.send({"id": req["id"], "ok": False, "error": f"the result cannot be sent to verl-ts: {e}", "traceback": ""})
        except BaseException as e:  # noqa: BLE001 - SystemExit in user code is a failure to report too
            CHANNEL.send({"id": req["id"], "ok": False, "at": AT, **_failure(e)})


if __name__ == "__main__":
    main()
