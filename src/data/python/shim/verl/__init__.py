"""verl-ts's stand-in for the two names of verl that samplers import, used only when verl itself is
not installed in this python3 (a real verl earlier on sys.path wins): DataProto is the batch view
update(batch=...) receives (see src/data/python/bridge.py)."""

import importlib.util as _util
import os as _os
import sys as _sys

_bridge = _sys.modules.get("__main__")
DataProto = getattr(_bridge, "BatchView", None)
if DataProto is None:  # imported outside the bridge (e.g. a user's own test): load its class by path
    _spec = _util.spec_from_file_location("verl_ts_bridge", _os.path.join(_os.path.dirname(__file__), "..", "..", "bridge.py"))
    _mod = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    DataProto = _mod.BatchView
