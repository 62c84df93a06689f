"""Regenerate the benchmark page, ``docs/benchmarks.md``, and its plots (``docs/img/*.png``) from one command:

    pip install -e '.[plots]'                       # matplotlib, for the PNG plots
    python benchmarks/page.py [--studies oneshot,peer,targets,speed] [--peer-python PEER/bin/python] [--rerun]

Each study writes its measurements to ``benchmarks/results/<study>.json`` (with the machine, the versions
and the date) and is skipped on the next call while that file exists (``--rerun STUDY,...`` measures it
again); the page is then rendered from every results file there, so a long study can be run on its own
and the page rebuilt without re-measuring (``--studies none`` only renders). Progress goes to stderr.

Studies (all on the README's classifier: all-MiniLM-L6-v2 fine-tuned on 4,000 Rotten Tomatoes snippets,
72 heads, evaluated on the 2,808 held-out snippets; see ``benchmarks/classifier.py``):

* ``oneshot``: the training-free methods (one-shot scorers, Michel et al., Greedy-Gnorm; random over 5 seeds)
  at every K of ``KS``, scored on 512 training snippets; accuracy with the heads gated off (identical to
  the slimmed model: tests/test_surgery.py) and the prune wall time.
* ``peer``: TextPruner's iterative pruning (``benchmarks/peer_textpruner.py``, run in its own virtual
  environment with transformers 4: ``--peer-python``) on the same 512 calibration snippets and the same
  evaluation batches, at the K it can reach (multiples of the 6 layers), with its best setting in its
  README (16 iterations, uneven heads per layer); its masks are also evaluated by headcut (the page shows
  both numbers: they agree).
* ``targets``: the README main job's recipe (``headcut prune --method pass --max-steps 250 --alpha 0.9
  --recover-steps 250``: 500 steps of batch 8, one epoch of the 4,000 snippets) at 16 heads, and the
  8-head recipe (1,000 steps), over 3 seeds.
* ``speed``: models slimmed to K heads (Greedy-Gnorm's masks) timed by ``headcut bench`` on this machine's
  CPU (batch 8 x 128 tokens), speed-up beside the FLOP ratio; CUDA when the run has a GPU.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import headcut
import torch
import transformers
from headcut import offline
from headcut.config import PruneConfig
from headcut.data import Calibration, DataConfig, load_calibration, load_tokenizer
from headcut.masks import HeadMask
from headcut.pruning import Metric, eval_metric, plan_prune

from classifier import minilm_classifier
from prune_methods import mask_after as trajectory_mask

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOCS = HERE.parent / "docs"
#: heads kept (of 72) in the accuracy curves
KS = [60, 48, 36, 24, 16, 12, 8, 6, 4]
#: the training-free methods, in the plot's legend order
ONESHOT = ["greedy-gnorm", "michel", "gradient", "gnorm", "confidence", "entropy", "value-l1", "magnitude", "random"]
RANDOM_SEEDS = 5
CAL_EXAMPLES = 512


def log(message: str) -> None:
    print(f"[page {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "headcut": headcut.__version__, "date": datetime.date.today().isoformat(),
    }


@dataclass
class Classifier:
    """The README's classifier, its data, and the metric every study reports."""

    path: Path
    splits: dict[str, Path]
    model: torch.nn.Module
    cal: Calibration
    dev: Calibration
    metric: Metric

    @classmethod
    def load(cls) -> Classifier:
        path = minilm_classifier()
        splits = offline.rotten_tomatoes_splits()
        model = headcut.load(path)
        tok = load_tokenizer(path)
        cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=CAL_EXAMPLES))
        dev = load_calibration(model, tok, DataConfig(path=str(splits["test"]), batch_size=64))
        return cls(path=path, splits=splits, model=model, cal=cal, dev=dev, metric=eval_metric(model, dev))

    def accuracy(self, mask: HeadMask | None = None) -> float:
        return 100.0 * self.metric.measure(mask or HeadMask.full(headcut.model_blocks(self.model)))

    def mask_of_layers(self, rows: list[list[int]]) -> HeadMask:
        """A mask from a (layers x heads) 0/1 table, layer i being the model's i-th block."""
        blocks = headcut.model_blocks(self.model)
        return HeadMask({b.name: [h for h, keep in enumerate(row) if keep] for b, row in zip(blocks, rows, strict=True)})


