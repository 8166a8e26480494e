#!/usr/bin/env python3
"""The actor-update benchmark of verl-ts (bench/actor_update.ts) in PyTorch, for
the "within 1.5x of PyTorch" comparison. PyTorch cannot be installed on the
project's machine, so run this wherever torch exists, on the same kind of CPU:

    python3 bench/pytorch_actor_update.py [--model ../shared/models/stories260K/stories260K.bin] > pytorch.json
    npm run bench -- --only actor_update --pytorch pytorch.json

`npm run bench` runs it itself (benchmark pytorch_actor_update) with the Python named by
VERL_BENCH_PYTHON (default python3), and reports it skipped where that Python has no torch.

Same step as the TypeScript benchmark: stories260K (Llama: dim 64, 5 layers, 8
heads, 4 kv heads, SwiGLU 172, vocab 512, tied embeddings, RMSNorm, RoPE on
adjacent pairs), 64 sequences of 256 tokens (64 prompt + 192 response), micro
batches of 32 with gradient accumulation, vanilla dual-clip PPO loss with
token-mean over the responses, gradient clipping at 1.0, AdamW(lr=1e-5,
betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01). Timed at 1 and 2 threads
(torch.set_num_threads), the counterparts of 1 and 2 ranks; one warm-up step,
then --reps steps; prints one JSON line with median/min/max tokens/s.
"""
import argparse
import json
import math
import os
import platform
import statistics
import struct
import time

import torch
import torch.nn.functional as F

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, EPS = 64, 172, 5, 8, 4, 512, 1e-5
HEAD = DIM // HEADS


def load_llama2c(path):
    """Weights of a llama2.c version-0 checkpoint (the layout in shared/models/stories260K/README.md)."""
    with open(path, "rb") as f:
        header = struct.unpack("7i", f.read(28))
        if header[:6] != (DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB):
            raise SystemExit(f"{path}: header {header} is not stories260K's")
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    shapes = [("emb", (VOCAB, DIM)), ("attn_norm", (LAYERS, DIM)), ("wq", (LAYERS, HEADS * HEAD, DIM)),
              ("wk", (LAYERS, KV_HEADS * HEAD, DIM)), ("wv", (LAYERS, KV_HEADS * HEAD, DIM)), ("wo", (LAYERS, DIM, HEADS * HEAD)),
              ("ffn_norm", (LAYERS, DIM)), ("w1", (LAYERS, HIDDEN, DIM)), ("w2", (LAYERS, DIM, HIDDEN)),
              ("w3", (LAYERS, HIDDEN, DIM)), ("norm", (DIM,))]
    out, at = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        out[name] = data[at:at + n].reshape(shape).clone()
        at += n
    return out


def random_weights(gen):
    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.02
    return {"emb": w(VOCAB, DIM), "attn_norm": torch.ones(LAYERS, DIM), "wq": w(LAYERS, HEADS * HEAD, DIM),
            "wk": w(LAYERS, KV_HEADS * HEAD, DIM), "wv": w(LAYERS, KV_HEADS * HEAD, DIM), "wo": w(LAYERS, DIM, HEADS * HEAD),
            "ffn_norm": torch.ones(LAYERS, DIM), "w1": w(LAYERS, HIDDEN, DIM), "w2": w(LAYERS, DIM, HIDDEN),
            "w3": w(LAYERS, HIDDEN, DIM), "norm": torch.ones(DIM)}


class Llama(torch.nn.Module):
    def __init__(self, weights, max_len):
        super().__init__()
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in weights.items()})
        inv = 10000.0 ** (-torch.arange(0, HEAD, 2, dtype=torch.float32) / HEAD)
        ang = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    @staticmethod
    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)

    def rope(self, x, T):  # x [B, H, T, HEAD]; rotate adjacent pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        c, s = self.cos[:T], self.sin[:T]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)

    def forward(self, ids):
        B, T = ids.shape
        p = self.p
        x = p["emb"][ids]
        for l in range(LAYERS):
            n = self.rms(x, p["attn_norm"][l])
            q = (n @ p["wq"][l].T).view(B, T, HEADS, HEAD).transpose(1, 2)
            k = (n @ p["wk"][l].T).view(B, T, KV_HEADS, HEAD).transpose(1, 2)
            v = (n @ p["wv"][l].T).view(B, T, KV_HEADS, HEAD).transpose(1, 2)
            q, k = self.rope(q, T), self.rope(k, T)
            k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(B, T, DIM) @ p["wo"][l].T
            m = self.rms(x, p["ffn_norm"][l])
            x = x + (F.silu(m @ p["w1"][l].T) * (m @ p["w3"][l].T)) @ p["w2"][l].T
        return self.rms(x, p["norm"]) @ p["emb"].T


