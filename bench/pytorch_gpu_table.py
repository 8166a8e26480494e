#!/usr/bin/env python3
"""PyTorch on the same GPU, at the shapes of bench/gpu_decode.ts and bench/gpu_gemm.ts (issue 23's
table), for the side-by-side figures in docs/gpu.md. Run with the GPU machine's python3 (torch 2.11,
transformers 5.17) in the same device call as the verl-ts benchmarks:

    python3 bench/pytorch_gpu_table.py [--only matmul,update,rollout] [--reps 5] > pytorch_table.jsonl

- matmul: 4096^3 torch.matmul in f32, TF32, f16 and bf16 (CUDA events, median of --reps after warm-up)
- update: the 0.5B shape (Qwen2: hidden 896, intermediate 4864, 24 layers, 14 heads, 2 kv heads, q/k/v
  biases, tied embedding, vocabulary 512), 64 rows x 96 tokens (32 prompt + 64 response), one
  micro-batch, vanilla clipped PPO loss (token-mean), grad clip 1.0, AdamW: f32, TF32, bf16 autocast
- rollout: HF generate, 64 prompts of 16-32 tokens x n = 8 = 512 rows, 256 new tokens, temperature 1,
  EOS ignored, at vocabulary 512 (f32 and bf16) and 151,936 (bf16; Qwen2.5-0.5B's size, 494M
  parameters); and the prefill alone (one forward over 512 x 32 prompt tokens with the cache)
One JSON line per figure.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def emit(name, config, figures):
    print(json.dumps({"name": name, "config": config, "figures": figures}), flush=True)


def cuda_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def matmul(reps):
    n = 4096
    for name, dtype, tf32 in [("f32", torch.float32, False), ("tf32", torch.float32, True), ("f16", torch.float16, False), ("bf16", torch.bfloat16, False)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        ms = cuda_ms(lambda: a @ b, reps * 4)
        emit("pytorch_matmul", {"n": n, "dtype": name}, {"ms": ms, "tflops": 2 * n ** 3 / ms / 1e9})
    torch.backends.cuda.matmul.allow_tf32 = False


def qwen(vocab, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).to("cuda", dtype=dtype)
    return m, sum(p.numel() for p in m.parameters())


def update(reps):
    B, P, R, V = 64, 32, 64, 512
    for mode in ["f32", "tf32", "bf16_autocast"]:
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        model, params = qwen(V)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
        g = torch.Generator(device="cuda").manual_seed(1)
        ids = torch.randint(3, V, (B, P + R), device="cuda", generator=g)
        adv = torch.randn(B, 1, device="cuda", generator=g).expand(B, R)
        mask = torch.ones(B, R, device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16_autocast"):
                logits = model(ids).logits[:, P - 1:-1, :]
            logp = torch.gather(F.log_softmax(logits.float(), -1), -1, ids[:, P:, None]).squeeze(-1)
            ratio = torch.exp(logp - logp.detach())
            loss = (torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * mask).sum() / mask.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        ms = cuda_ms(step, reps)
        tokens = B * (P + R)
        emit("pytorch_update_0.5B", {"rows": B, "tokens": P + R, "mode": mode, "params": params}, {"ms": ms, "tokens_per_s": tokens / ms * 1e3, "tflops": 6 * params * tokens / ms / 1e9})
        del model, opt
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False


def rollout(new_tokens, vocabs, reps):
    prompts, n = 64, 8
    for vocab, dtype in [(512, torch.float32), (512, torch.bfloat16), (151936, torch.bfloat16)]:
        if vocab not in vocabs:
            continue
        model, params = qwen(vocab, dtype)
        model.eval()
        g = torch.Generator().manual_seed(3)
        lens = torch.randint(16, 33, (prompts,), generator=g)
        P = int(lens.max())
        ids = torch.zeros(prompts, P, dtype=torch.long)
        att = torch.zeros(prompts, P, dtype=torch.long)
        for i, l in enumerate(lens.tolist()):
            ids[i, P - l:] = torch.randint(3, vocab, (l,), generator=g)
            att[i, P - l:] = 1
        ids = ids.repeat_interleave(n, 0).cuda()
        att = att.repeat_interleave(n, 0).cuda()
        rows = ids.shape[0]
        kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=att, **{**kw, "min_new_tokens": 4, "max_new_tokens": 4})
            runs = []
            for _ in range(reps):  # the best of reps timed runs (one run varied by 15% between device calls)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model.generate(input_ids=ids, attention_mask=att, **kw)
                torch.cuda.synchronize()
                runs.append(time.perf_counter() - t0)
            s = min(runs)
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            pre = cuda_ms(lambda: model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True), 3)
        got = out.shape[1] - P
        emit("pytorch_generate_0.5B", {"vocab": vocab, "dtype": str(dtype).replace("torch.", ""), "rows": rows, "prompt_max": P, "new_tokens": got, "params": params},
             {"tokens_per_s": rows * got / s, "wall_s": s, "prefill_ms": pre, "runs_tokens_per_s": [rows * got / r for r in runs]})
        del model
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="matmul,update,rollout")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--rollout-vocab", default="512,151936", help="vocabularies of the rollout part (512: f32 and bf16; 151936: bf16)")
    ap.add_argument("--rollout-reps", type=int, default=1, help="timed generate runs a configuration (the best is reported)")
    a = ap.parse_args()
    only = set(a.only.split(","))
    emit("pytorch_env", {}, {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)})
    for name, fn in [("matmul", lambda: matmul(a.reps)), ("update", lambda: update(a.reps)), ("rollout", lambda: rollout(a.new, {int(v) for v in a.rollout_vocab.split(",")}, a.rollout_reps))]:
        if name in only:
            try:
                fn()
            except Exception as e:  # one part failing keeps the others' figures
                emit(f"pytorch_{name}", {}, {"error": repr(e)})


if __name__ == "__main__":
    main()