# ---- studies ------------------------------------------------------------------------------------------

def study_oneshot(clf: Classifier, args: argparse.Namespace) -> dict[str, Any]:
    blocks = headcut.model_blocks(clf.model)
    rows: list[dict[str, Any]] = []
    for method in ONESHOT:
        if method == "greedy-gnorm":  # one run to the smallest K passes through every larger K
            start = time.perf_counter()
            r = plan_prune(clf.model, clf.cal, PruneConfig(method=method, keep=min(KS)), {"step": 1})
            seconds = time.perf_counter() - start
            for k in KS:
                rows.append({"method": method, "k": k, "accuracy": clf.accuracy(trajectory_mask(blocks, r.trajectory, k)),
                             "seconds": seconds if k == min(KS) else None})
            log(f"{method}: done ({seconds:.0f} s to {min(KS)} heads)")
            continue
        for k in KS:
            seeds = range(RANDOM_SEEDS) if method == "random" else [0]
            accs, secs = [], []
            for seed in seeds:
                start = time.perf_counter()
                r = plan_prune(clf.model, None if method == "random" else clf.cal,
                               PruneConfig(method=method, keep=k, seed=seed))
                secs.append(time.perf_counter() - start)
                accs.append(clf.accuracy(r.mask))
            row = {"method": method, "k": k, "accuracy": statistics.mean(accs), "seconds": statistics.mean(secs)}
            if len(accs) > 1:
                row |= {"stdev": statistics.stdev(accs), "seeds": len(accs)}
            rows.append(row)
            log(f"{method} K={k}: {row['accuracy']:.2f} %")
    return {"unpruned": clf.accuracy(), "calibration": clf.cal.examples, "evaluation": clf.dev.examples, "rows": rows}


