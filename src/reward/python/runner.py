"""Runs a verl reward function for verl-ts, one call per JSON line.

Started as `python3 runner.py <module path or pkg://module> <function name>`.
Requests on stdin:  {"id": N, "kwargs": {...}}  -> fn(**kwargs)
Replies on stdout:  {"ready": true} once the module is loaded (or {"ready": false, "error", "traceback"}),
                    then {"id": N, "ok": true, "value": ...} or {"id": N, "ok": false, "error", "traceback"}.
The user's own prints go to stderr, so they can never break the reply stream.
"""

import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import threading
import time
import traceback


def _reply_stream():
    # Keep the real stdout for replies; everything the user prints goes to stderr.
    stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def _request_stream():
    # Keep the real stdin for requests; the user's code reads an empty stdin (input() raises
    # EOFError at once) instead of blocking on, or eating, the request stream.
    stream = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull, "r", encoding="utf-8")
    return stream


def _watch_parent():
    # Exit when the Node process that started us is gone (even after kill -9).
    parent = os.getppid()
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _load(path, name):
    if path.startswith("pkg://"):
        module = importlib.import_module(path[len("pkg://"):].replace("/", "."))
    else:
        if path.startswith("file://"):
            path = path[len("file://"):]
        spec = importlib.util.spec_from_file_location(f"verl_ts_reward_{abs(hash(os.path.abspath(path)))}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load a Python module from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    if not hasattr(module, name):
        public = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise AttributeError(f"{path} has no function '{name}' (callables: {', '.join(public) or 'none'})")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{path}: '{name}' is a {type(fn).__name__}, not a function")
    return fn


def _plain(o):
    # numpy scalars and arrays, sets: what reward code commonly returns besides floats and dicts.
    if hasattr(o, "item") and getattr(o, "shape", None) == ():
        return _finite(o.item())
    if hasattr(o, "tolist"):
        return _finite(o.tolist())
    if isinstance(o, (set, frozenset)):
        return _finite(list(o))
    raise TypeError(f"a {type(o).__name__} cannot be returned as a score (use a float or a dict with 'score')")


def _finite(o):
    # JSON has no NaN or infinity: they travel tagged, so Node sees the same value a JS reward gives.
    if isinstance(o, float) and not math.isfinite(o):
        return {"$nonfinite": "nan" if o != o else ("inf" if o > 0 else "-inf")}
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _send(stream, obj):
    stream.write(json.dumps(_finite(obj), allow_nan=False, default=_plain) + "\n")
    stream.flush()


def _failure(e):
    return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def main():
    out = _reply_stream()
    requests = _request_stream()
    threading.Thread(target=_watch_parent, daemon=True).start()
    if len(sys.argv) != 3:
        _send(out, {"ready": False, "error": "usage: runner.py <module> <function>", "traceback": ""})
        return 2
    # As under `python -m verl.trainer.main_ppo`: modules beside the working directory import.
    sys.path.insert(0, os.getcwd())
    try:
        fn = _load(sys.argv[1], sys.argv[2])
    except BaseException as e:  # noqa: BLE001 - any failure to load is reported, SystemExit included
        _send(out, {"ready": False, **_failure(e)})
        return 1
    _send(out, {"ready": True})
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            value = fn(**req["kwargs"])
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            reply = {"id": req["id"], "ok": True, "value": value}
            try:
                _send(out, reply)
            except (TypeError, ValueError) as e:
                _send(out, {"id": req["id"], "ok": False, "error": f"the return value cannot be sent back as JSON: {e}", "traceback": ""})
        except Exception as e:  # noqa: BLE001 - the caller decides what a failed sample means
            _send(out, {"id": req["id"], "ok": False, **_failure(e)})
    return 0


async def _await(value):
    return await value


if __name__ == "__main__":
    sys.exit(main())
