"""Benchmark: the learned-gate methods on the MiniLM Rotten Tomatoes classifier (72 heads).

    python -m benchmarks.archive.learned_gates [--steps 250] [--ks 16,32] [--out results.json]
        [--methods pass,passconc,dsp,dsp:pipelined,ste,voita,lag]
        [--baselines michel,gradient,michel+finetune,unpruned+finetune] [--bench-dir DIR]

Every learned method trains for the same number of optimizer steps (default 250 at batch 16 = 4,000
snippets drawn from the 10,108 training rows, shuffled) and is evaluated on 1,000 held-out rows
(the prune benchmark's). Baselines at the same K: michel and one-shot gradient (512 training rows
as calibration, as in benchmarks/prune_methods.py; no training), michel followed by ``finetune``
for the same steps, and the unpruned model fine-tuned for the same steps. With ``--bench-dir`` the
pass and passconc models at the smallest K are saved there for ``headcut bench``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import headcut
import headcut_offline as offline
from benchmarks.classifier import minilm_classifier
from headcut.config import FinetuneConfig, PruneConfig
from headcut.data import DataConfig, load_calibration, load_tokenizer
from headcut.model.masks import HeadMask
from headcut.pruning import eval_metric, plan_prune
from headcut.training.finetuning import finetune


def metric_of(model, calibration, mask=None) -> float:
    """The primary metric of ``calibration`` with the heads outside ``mask`` gated off."""
    return eval_metric(model, calibration).measure(mask or HeadMask.full(headcut.model_blocks(model)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--ks", default="16,32")
    ap.add_argument("--methods", default="pass,passconc,dsp,dsp:pipelined,ste,voita,lag")
    ap.add_argument("--baselines", default="michel,gradient,michel+finetune,unpruned+finetune")
    ap.add_argument("--eval-examples", type=int, default=1000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--bench-dir", default=None)
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    path = minilm_classifier()
    splits = offline.rotten_tomatoes_splits()
    model = headcut.load(path)
    tok = load_tokenizer(path)
    train = load_calibration(model, tok, DataConfig(path=str(splits["train"])))
    cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=512))
    dev = load_calibration(model, tok, DataConfig(path=str(splits["test"]), max_examples=args.eval_examples,
                                                  batch_size=64))
    base = metric_of(model, dev)
    print(f"unpruned accuracy {base:.4f}; {len(train.batches)} training batches; {args.steps} steps", flush=True)
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"unpruned": base, "steps": args.steps, "rows": rows}, indent=2))

    baselines = args.baselines.split(",") if args.baselines else []
    if "unpruned+finetune" in baselines:
        m = headcut.load(path)
        t = time.perf_counter()
        finetune(m, train, FinetuneConfig(max_steps=args.steps, lr=2e-5, seed=0))
        record({"method": "unpruned+finetune", "k": 72, "accuracy": metric_of(m, dev),
                "seconds": time.perf_counter() - t})
    for k in ks:
        for spec in args.methods.split(","):
            name, _, mode = spec.partition(":")
            m = headcut.load(path)
            t = time.perf_counter()
            options = {"mode": mode or None, "max_steps": args.steps}
            result = plan_prune(m, train, PruneConfig(method=name, keep=k), options, eval_calibration=dev)
            run = result.training
            empty = sum(1 for n in result.heads_after.values() if n == 0)
            record({"method": spec, "k": k, "accuracy": result.metric_after, "seconds": time.perf_counter() - t,
                    "mode": run.mode, "empty_blocks": empty, "heads_per_block": result.heads_after,
                    "moved": run.moved, "own_kept": run.own_kept, "final_open": run.history[-1].get("open"),
                    "hyperparameters": run.hyperparameters})
            if args.bench_dir and k == min(ks) and name in ("pass", "passconc") and not mode:
                headcut.slim(m, result.mask)
                headcut.save(m, Path(args.bench_dir) / f"{name}-{k}", source=Path(path), force=True)
        for name in ("michel", "gradient"):
            if name not in baselines and f"{name}+finetune" not in baselines:
                continue
            m = headcut.load(path)
            t = time.perf_counter()
            result = plan_prune(m, cal, PruneConfig(method=name, keep=k))
            pruned = time.perf_counter() - t
            if name in baselines:
                record({"method": name, "k": k, "accuracy": metric_of(m, dev, result.mask), "seconds": pruned})
            if f"{name}+finetune" in baselines:
                headcut.slim(m, result.mask)
                finetune(m, train, FinetuneConfig(max_steps=args.steps, lr=2e-5, seed=0))
                record({"method": f"{name}+finetune", "k": k, "accuracy": metric_of(m, dev),
                        "seconds": time.perf_counter() - t})


if __name__ == "__main__":
    main()