def response_log_probs(model, ids, R):
    logits = model(ids)[:, -R - 1:-1, :]
    return torch.gather(F.log_softmax(logits.float(), dim=-1), -1, ids[:, -R:, None]).squeeze(-1)


def ppo_loss(logp, old, adv, mask, total_tokens, clip=0.2, clip_c=3.0):
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    c1 = torch.maximum(l1, l2)
    c2 = torch.minimum(-adv * clip_c, c1)
    losses = torch.where(adv < 0, c2, c1)
    # token-mean over the whole mini-batch (the micro-batch losses sum to it)
    return (losses * mask).sum() / total_tokens


def step(model, opt, ids, adv, mask, micro, R):
    opt.zero_grad(set_to_none=True)
    total = mask.sum()
    for b0 in range(0, ids.shape[0], micro):
        sl = slice(b0, b0 + micro)
        logp = response_log_probs(model, ids[sl], R)
        loss = ppo_loss(logp, logp.detach(), adv[sl], mask[sl], total)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = os.environ.get("VERL_SHARED_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))
    ap.add_argument("--model", default=os.path.join(shared, "models", "stories260K", "stories260K.bin"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--response", type=int, default=192)
    ap.add_argument("--micro", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    load0 = round(os.getloadavg()[0], 2)
    gen = torch.Generator().manual_seed(7)
    weights = load_llama2c(a.model) if os.path.exists(a.model) else random_weights(gen)
    B, T, R = a.batch, a.seq, a.response
    ids = torch.randint(3, VOCAB, (B, T), generator=gen)
    adv = torch.randn(B, 1, generator=gen).expand(B, R).contiguous()
    mask = torch.ones(B, R)
    figures = {}
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        model = Llama({k: v.clone() for k, v in weights.items()}, T)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        step(model, opt, ids, adv, mask, min(a.micro, B), R)  # warm-up
        secs, cpu = [], []
        for _ in range(a.reps):
            t0, c0 = time.perf_counter(), time.process_time()
            step(model, opt, ids, adv, mask, min(a.micro, B), R)
            secs.append(time.perf_counter() - t0)
            cpu.append((time.process_time() - c0) / secs[-1])
        rates = [B * T / s for s in secs]
        figures[f"threads_{threads}"] = {
            "tokens_per_s": {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "n": len(rates)},
            "seconds": {"median": statistics.median(secs), "min": min(secs), "max": max(secs), "n": len(secs)},
            # CPU seconds per wall second (about the thread count when each thread has a core)
            "cpu_utilisation": {"median": statistics.median(cpu), "min": min(cpu), "max": max(cpu), "n": len(cpu)},
        }
    print(json.dumps({
        "name": "pytorch_actor_update",
        "config": {"model": "stories260K" if os.path.exists(a.model) else "stories260K shapes, random weights", "sequences": B, "seq_len": T,
                   "response_len": R, "micro_batch": a.micro, "optimizer": "AdamW(lr=1e-5, betas=0.9/0.999, weight_decay=0.01)",
                   "grad_clip": 1.0, "loss": "vanilla clipped PPO, token-mean", "reps": a.reps, "warmup": 1},
        "figures": figures,
        "machine": {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(), "node": None, "platform": f"{platform.system().lower()}-{platform.machine()}",
                    "backend": f"pytorch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), python {platform.python_version()}",
                    "load_avg_1m": {"start": load0, "end": round(os.getloadavg()[0], 2)}},
    }))


if __name__ == "__main__":
    main()