def _write_batches(clf: Classifier, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for prefix, cal in (("cal", clf.cal), ("eval", clf.dev)):
        for i, batch in enumerate(cal.batches):
            for field, value in batch.items():
                tensors[f"{prefix}.{i}.{field}"] = value.contiguous()
    save_file(tensors, str(path))


def study_peer(clf: Classifier, args: argparse.Namespace) -> dict[str, Any]:
    if not args.peer_python:
        raise SystemExit("the peer study needs --peer-python (a Python with textpruner and transformers 4: "
                         "see benchmarks/peer_textpruner.py)")
    ks = [k for k in KS if k % len(headcut.model_blocks(clf.model)) == 0]
    out: dict[str, Any] = {"unpruned": clf.accuracy(), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        batches = Path(tmp) / "batches.safetensors"
        _write_batches(clf, batches)
        for variant in args.peer_variants.split(","):
            even = variant == "even"
            log(f"TextPruner iterative ({args.peer_iters} iterations), {variant} heads per layer, K in {ks}")
            cmd = [args.peer_python, str(HERE / "peer_textpruner.py"), str(clf.path), str(batches),
                   "--ks", ",".join(map(str, ks)), "--n-iters", str(args.peer_iters)] + (["--even"] if even else [])
            done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
            peer = json.loads(done.stdout)
            for k, row in peer["ks"].items():
                row["accuracy_textpruner"] = 100.0 * row.pop("accuracy")
                row["accuracy"] = clf.accuracy(clf.mask_of_layers(row["mask"]))
            peer["unpruned_accuracy"] = 100.0 * peer["unpruned_accuracy"]
            out["runs"][variant] = peer
    return out


#: the README main job's recipe, and the 8-head one (<= 1,000 steps)
RECIPES = {
    16: {"method": "pass", "max_steps": 250, "alpha": 0.9, "recover_steps": 250},
    8: {"method": "pass", "max_steps": 500, "alpha": 0.9, "recover_steps": 500},
}


def study_targets(clf: Classifier, args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for k, recipe in RECIPES.items():
        for seed in range(args.seeds):
            options = dict(recipe)
            method = options.pop("method")
            recover = options.pop("recover_steps")
            start = time.perf_counter()
            pruned = headcut.prune(clf.path, method, keep=k, data=clf.splits["train"], eval_data=clf.splits["test"],
                                   seed=seed, recover_steps=recover,
                                   data_options={"max_examples": 4000, "batch_size": 8}, **options)
            metric = pruned.report["metric"]
            rows.append({"k": k, "seed": seed, "recipe": recipe, "before": 100 * metric["before"],
                         "after": 100 * metric["after"], "after_pruning": 100 * metric["after_pruning"],
                         "steps": recipe["max_steps"] + recover, "seconds": time.perf_counter() - start})
            log(f"K={k} seed {seed}: {rows[-1]['before']:.2f} -> {rows[-1]['after']:.2f} %")
    return {"rows": rows}


def study_speed(clf: Classifier, args: argparse.Namespace) -> dict[str, Any]:
    blocks = headcut.model_blocks(clf.model)
    r = plan_prune(clf.model, clf.cal, PruneConfig(method="greedy-gnorm", keep=min(KS)), {"step": 1})
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out: dict[str, Any] = {"devices": {}}
    # export slims the module it is given: each K gets its own copy
    models = [clf.model] + [headcut.export(copy.deepcopy(clf.model), trajectory_mask(blocks, r.trajectory, k)).model
                            for k in KS]
    names = ["72"] + [str(k) for k in KS]
    for device in devices:
        log(f"timing {len(models)} models on {device}")
        result = headcut.bench(models, names=names, device=device, batch_size=8, seq_len=128, runs=10, warmup=2)
        out["devices"][device] = [{"heads": int(n), "median_ms": row.median_ms, "speedup": row.speedup,
                                   "flop_ratio": row.flop_ratio, "params": row.params}
                                  for n, row in zip(names, result.results, strict=True)]
    return out


STUDIES: dict[str, Callable[[Classifier, argparse.Namespace], dict[str, Any]]] = {
    "oneshot": study_oneshot, "peer": study_peer, "targets": study_targets, "speed": study_speed,
}


def run_studies(names: list[str], rerun: set[str], args: argparse.Namespace) -> None:
    todo = [n for n in names if n in rerun or not (RESULTS / f"{n}.json").is_file()]
    if not todo:
        return
    clf = Classifier.load()
    RESULTS.mkdir(exist_ok=True)
    for name in todo:
        log(f"study {name}")
        start = time.perf_counter()
        result = STUDIES[name](clf, args)
        result = {"study": name, "machine": machine(), "seconds": round(time.perf_counter() - start, 1), **result}
        tmp = RESULTS / f".{name}.json.tmp"
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(RESULTS / f"{name}.json")
        log(f"study {name}: {result['seconds']:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", default=",".join(STUDIES), help="studies to measure (none: only render)")
    ap.add_argument("--rerun", default="", help="studies to measure again although their results exist")
    ap.add_argument("--peer-python", default=None, help="python of the TextPruner environment")
    ap.add_argument("--peer-iters", type=int, default=16, help="TextPruner's n_iters (its best in its README: 16)")
    ap.add_argument("--peer-variants", default="uneven",
                    help="uneven (heads per layer may differ: TextPruner's best) and/or even, comma-separated")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the targets study")
    args = ap.parse_args()
    names = [] if args.studies == "none" else [s for s in args.studies.split(",") if s]
    wrong = [s for s in names if s not in STUDIES]
    if wrong:
        ap.error(f"unknown study {wrong[0]!r}; studies: {', '.join(STUDIES)}")
    run_studies(names, {s for s in args.rerun.split(",") if s}, args)
    from page_render import render

    print(render(RESULTS, DOCS))


if __name__ == "__main__":
    main()
