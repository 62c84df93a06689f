"""Benchmark: AUBER on a small-data task, against the unpruned model and against Michel et al. and
random pruning at the number of heads AUBER chose.

    python -m benchmarks.archive.auber [--train-examples 3000] [--episodes 150] [--reward-examples N]
        [--reward-metric accuracy|loss|...] [--seeds 5] [--out results.json]
    python -m benchmarks.archive.auber --from-out slim/ ...   # the output folder of an auber run already made

The model is the README's MiniLM Rotten Tomatoes classifier (72 heads, fine-tuned on 4,000 training
snippets: ``benchmarks/classifier.py``); AUBER runs on ``--train-examples`` of those same snippets (the
paper prunes a model fine-tuned on the task with the task's training data), and every model is
measured on the held-out test split (2,808 snippets). Michel et al. (steps of 10 %) calibrates on 512
training snippets and random runs with ``--seeds`` seeds; both keep exactly AUBER's head count and
are not fine-tuned (AUBER's report says how far its own fine-tunes moved the model). ``--from-out
DIR`` takes the model and report an earlier ``headcut prune <classifier> --method auber --out DIR``
wrote instead of running AUBER again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import headcut
import headcut_offline as offline
from benchmarks.classifier import minilm_classifier
from headcut.data import DataConfig, load_calibration, load_tokenizer
from headcut.model.evaluation import evaluate
from headcut.model.masks import HeadMask
from headcut.progress import Reporter
from headcut.pruning import PruneConfig, eval_metric, plan_prune


def accuracy(model, test) -> float:
    return float(evaluate(model, test).metrics["accuracy"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-examples", type=int, default=3000)
    ap.add_argument("--episodes", type=int, default=150)
    ap.add_argument("--reward-examples", type=int, default=None, help="default: auber's")
    ap.add_argument("--reward-metric", default=None, help="default: auber's")
    ap.add_argument("--from-out", default=None, help="the --out folder of an auber run of the classifier")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="auber's seed")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = minilm_classifier()
    splits = offline.rotten_tomatoes_splits()
    model = headcut.load(path)
    tok = load_tokenizer(path)
    test = load_calibration(model, tok, DataConfig(path=str(splits["test"]), batch_size=64))
    cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=512))
    metric = eval_metric(model, test)
    blocks = headcut.model_blocks(model)
    results: dict = {"examples": {"train": args.train_examples, "test": test.examples},
                     "unpruned": metric.measure(HeadMask.full(blocks)), "rows": {}}
    print(json.dumps(results), file=sys.stderr, flush=True)

    if args.from_out:
        with open(Path(args.from_out) / "headcut-report.json") as f:
            report = json.load(f)
        if report.get("method") != "auber" or Path(report["model"]).resolve() != path.resolve():
            raise SystemExit(f"{args.from_out} is not an auber run of {path}")
        mask = HeadMask({name: list(v) for name, v in report["mask"]["keep"].items()})
        auber_accuracy, seconds = accuracy(headcut.load(args.from_out), test), report["seconds"]
        results["examples"]["train"] = report["data"]["examples"]
    else:
        options = {"episodes": args.episodes}
        if args.reward_examples is not None:
            options["reward_examples"] = args.reward_examples
        if args.reward_metric is not None:
            options["reward_metric"] = args.reward_metric
        t0 = time.perf_counter()
        with Reporter("auto") as progress:
            pruned = headcut.prune(path, "auber", data=str(splits["train"]), seed=args.seed,
                                   data_options={"max_examples": args.train_examples}, progress=progress, **options)
        seconds = time.perf_counter() - t0
        report, mask = pruned.report, pruned.mask
        auber_accuracy = accuracy(pruned.model, test)
    k = sum(len(v) for v in mask.keep.values())
    details = report["auber"]
    results["rows"]["auber"] = {
        "heads": k, "accuracy": auber_accuracy, "seconds": round(seconds, 1),
        "heads_per_layer": {name: len(v) for name, v in mask.keep.items()},
        "reward_metric": details["reward_metric"],
        "evaluations": sum(layer["evaluations"] for layer in details["layers"]),
        "layer_seconds": [round(layer["seconds"], 1) for layer in details["layers"]],
        "reward_examples": details["layers"][0]["reward_examples"],
        "final": {k2: v for k2, v in details["final"].items() if k2 != "history"},
    }
    print(json.dumps({"auber": results["rows"]["auber"]}), file=sys.stderr, flush=True)

    michel = plan_prune(model, cal, PruneConfig(method="michel", keep=k))
    results["rows"]["michel"] = {"heads": k, "accuracy": metric.measure(michel.mask)}
    accs = [metric.measure(plan_prune(model, None, PruneConfig(method="random", keep=k, seed=s)).mask)
            for s in range(args.seeds)]
    results["rows"]["random"] = {"heads": k, "accuracy_mean": statistics.mean(accs),
                                 "accuracy_stdev": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                                 "accuracies": accs}
    print(json.dumps({n: results["rows"][n] for n in ("michel", "random")}), file=sys.stderr, flush=True)

    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
