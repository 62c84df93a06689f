"""Benchmark: SmolLM2-135M (Llama, GQA 9 query / 3 KV heads, 30 layers) with one KV group removed in
every other layer. Checks both reload routes against the gated model and reports perplexity on the
first 4,096 tokens of hamlet.txt before and after.

    python benchmarks/smollm_gqa.py [--out DIR] [--tokens 4096] [--block 512]

Then time it: headcut bench <smollm dir> <out> --seq-len 128 --batch-size 1 --json -
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time

import torch
import transformers

import headcut
import headcut_offline as offline


def perplexity(model, ids: torch.Tensor, block: int) -> float:
    nll, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, ids.shape[1] - 1, block):
            chunk = ids[:, start : start + block]
            if chunk.shape[1] < 2:
                break
            out = model(input_ids=chunk, labels=chunk)
            n = chunk.shape[1] - 1
            nll += out.loss.item() * n
            count += n
    return math.exp(nll / count)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=512)
    args = ap.parse_args()
    src = offline.smollm_dir()
    tok = transformers.AutoTokenizer.from_pretrained(src)
    ids = tok(offline.hamlet_path().read_text(), return_tensors="pt").input_ids[:, : args.tokens]
    model = headcut.load(src)
    blocks = headcut.model_blocks(model)
    # drop KV group 2 (query heads 6, 7, 8) in every other layer
    mask = {"drop": {b.name: [6, 7, 8] for b in blocks if b.layer % 2 == 1}}
    t0 = time.perf_counter()
    ppl_full = perplexity(model, ids, args.block)
    with headcut.gated(model, mask):
        ppl_gated = perplexity(model, ids, args.block)
        with torch.inference_mode():
            gated_logits = model(input_ids=ids[:, :256]).logits
    result = headcut.slim(model, mask, gqa="group")
    with torch.inference_mode():
        slim_logits = model(input_ids=ids[:, :256]).logits
    ppl_slim = perplexity(model, ids, args.block)
    out = args.out or tempfile.mkdtemp() + "/smollm-slim"
    headcut.save(model, out, source=src, force=True)
    again = headcut.load(out)
    remote = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    with torch.inference_mode():
        d_load = (again(input_ids=ids[:, :256]).logits - gated_logits).abs().max().item()
        d_remote = (remote(input_ids=ids[:, :256]).logits - gated_logits).abs().max().item()
    report = {
        "heads": [result.total_before, result.total_after],
        "kv_heads": [sum(b.kv_heads for b in blocks), sum(b.kv_heads for b in headcut.model_blocks(model))],
        "params": [result.params_before, result.params_after],
        "perplexity_full": round(ppl_full, 3),
        "perplexity_gated": round(ppl_gated, 3),
        "perplexity_slimmed": round(ppl_slim, 3),
        "max_abs_logit_diff_slim_vs_gated": (slim_logits - gated_logits).abs().max().item(),
        "max_abs_logit_diff_headcut_load_vs_gated": d_load,
        "max_abs_logit_diff_remote_code_vs_gated": d_remote,
        "tokens": ids.shape[1],
        "out": out,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
