#!/usr/bin/env python3
"""Makes the tiny model-family fixtures under test/models/fixtures/families/ (run once, on a
machine with torch and transformers; the outputs are committed so the checks run everywhere).

For each family: a random-weight model saved with save_pretrained (config.json +
model.safetensors), a byte-level BPE tokenizer.json, and reference.safetensors + reference.json:
5 prompts, their greedy continuations (32 tokens, eager attention, f32 on the CPU), the logits of
the whole sequence and the per-token log-probs of the continuation; for MoE also the router
logits and the loss with its auxiliary term.

Usage: python3 scripts/make_family_fixtures.py OUT_DIR
"""
import json, os, sys, traceback, zlib
import torch
import transformers
from safetensors.torch import save_file

OUT = sys.argv[1] if len(sys.argv) > 1 else "test/models/fixtures/families"
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)
VOCAB = 320
CORPUS = [
    "Once upon a time there was a little girl named Lily. She liked to play in the park.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "The answer is 72. #### 72", "def add(a, b):\n    return a + b\n", "<|im_start|>user\nhi<|im_end|>",
] * 20


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def families():
    T = transformers
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    yield "qwen3", T.Qwen3Config(**common, head_dim=24, tie_word_embeddings=True, rope_theta=1e6), T.Qwen3ForCausalLM
    yield "qwen3_untied", T.Qwen3Config(**common, head_dim=16, tie_word_embeddings=False), T.Qwen3ForCausalLM
    yield "qwen3_moe", T.Qwen3MoeConfig(**common, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                                        mlp_only_layers=[1], router_aux_loss_coef=0.01,
                                        output_router_logits=False, tie_word_embeddings=False), T.Qwen3MoeForCausalLM
    yield "gemma2", T.Gemma2Config(**common, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                   hidden_activation="gelu_pytorch_tanh"), T.Gemma2ForCausalLM
    yield "gemma3_text", T.Gemma3TextConfig(**{**common, "num_hidden_layers": 4}, head_dim=16, sliding_window=8,
                                            query_pre_attn_scalar=16, sliding_window_pattern=2,
                                            rope_theta=1e6, rope_local_base_freq=10000.0,
                                            hidden_activation="gelu_pytorch_tanh"), T.Gemma3ForCausalLM
    yield "mistral", T.MistralConfig(**common, head_dim=16, sliding_window=8, tie_word_embeddings=False), T.MistralForCausalLM
    yield "qwen2_sliding", T.Qwen2Config(**common, use_sliding_window=True, sliding_window=8, max_window_layers=1,
                                         tie_word_embeddings=False), T.Qwen2ForCausalLM
    yield "llama_bias", T.LlamaConfig(**common, attention_bias=True, mlp_bias=True, tie_word_embeddings=False), T.LlamaForCausalLM


def main():
    tok = make_tokenizer()
    texts = ["Once upon a time", "Natalia sold clips to 48 of her friends in April, and then",
             "The answer is", "def add(a, b):", "<|im_start|>user\nhi"]
    prompts = [tok.encode(t).ids for t in texts]
    summary = {"transformers": transformers.__version__, "torch": torch.__version__, "families": {}}
    for name, cfg, cls in families():
        try:
            cfg._attn_implementation = "eager"
            torch.manual_seed(zlib.crc32(name.encode()) % 1000)
            model = cls(cfg).eval()
            # Make the norms' weights non-trivial so (1 + w) vs w conventions are tested.
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "norm" in n:
                        p.add_(torch.randn_like(p) * 0.1)
                    if n.endswith(".bias"):
                        p.copy_(torch.randn_like(p) * 0.05)
            d = os.path.join(OUT, name)
            model.save_pretrained(d, safe_serialization=True)
            tok.save(os.path.join(d, "tokenizer.json"))
            json.dump({"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                       "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"},
                      open(os.path.join(d, "tokenizer_config.json"), "w"))
            tensors, ref = {}, {"prompts": prompts, "greedy": [], "new_tokens": 32}
            for i, p in enumerate(prompts):
                ids = torch.tensor([p])
                with torch.no_grad():
                    g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                       min_new_tokens=32, pad_token_id=0, eos_token_id=None)
                    full = g[0].tolist()
                    out = model(torch.tensor([full]))
                    logits = out.logits[0].float()
                    lp = torch.log_softmax(logits, -1)
                    tgt = torch.tensor(full[1:])
                    per_tok = lp[:-1].gather(-1, tgt[:, None])[:, 0]
                ref["greedy"].append(full[len(p):])
                tensors[f"logits_{i}"] = logits.contiguous()
                tensors[f"logprobs_{i}"] = per_tok[len(p) - 1:].contiguous()
            if "moe" in name:
                full = prompts[1] + ref["greedy"][1]
                ids = torch.tensor([full])
                with torch.no_grad():
                    out = model(ids, labels=ids, output_router_logits=True)
                ref["loss_with_aux"] = float(out.loss)
                ref["aux_loss"] = float(out.aux_loss)
                ref["router_aux_loss_coef"] = cfg.router_aux_loss_coef
                ref["moe_sequence"] = 1
                for li, rl in enumerate(out.router_logits):
                    if rl is not None:
                        tensors[f"router_logits_{li}"] = rl.float().contiguous()
            save_file(tensors, os.path.join(d, "reference.safetensors"))
            json.dump(ref, open(os.path.join(d, "reference.json"), "w"))
            summary["families"][name] = {"ok": True, "config": json.load(open(os.path.join(d, "config.json")))}
            print("ok", name, flush=True)
        except Exception as e:
            summary["families"][name] = {"ok": False, "error": traceback.format_exc()}
            print("FAILED", name, e, flush=True)
    json.dump(summary, open(os.path.join(OUT, "summary.json"), "w"), indent=1)


main()
