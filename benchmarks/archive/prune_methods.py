"""Benchmark: accuracy of the MiniLM Rotten Tomatoes classifier (72 heads) pruned to K heads by each
method, with 512 training rows as calibration data and held-out rows for evaluation.

    python -m benchmarks.archive.prune_methods [--eval-examples 1000] [--ks 48,36,24,16,8] [--out results.json]
        [--methods michel,greedy-gnorm,greedy-gnorm:loss,greedy-gnorm:per-example,gradient,confidence,entropy,random]

Greedy-Gnorm removes one head per re-computation (the paper's step), so one run down to the
smallest K passes through every larger K: the masks at the larger K are read off its trajectory. Its
objective is the paper's (the logits' norm) unless the spec says ``:loss``; ``:per-example`` takes the
gradient norms of every sentence instead of every batch.
Michel et al. (steps of 10 % of the heads) and the one-shot scorers run once per K; random runs
with 5 seeds. Accuracy is measured with the heads gated off (identical to the slimmed model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import headcut
import headcut_offline as offline
from benchmarks.classifier import minilm_classifier
from headcut.data import DataConfig, load_calibration, load_tokenizer
from headcut.model.masks import HeadMask
from headcut.pruning import PruneConfig, eval_metric, plan_prune


def mask_after(blocks, trajectory, keep: int) -> HeadMask:
    """The mask once the trajectory's removals bring the model down to ``keep`` heads."""
    kept = {b.name: set(range(b.heads)) for b in blocks}
    for point in trajectory:
        if point.heads < keep:
            break
        for item in point.removed:
            block, head = item.rsplit(":", 1)
            kept[block].discard(int(head))
    assert sum(len(v) for v in kept.values()) == keep
    return HeadMask({k: sorted(v) for k, v in kept.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cal-examples", type=int, default=512)
    ap.add_argument("--eval-examples", type=int, default=1000)
    ap.add_argument("--ks", default="48,36,24,16,8")
    ap.add_argument("--methods", default="michel,greedy-gnorm,gradient,confidence,entropy,random")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    methods = args.methods.split(",")
    path = minilm_classifier()
    splits = offline.rotten_tomatoes_splits()
    model = headcut.load(path)
    tok = load_tokenizer(path)
    cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=args.cal_examples))
    dev = load_calibration(model, tok, DataConfig(path=str(splits["test"]), max_examples=args.eval_examples,
                                                  batch_size=64))
    metric = eval_metric(model, dev)
    blocks = headcut.model_blocks(model)
    full = HeadMask.full(blocks)
    results: dict = {"examples": {"calibration": cal.examples, "evaluation": dev.examples},
                     "unpruned_accuracy": metric.measure(full), "methods": {}}
    print(json.dumps(results), flush=True)
    for spec in methods:
        # "greedy-gnorm:loss" runs greedy-gnorm with the task loss, "greedy-gnorm:per-example" per sentence
        method, _, variant = spec.partition(":")
        rows: dict = {}
        if method == "greedy-gnorm":
            options = {"step": 1, "objective": "loss" if variant == "loss" else "logits-norm",
                       "per": "example" if variant == "per-example" else "batch"}
            r = plan_prune(model, cal, PruneConfig(method=method, keep=min(ks)), options)
            for k in ks:
                rows[k] = {"accuracy": metric.measure(mask_after(blocks, r.trajectory, k))}
            rows["prune_seconds_to_smallest_k"] = round(r.seconds, 1)
        elif method == "random":
            for k in ks:
                accs, secs = [], []
                for seed in range(args.seeds):
                    r = plan_prune(model, None, PruneConfig(method=method, keep=k, seed=seed))
                    accs.append(metric.measure(r.mask))
                    secs.append(r.seconds)
                rows[k] = {"accuracy_mean": statistics.mean(accs), "accuracy_stdev": statistics.stdev(accs),
                           "accuracies": accs, "prune_seconds": round(statistics.mean(secs), 2)}
        else:
            for k in ks:
                t0 = time.perf_counter()
                r = plan_prune(model, cal, PruneConfig(method=method, keep=k))
                rows[k] = {"accuracy": metric.measure(r.mask), "prune_seconds": round(time.perf_counter() - t0, 1),
                           "scorings": r.scorings}
        results["methods"][spec] = rows
        print(json.dumps({spec: rows}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
