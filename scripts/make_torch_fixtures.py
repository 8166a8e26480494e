#!/usr/bin/env python3
"""Makes the torch-format fixtures under test/models/fixtures/torch/ (run once, on a machine with
torch; the outputs are committed so the readers are checked everywhere against files torch wrote).

  basic.pt / basic_legacy.pt   torch.save of a nested object (zip format and the pre-1.6 legacy
                               format): f32, f16, bf16, f64, int64, int32, int8, uint8 and bool tensors, a
                               0-d tensor, a transposed (non-contiguous) view, two views of one
                               storage with offsets, OrderedDict, list, tuple, str, int, float, None
  basic.json                   the same object as JSON (tensors as {dtype, shape, values})
  qwen3_bin/                   the qwen3 family fixture's weights as pytorch_model.bin (one file)
  qwen3_bin_sharded/           the same as pytorch_model-0000k-of-00002.bin + pytorch_model.bin.index.json
  megatron_adapter/            verl's Megatron adapter checkpoint for the qwen3 fixture's shape:
                               mp_rank_00_adapter.pt = torch.save({"adapter_state_dict": {...}}) with
                               Megatron-Bridge's parameter names (decoder.layers.N.<module>.adapter.
                               linear_{in,out}.weight), bf16, rank 4
  megatron_adapter_dcp/        the same adapter as a torch.distributed.checkpoint (.distcp + .metadata)

Usage: python3 scripts/make_torch_fixtures.py [OUT_DIR] [FAMILIES_DIR]
"""
import collections, json, os, shutil, sys
import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "test/models/fixtures/torch"
FAM = sys.argv[2] if len(sys.argv) > 2 else "test/models/fixtures/families"
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)


def as_json(x):
    if isinstance(x, torch.Tensor):
        v = x.detach().to(torch.float64) if x.dtype in (torch.bfloat16, torch.float16) else x.detach()
        return {"__tensor__": True, "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape),
                "values": v.flatten().tolist()}
    if isinstance(x, dict):
        return {"__dict__": type(x).__name__, "items": [[k, as_json(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"__tuple__": [as_json(v) for v in x]}
    if isinstance(x, list):
        return [as_json(v) for v in x]
    return x


base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
basic = collections.OrderedDict()
basic["f32"] = torch.randn(3, 5)
basic["f16"] = torch.randn(2, 3).to(torch.float16)
basic["bf16"] = torch.randn(4).to(torch.bfloat16)
basic["f64"] = torch.randn(2, 2, dtype=torch.float64)
basic["i64"] = torch.tensor([[1, -2, 3], [2**40, 0, -(2**33)]], dtype=torch.int64)
basic["i32"] = torch.tensor([7, -8, 9], dtype=torch.int32)
basic["i8"] = torch.tensor([-128, 0, 127], dtype=torch.int8)
basic["u8"] = torch.tensor([0, 200, 255], dtype=torch.uint8)
basic["bool"] = torch.tensor([True, False, True])
basic["scalar"] = torch.tensor(3.5)
basic["transposed"] = base.t()
basic["view_a"] = base[1]          # storage offset 6
basic["view_b"] = base[2:, 3:]     # offset 15, strides (6, 1)
basic["nested"] = {"list": [1, 2.5, "three", None, True], "tuple": (4, "five"), "big": 2**62, "neg": -3}
torch.save(basic, os.path.join(OUT, "basic.pt"))
torch.save(basic, os.path.join(OUT, "basic_legacy.pt"), _use_new_zipfile_serialization=False)
with open(os.path.join(OUT, "basic.json"), "w") as f:
    json.dump(as_json(basic), f)

# A Hugging Face folder whose weights are pytorch_model.bin (what older checkpoints ship).
from safetensors.torch import load_file
src = os.path.join(FAM, "qwen3")
sd = load_file(os.path.join(src, "model.safetensors"))
for name in ("qwen3_bin", "qwen3_bin_sharded"):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), d)
torch.save(sd, os.path.join(OUT, "qwen3_bin", "pytorch_model.bin"))
keys = sorted(sd)
half = len(keys) // 2
index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())}, "weight_map": {}}
for i, part in enumerate((keys[:half], keys[half:])):
    fname = f"pytorch_model-{i + 1:05d}-of-00002.bin"
    torch.save({k: sd[k] for k in part}, os.path.join(OUT, "qwen3_bin_sharded", fname))
    index["weight_map"].update({k: fname for k in part})
with open(os.path.join(OUT, "qwen3_bin_sharded", "pytorch_model.bin.index.json"), "w") as f:
    json.dump(index, f, indent=1)

# verl's Megatron adapter checkpoint (verl/utils/megatron_peft_utils.py save_adapter_checkpoint) for
# the qwen3 fixture's shape; Megatron's fused layouts: linear_qkv rows by query group
# [q heads of the group, k, v], linear_fc1 rows [gate; up].
cfg = json.load(open(os.path.join(src, "config.json")))
H, L, I = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or H // nh
r = 4
shapes = {
    "self_attention.linear_qkv": (H, (nh + 2 * nkv) * hd),
    "self_attention.linear_proj": (nh * hd, H),
    "mlp.linear_fc1": (H, 2 * I),
    "mlp.linear_fc2": (I, H),
}
adapter = collections.OrderedDict()
for layer in range(L):
    for mod, (fan_in, fan_out) in shapes.items():
        p = f"decoder.layers.{layer}.{mod}.adapter"
        adapter[f"{p}.linear_in.weight"] = (torch.randn(r, fan_in) / fan_in ** 0.5).to(torch.bfloat16)
        adapter[f"{p}.linear_out.weight"] = (torch.randn(fan_out, r) * 0.1).to(torch.bfloat16)
d = os.path.join(OUT, "megatron_adapter")
os.makedirs(d, exist_ok=True)
torch.save({"adapter_state_dict": adapter}, os.path.join(d, "mp_rank_00_adapter.pt"))
with open(os.path.join(d, "lora.json"), "w") as f:
    json.dump({"rank": r, "alpha": 8, "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
               "base": "../../families/qwen3"}, f)

try:
    import torch.distributed.checkpoint as dcp
    d = os.path.join(OUT, "megatron_adapter_dcp")
    shutil.rmtree(d, ignore_errors=True)
    dcp.save({k: v.clone() for k, v in adapter.items()}, checkpoint_id=d)
except Exception as e:  # older torch: no single-process save
    print(f"dcp fixture not written: {e!r}", file=sys.stderr)

for root, _, files in os.walk(OUT):
    for f in sorted(files):
        p = os.path.join(root, f)
        print(f"{os.path.getsize(p):>9} {p}")
print("torch", torch.__version__)
