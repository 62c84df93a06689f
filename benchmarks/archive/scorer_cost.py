"""Benchmark: the cost of each scorer as a ratio to one plain forward+backward pass over the same
calibration data (the MiniLM Rotten Tomatoes classifier, 72 heads, 512 training rows).

    python -m benchmarks.archive.scorer_cost [--examples 512] [--batch-size 16] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import headcut
import headcut_offline as offline
from benchmarks.classifier import minilm_classifier
from headcut.data import DataConfig, load_calibration, load_tokenizer
from headcut.scoring import SCORERS, ScoreConfig, score


def plain_pass(model, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        loss = model(**batch).loss
        grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        del grads
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2, help="take the fastest of this many timings")
    args = ap.parse_args()
    path = minilm_classifier()
    model = headcut.load(path)
    data = offline.rotten_tomatoes_splits()["train"]
    cal = load_calibration(model, load_tokenizer(path), DataConfig(path=str(data), max_examples=args.examples,
                                                                  batch_size=args.batch_size, seq_len=128))
    plain_pass(model, cal.batches[:2])  # warm-up
    base = min(plain_pass(model, cal.batches) for _ in range(args.repeat))
    rows = {"examples": cal.examples, "batches": len(cal.batches), "forward_backward_s": round(base, 3), "scorers": {}}
    variants = [("gradient", {"abs_per": "example"}), ("gradient", {"abs_per": "batch"}), ("gnorm", {}),
                ("gnorm", {"objective": "loss"}), ("gnorm", {"per": "example"}), ("confidence", {}), ("entropy", {}),
                ("value-l1", {}),
                ("magnitude", {}), ("random", {})]
    assert {name for name, _ in variants} == set(SCORERS)
    for name, extra in variants:
        times = []
        for _ in range(args.repeat):
            result = score(model, cal.batches, ScoreConfig(scorer=name, **extra))
            times.append(result.seconds)
        label = name + "".join(f" {k}={v}" for k, v in extra.items())
        rows["scorers"][label] = {"seconds": round(min(times), 3), "ratio": round(min(times) / base, 3)}
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
