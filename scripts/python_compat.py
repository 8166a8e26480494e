"""Checks verl-ts outputs with Python's own tools, where they are installed
(transformers, tokenizers, torch, pyarrow): run scripts/python-compat-export.mjs OUT
first, then `python3 scripts/python_compat.py OUT`. Prints one JSON line per check
and exits non-zero if any check fails."""
import json
import sys

out = sys.argv[1]
ref = json.load(open(f"{out}/reference.json"))
ok = True


def report(name, passed, **figures):
    global ok
    ok = ok and passed
    print(json.dumps({"check": name, "passed": bool(passed), **figures}), flush=True)


import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained(f"{out}/hf_stories", torch_dtype=torch.float32).eval()
for case in ref["cases"]:
    ids = torch.tensor([case["ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    diff = (logits - torch.tensor(case["last_logits"])).abs().max().item()
    report("transformers_logits", diff < 1e-3, text=case["text"], max_abs_diff=diff)
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=len(case["greedy"]), do_sample=False, output_scores=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    toks = gen.sequences[0, ids.shape[1]:].tolist()
    lps = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(gen.scores, toks)]
    lp_diff = max(abs(a - b) for a, b in zip(lps, case["greedy_logprobs"])) if case["greedy_logprobs"] else None
    report("transformers_greedy", toks == case["greedy"], text=case["text"], n=len(toks),
           first_mismatch=next((i for i, (a, b) in enumerate(zip(toks, case["greedy"])) if a != b), None),
           max_logprob_diff=lp_diff)

tok = AutoTokenizer.from_pretrained(f"{out}/hf_stories")
for c in ref["tokenizer"]:
    ids = tok(c["text"])["input_ids"]
    report("hf_tokenizer_ids", ids == c["ids"], text=c["text"], ours=c["ids"], theirs=ids)

try:
    import pyarrow.parquet as pq
    for split, n in (("train", 7473), ("test", 1319)):
        t = pq.read_table(f"{out}/gsm8k/{split}.parquet")
        row = t.slice(0, 1).to_pylist()[0]
        report("pyarrow_reads_gsm8k", t.num_rows == n and row["data_source"] == "openai/gsm8k"
               and row["prompt"][0]["role"] == "user" and "reward_model" in row, split=split, rows=t.num_rows,
               schema=str(t.schema).replace("\n", "; ")[:400])
    import pandas as pd
    df = pd.read_parquet(f"{out}/gsm8k/test.parquet")
    report("pandas_reads_gsm8k", len(df) == 1319, ground_truth=str(df.iloc[0]["reward_model"]["ground_truth"]))
except FileNotFoundError as e:
    report("pyarrow_reads_gsm8k", False, error=str(e))

sys.exit(0 if ok else 1)
