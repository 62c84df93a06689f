"""The measurements of the page's studies (run by ``python -m benchmarks.harness``): the tasks, headcut's runs on
them, and one ``study_*`` function per study, each writing its rows to its :class:`~benchmarks.harness.store.Store`.

Studies (``rt``: the README's classifier, all-MiniLM-L6-v2 fine-tuned on 4,000 Rotten Tomatoes snippets, 72
heads, evaluated on the 2,808 held-out snippets, ``benchmarks/classifier.py``; ``convention``: the second real
task, the same encoder fine-tuned to tell the party of a 2012 convention speech's sentence, 1,481 held-out
sentences of speeches it never saw; ``review-plot`` and ``debates``: the small-data tasks, :data:`TASKS`):

* ``oneshot``: the training-free methods (one-shot scorers, Michel et al., Greedy-Gnorm; random over 5 seeds)
  on ``rt`` at every K of ``KS`` (and at the heads TextPruner kept where those are not in ``KS``), scored on
  512 training snippets; accuracy with the heads gated off (identical to the slimmed model:
  tests/test_surgery.py) and the prune wall time.
* ``peer``: TextPruner's iterative pruning (``benchmarks/studies/peer_textpruner.py``, in its own virtual environment
  with transformers 4: ``--peer-python``) on the same 512 calibration snippets and evaluation batches, at the K
  it can reach (multiples of the 6 layers), with its best setting in its README (16 iterations, uneven heads
  per layer); its masks are also evaluated by headcut (both numbers are on the page).
* ``recipe``: the README main job's recipe (:func:`recipe`) at every K on ``rt`` (seed 0), and at 16 and 8
  heads over 3 seeds: the targets.
* ``levers``: at 16 heads, every lever of issue 16 measured alone (distillation in gate training, recovery,
  its learning rate and weight, hidden-state matching, schedules, early stopping).
* ``learned``: the learned-gate methods with the papers' loss (no distillation, no recovery) for one epoch of
  the 4,000 snippets (500 steps of 8) at ``LEARNED_KS``, and the 16-head PASS and PASSCONC models timed.
* ``voita``: Voita et al. (its lambda search: up to 5 training runs per K) at ``LEARNED_KS``.
* ``iterative``: Michel et al.'s iterative pruning (``ITERATIVE``: two heads at a time with the paper's scores
  and with TextPruner's way of scoring; one head at a time with TextPruner's), read off its trajectory at every
  K of ``KS`` and at the heads TextPruner kept where those are not in ``KS``; and on TextPruner's schedule
  (``--rounds`` = the peer's ``--peer-iters``, scored its way), one run at each K TextPruner kept.
* ``claims``: the lottery ticket against its re-initialised control at 16 heads (its convergence early-stopped
  on 500 training snippets it does not train on; both measured on the held-out snippets), and AUBER with its
  defaults.
* ``speed``: models slimmed to K heads timed by ``headcut bench`` on this machine's CPU (batch 8 x 128
  tokens; ``SPEED_ROUNDS`` rounds over all the models), speed-up beside the FLOP ratio; CUDA too when the run
  has a GPU.
* ``smollm``: SmolLM2-135M (30 layers x 3 KV groups) with KV groups removed (one-shot gradient scores on the
  first half of hamlet.txt): perplexity on the second half, KV-cache bytes, and forward and generation speed of
  every row's model timed together, interleaved in rounds (``KV_ROUNDS``), after the rows are measured.
* ``gemma3``: the same for Gemma 3 270M (18 layers x 1 KV head of 4 query heads: each KV head removed empties a
  layer's attention), on fewer 256-token blocks (its 262,144-token vocabulary makes each one slow on a CPU).
* ``convention``: the second task: the training-free methods and the recipe at every K, the learned-gate
  methods (``voita`` too) at ``LEARNED_KS`` as in ``learned``.
* ``review_plot`` and ``debates``: the small-data tasks (issue 33: 900 and 786 training rows, three classes each,
  ``benchmarks/classifier.py``): every method (training-free, the recipe, the learned gates and ``voita``) at
  ``SMALL_KS`` (16, 8 and 4 heads), the learned ones for 500 steps of 8 as in ``learned``; the page gives each test
  set's standard error.
* ``peer_llm``: the LLM peer (``benchmarks/studies/peer_llm.py``): Torch-Pruning 1.6.1 on SmolLM2's attention, in its own
  virtual environment with transformers 4.48.3 (``--llm-peer-python``; made by peer_llm.py when absent), beside
  headcut's rows (``peer_llm.HEADCUT_VARIANTS``): one-shot gradient and fluctuation, layer-wise fluctuation with and
  without FLAP's bias compensation at the smollm study's KV budgets, iterative gradient and the recipe (one-shot
  gradient and distilled recovery on the calibration blocks) at ``PEER_LLM_COSTLY_REMOVED``: perplexity in windows
  of 128 and 2,048 tokens, prune wall time, peak memory and how each saved model reloads, every cut in its own
  process.
* ``refit``: on every task, the one-shot gradient cut followed by ``--refit`` (the output projections refitted
  by least squares to the unpruned model's outputs on the training rows, nothing trained) at ``REFIT_KS``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

import headcut
import headcut_offline as offline
from benchmarks.classifier import (
    convention_classifier,
    debate_classifier,
    minilm_classifier,
    review_plot_classifier,
)
from benchmarks.harness.levers import LEVERS
from benchmarks.harness.store import BENCHMARKS, RESULTS, Store, log, machine
from headcut.config import PruneConfig
from headcut.data import Calibration, DataConfig, load_calibration, load_tokenizer
from headcut.model.masks import HeadMask
from headcut.progress import Reporter
from headcut.pruning import Metric, eval_metric, plan_prune

STUDY_SCRIPTS = BENCHMARKS / "studies"
#: heads kept (of 72) in the accuracy curves
KS = [60, 48, 36, 24, 16, 12, 8, 6, 4]
#: the training-free methods, in the plot's legend order
ONESHOT = ["greedy-gnorm", "michel", "gradient", "gnorm", "confidence", "entropy", "value-l1", "fluctuation", "magnitude",
           "random"]
#: the learned-gate methods and the heads they are run at (one epoch each, about 5 minutes a run on 2 CPU
#: cores: the target's 16 heads and the papers' high-sparsity end); voita (up to 5 training runs per K for
#: its lambda search) is a study of its own
LEARNED = ["pass", "passconc", "dsp", "ste", "lag"]
LEARNED_KS = [16, 4]
RANDOM_SEEDS = 5
CAL_EXAMPLES = 512
#: training data of the training runs: 4,000 snippets in batches of 8 (500 steps = one epoch)
TRAIN_OPTIONS = {"max_examples": 4000, "batch_size": 8}


#: the page's tasks: name -> (the classifier's folder, its train/test splits), each built on first use
TASKS: dict[str, Callable[[], tuple[Path, dict[str, Path]]]] = {
    "rt": lambda: (minilm_classifier(), offline.rotten_tomatoes_splits()),
    "convention": lambda: (convention_classifier(), offline.convention_splits()),
    "review-plot": lambda: (review_plot_classifier(), offline.review_plot_splits()),
    "debates": lambda: (debate_classifier(), offline.debate_splits()),
}


def recipe(k: int) -> dict[str, Any]:
    """The gradient recipe for K heads (``headcut.prune`` arguments; the README main job's until issue 33, whose
    default recipe's rows come from the command line, ``small_data.py --reports``): one-shot gradient scores,
    then distilled recovery fine-tuning for one epoch of the 4,000 snippets (two below 12 heads)."""
    return {"method": "gradient", "recover_steps": 500 if k >= 12 else 1000}


def ticker(what: str, every: float = 30.0) -> Callable[[str, int, int | None], None]:
    """``plan_prune``'s ``progress(phase, done, total)`` as a log line at most every ``every`` seconds (a
    greedy-gnorm run takes most of an hour without another line)."""
    last = time.monotonic()

    def report(phase: str, done: int, total: int | None) -> None:
        nonlocal last
        if time.monotonic() - last >= every:
            last = time.monotonic()
            log(f"{what}: {phase} {done}/{total if total is not None else '?'}")

    return report


@dataclass
class Task:
    """A classifier, its data, and the metric every study reports (accuracy in % on the held-out split)."""

    name: str
    path: Path
    splits: dict[str, Path]
    model: torch.nn.Module
    cal: Calibration
    dev: Calibration
    metric: Metric
    #: the training runs' progress: a plain line every 30 s on stderr
    progress: Reporter

    @classmethod
    def load(cls, name: str) -> Task:
        path, splits = TASKS[name]()
        model = headcut.load(path)
        tok = load_tokenizer(path)
        cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=CAL_EXAMPLES))
        dev = load_calibration(model, tok, DataConfig(path=str(splits["test"]), batch_size=64))
        return cls(name=name, path=path, splits=splits, model=model, cal=cal, dev=dev,
                   metric=eval_metric(model, dev), progress=Reporter("lines"))

    def accuracy(self, mask: HeadMask | None = None) -> float:
        return 100.0 * self.metric.measure(mask or HeadMask.full(headcut.model_blocks(self.model)))

    def held_out(self, model: torch.nn.Module) -> float:
        """The accuracy (%) of another (pruned, trained) model on the held-out snippets, every head on."""
        return 100.0 * eval_metric(model, self.dev).measure(HeadMask.full(headcut.model_blocks(model)))

    def mask_of_layers(self, rows: list[list[int]]) -> HeadMask:
        """A mask from a (layers x heads) 0/1 table, layer i being the model's i-th block."""
        blocks = headcut.model_blocks(self.model)
        return HeadMask({b.name: [h for h, keep in enumerate(row) if keep] for b, row in zip(blocks, rows, strict=True)})

    def prune(self, k: int, method: str, seed: int = 0, save_to: Path | None = None, **options: Any) -> dict[str, Any]:
        """One ``headcut.prune`` run on the training snippets (the CLI's path): accuracies, steps and time;
        ``save_to``: also save the pruned model there."""
        start = time.perf_counter()
        pruned = headcut.prune(self.path, method, keep=k, data=self.splits["train"], eval_data=self.splits["test"],
                               seed=seed, data_options=TRAIN_OPTIONS, progress=self.progress, **options)
        if save_to is not None:
            pruned.save(save_to, force=True)
        metric = pruned.report["metric"]
        row = {"k": k, "method": method, "seed": seed, "options": options, "before": 100 * metric["before"],
               "after": 100 * metric["after"], "seconds": time.perf_counter() - start}
        if "after_pruning" in metric:
            row["after_pruning"] = 100 * metric["after_pruning"]
        row["heads_after"] = pruned.report["heads"]["after"]
        row["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"  # headcut's "auto"
        training = pruned.report.get("training") or {}
        row["train_steps"] = training.get("steps", 0)
        row["recover_steps"] = options.get("recover_steps", 0)
        for key in ("lottery", "auber"):
            if pruned.report.get(key):
                row[key] = _summary(key, pruned.report[key])
        return row


def _summary(key: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The parts of a lottery/AUBER report the page shows."""
    if key == "lottery":
        control = entry.get("control") or {}
        converge = {k: v for k, v in (entry.get("converge") or {}).items() if k != "history"}  # per step: too long
        return {"iterations": len(entry.get("iterations", [])), "converge": converge,
                "control_metric": control.get("metric"), "control_steps": control.get("steps")}
    return {"reward_metric": entry.get("reward_metric")}


# ---- studies ------------------------------------------------------------------------------------------

def peer_ks(task: Task) -> list[int]:
    """Every number of heads the peer study's TextPruner runs kept on ``task`` (largest first)."""
    path = RESULTS / "peer.json"
    if task.name != "rt" or not path.is_file():
        return []
    runs = json.loads(path.read_text()).get("runs", {}).values()
    return sorted({r["kept"] for run in runs for r in run["ks"].values()}, reverse=True)


def peer_kept(task: Task) -> list[int]:
    """The heads TextPruner kept (:func:`peer_ks`) where that is not a K of ``KS`` (its last iteration can keep
    more than asked: 13 for 12), so headcut is also measured at exactly those K."""
    return [k for k in peer_ks(task) if k not in KS]


def _measured(task: Task, method: str, k: int, options: dict[str, Any] | None = None, seeds: int = 1) -> dict[str, Any]:
    """One ``plan_prune`` run of a training-free ``method`` to ``k`` heads per seed: the held-out accuracy and the
    run's seconds (means over the seeds; their spread when more than one)."""
    accs, secs = [], []
    for seed in range(seeds):
        start = time.perf_counter()
        r = plan_prune(task.model, None if method == "random" else task.cal,
                       PruneConfig(method=method, keep=k, seed=seed), options, progress=ticker(f"{method} K={k}"))
        secs.append(time.perf_counter() - start)
        accs.append(task.accuracy(r.mask))
    row = {"accuracy": statistics.mean(accs), "seconds": statistics.mean(secs)}
    if len(accs) > 1:
        row |= {"stdev": statistics.stdev(accs), "seeds": len(accs)}
    return row


def trajectory_mask(blocks: list[Any], trajectory: list[Any], keep: int) -> HeadMask:
    """The mask once a trajectory's removals bring the model down to ``keep`` heads."""
    kept = {b.name: set(range(b.heads)) for b in blocks}
    for point in trajectory:
        if point.heads < keep:
            break
        for item in point.removed:
            block, head = item.rsplit(":", 1)
            kept[block].discard(int(head))
    assert sum(len(v) for v in kept.values()) == keep
    return HeadMask({k: sorted(v) for k, v in kept.items()})


def _trajectory(task: Task, store: Store, name: str, method: str, options: dict[str, Any],
                ks: list[int] = KS) -> None:
    """One iterative run of ``method`` down to the smallest K, its accuracy read off the trajectory at every K
    of ``ks`` and of :func:`peer_kept` (rows named ``name``; the run's wall time on the smallest K's row)."""
    if any(r["method"] == name for r in store.data["rows"]):
        return
    blocks = headcut.model_blocks(task.model)
    start = time.perf_counter()
    r = plan_prune(task.model, task.cal, PruneConfig(method=method, keep=min(ks)), options, progress=ticker(name))
    seconds = time.perf_counter() - start
    for k in sorted({*ks, *peer_kept(task)}, reverse=True):
        store.row({"method": name, "k": k}, lambda k=k: {
            "accuracy": task.accuracy(trajectory_mask(blocks, r.trajectory, k)),
            "seconds": seconds if k == min(ks) else None})
    log(f"{name}: done ({seconds:.0f} s to {min(ks)} heads)")


def _oneshot(task: Task, store: Store, methods: Iterable[str], ks: list[int] = KS) -> None:
    for method in methods:
        if method == "greedy-gnorm":  # one run to the smallest K passes through every larger K
            _trajectory(task, store, method, method, {"step": 1}, ks)
            continue
        for k in sorted({*ks, *peer_kept(task)}, reverse=True):
            def measure(method: str = method, k: int = k) -> dict[str, Any]:
                row = _measured(task, method, k, seeds=RANDOM_SEEDS if method == "random" else 1)
                log(f"{method} K={k}: {row['accuracy']:.2f} %")
                return row

            store.row({"method": method, "k": k}, measure)
    store.data.update(unpruned=task.accuracy(), calibration=task.cal.examples, evaluation=task.dev.examples)


def study_oneshot(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    _oneshot(tasks("rt"), store, ONESHOT)


def _write_batches(task: Task, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for prefix, cal in (("cal", task.cal), ("eval", task.dev)):
        for i, batch in enumerate(cal.batches):
            for name, value in batch.items():
                tensors[f"{prefix}.{i}.{name}"] = value.contiguous()
    save_file(tensors, str(path))


def study_peer(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    if not args.peer_python:
        raise SystemExit("the peer study needs --peer-python (a Python with textpruner and transformers 4: "
                         "see benchmarks/studies/peer_textpruner.py)")
    task = tasks("rt")
    ks = [k for k in KS if k % len(headcut.model_blocks(task.model)) == 0]
    runs = store.data.setdefault("runs", {})
    with tempfile.TemporaryDirectory() as tmp:
        batches = Path(tmp) / "batches.safetensors"
        _write_batches(task, batches)
        for variant in args.peer_variants.split(","):
            if variant in runs:
                continue
            log(f"TextPruner iterative ({args.peer_iters} iterations), {variant} heads per layer, K in {ks}")
            result = Path(tmp) / f"peer-{variant}.json"
            cmd = [args.peer_python, str(STUDY_SCRIPTS / "peer_textpruner.py"), str(task.path), str(batches),
                   "--ks", ",".join(map(str, ks)), "--n-iters", str(args.peer_iters), "--out", str(result)]
            cmd += ["--even"] if variant == "even" else []
            subprocess.run(cmd, check=True)
            peer = json.loads(result.read_text())
            for row in peer["ks"].values():
                row["accuracy_textpruner"] = 100.0 * row.pop("accuracy")
                row["accuracy"] = task.accuracy(task.mask_of_layers(row["mask"]))
            peer["unpruned_accuracy"] = 100.0 * peer["unpruned_accuracy"]
            runs[variant] = peer
            store.save()
    store.data["unpruned"] = task.accuracy()


def study_recipe(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    plan = [(k, 0) for k in KS] + [(k, seed) for k in (16, 8) for seed in range(1, args.seeds)]
    for k, seed in plan:
        options = recipe(k)
        method = options.pop("method")
        row = store.row({"k": k, "seed": seed}, lambda: task.prune(k, method, seed=seed, **options))
        log(f"recipe K={k} seed {seed}: {row['before']:.2f} -> {row['after']:.2f} %")


def _fixed_split(task: Task, folder: Path) -> tuple[Path, Path]:
    """4,000 training snippets and 500 others as a dev set (for early stopping; never the held-out split)."""
    import csv

    with task.splits["train"].open(newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    paths = folder / "train-4000.csv", folder / "dev-500.csv"
    for path, part in zip(paths, (rows[:4000], rows[4000:4500]), strict=True):
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([header, *part])
    return paths


def _lever(task: Task, spec: dict[str, Any], recovery: dict[str, Any] | None) -> dict[str, Any]:
    options = dict(spec)
    method, keep, seed = options.pop("method"), options.pop("keep", 16), options.pop("seed", 0)
    if recovery is None:
        return task.prune(keep, method, seed=seed, **options)
    start = time.perf_counter()
    pruned = headcut.prune(task.path, method, keep=keep, data=task.splits["train"], seed=seed,
                           data_options=TRAIN_OPTIONS, progress=task.progress)
    recovery = dict(recovery)
    teacher = recovery.pop("teacher", task.path)
    data, extra = task.splits["train"], {}
    with tempfile.TemporaryDirectory() as tmp:
        if recovery.pop("fixed", False):
            data, dev = _fixed_split(task, Path(tmp))
            if "patience" in recovery:
                extra["eval_data"] = dev
        tuned = headcut.finetune(pruned.model, data, teacher=teacher, checkpoint_every=None, seed=seed,
                                 data_options=TRAIN_OPTIONS, progress=task.progress, **extra, **recovery)
    after = task.held_out(tuned.model)
    row = {"k": keep, "method": method, "seed": seed, "options": {**options, "finetune": recovery},
           "before": task.accuracy(),
           "after": after, "seconds": time.perf_counter() - start, "train_steps": 0,
           "recover_steps": recovery["max_steps"]}
    if tuned.result.early_stopping is not None:
        row["early_stopping"] = tuned.result.early_stopping
    return row


def study_levers(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    for name, (spec, recovery) in LEVERS.items():
        row = store.row({"lever": name}, lambda: _lever(task, spec, recovery))
        log(f"lever {name!r}: {row['after']:.2f} %")


#: where the learned study keeps the 16-head PASS and PASSCONC models for their speed comparison
MODELS = Path(tempfile.gettempdir()) / "headcut-page-models"


def _learned(task: Task, store: Store, method: str, k: int, save_to: Path | None = None) -> None:
    """One learned-gate run as the page measures them all: 500 steps of batch 8, the papers' loss."""
    row = store.row({"method": method, "k": k},
                    lambda: task.prune(k, method, max_steps=500, alpha=0.0, save_to=save_to))
    log(f"{task.name} {method} K={k}: {row['after']:.2f} %")


def study_learned(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    kept = {m: MODELS / f"{m}-16" for m in ("pass", "passconc")}
    for method in LEARNED:
        for k in LEARNED_KS:
            _learned(task, store, method, k, kept.get(method) if k == 16 else None)

    def speed() -> dict[str, Any]:  # PASS §3.3: the concentrator's emptied layers make inference faster
        for method, folder in kept.items():
            if not (folder / "model.safetensors").is_file():  # a resumed study: measure it again
                task.prune(16, method, max_steps=500, alpha=0.0, save_to=folder)
        result = headcut.bench([task.path, *kept.values()], names=["72", *kept], batch_size=8, seq_len=128,
                               runs=30, warmup=3)
        return {"models": [{"name": r.name, "median_ms": r.median_ms, "speedup": r.speedup, "flop_ratio": r.flop_ratio,
                            "heads": r.heads} for r in result.results]}

    store.row({"bench": "pass-vs-passconc-16"}, speed)


def study_voita(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    for k in LEARNED_KS:
        _learned(task, store, "voita", k)


#: iterative training-free variants beside the peer: name -> michel options (one run down to the smallest K
#: with ``--step`` 2 passes through every K, read off its trajectory): the paper's scores, and the
#: per-batch absolute value without layer normalisation (TextPruner's way of scoring)
ITERATIVE = {
    "michel --step 2": {"step": 2},
    "michel --step 2 --abs-per batch --normalize none": {"step": 2, "abs_per": "batch", "normalize": "none"},
    "michel --step 1 --abs-per batch --normalize none": {"step": 1, "abs_per": "batch", "normalize": "none"},
}


def study_iterative(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    for name, options in ITERATIVE.items():
        _trajectory(task, store, name, "michel", options)
    # TextPruner's schedule too: each K its own run, the heads to remove split over the peer's n_iters rounds
    # (larger first), scored its way; one run per K, as the steps depend on K
    name = f"michel --rounds {args.peer_iters} --abs-per batch --normalize none"
    options = {"rounds": args.peer_iters, "abs_per": "batch", "normalize": "none"}
    for k in peer_ks(task):
        row = store.row({"method": name, "k": k}, lambda k=k: _measured(task, "michel", k, options))
        log(f"{name} K={k}: {row['accuracy']:.2f} %")


def _lottery(task: Task) -> dict[str, Any]:
    """The lottery ticket at 16 heads with its re-initialised control. The lottery stops its convergence
    early on ``--eval-data`` (as the paper does on its dev set), so it gets 500 training snippets the
    4,000 it trains on exclude (never the held-out split); the ticket and the control are then both
    measured on the held-out snippets (``control_metric``; the report's own figures are on the dev set)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data, dev = _fixed_split(task, Path(tmp))
        pruned = headcut.prune(task.path, "lottery", keep=16, data=data, eval_data=dev, control="reinit",
                               alpha=0.0, data_options=TRAIN_OPTIONS, progress=task.progress)
    row = {"k": 16, "method": "lottery", "options": {"control": "reinit", "alpha": 0.0, "eval_data": "dev-500"},
           "before": task.accuracy(),
           "after": task.held_out(pruned.model),
           "seconds": time.perf_counter() - start, "heads_after": pruned.report["heads"]["after"],
           "train_steps": (pruned.report.get("training") or {}).get("steps", 0), "recover_steps": 0,
           "lottery": _summary("lottery", pruned.report["lottery"])}
    row["lottery"]["dev_metric"], row["lottery"]["dev_control_metric"] = (
        pruned.report["metric"]["after"], row["lottery"]["control_metric"])
    row["lottery"]["control_metric"] = task.held_out(pruned.result.details.control_model) / 100.0
    return row


def study_claims(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    row = store.row({"run": "lottery"}, lambda: _lottery(task))
    log(f"lottery: {row['after']:.2f} %, control {row['lottery']['control_metric']}")
    row = store.row({"run": "auber"}, lambda: task.prune(None, "auber", alpha=0.0))  # type: ignore[arg-type]
    log(f"auber: {row['after']:.2f} % with {row['heads_after']} heads")


#: the speed study's rounds over all the models and timed forwards per model and round
SPEED_ROUNDS, SPEED_RUNS = 5, 20


def study_speed(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    task = tasks("rt")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    # export slims the module it is given: each K gets its own copy, with the one-shot ranking's top K
    models = [task.model]
    for k in KS:
        mask = plan_prune(task.model, task.cal, PruneConfig(method="gradient", keep=k)).mask
        models.append(headcut.export(copy.deepcopy(task.model), mask).model)
    names = ["72"] + [str(k) for k in KS]
    out: dict[str, Any] = {}
    for device in devices:
        # SPEED_ROUNDS rounds over all the models, each of SPEED_RUNS timed forwards: a burst of load on the
        # machine then touches one round of every model, not all the runs of one
        rounds = []
        for i in range(SPEED_ROUNDS):
            log(f"timing {len(models)} models on {device}, round {i + 1} of {SPEED_ROUNDS}")
            rounds.append(headcut.bench(models, names=names, device=device, batch_size=8, seq_len=128,
                                        runs=SPEED_RUNS, warmup=3).results)
        rows = []
        for j, n in enumerate(names):
            medians = [r[j].median_ms for r in rounds]
            rows.append({"heads": int(n), "median_ms": statistics.median(medians), "round_ms": medians,
                         "flop_ratio": rounds[0][j].flop_ratio, "params": rounds[0][j].params})
        for row in rows:
            row["speedup"] = rows[0]["median_ms"] / row["median_ms"]
        out[device] = rows
    store.data.update(devices=out, rounds=SPEED_ROUNDS, runs=SPEED_RUNS)


@dataclass(frozen=True)
class KVStudy:
    """A decoder whose whole KV groups are removed (``headcut prune --method gradient --gqa group``): one-shot
    gradient scores on blocks of 256 tokens of the first half of hamlet.txt, perplexity on blocks of the second
    half (``eval_examples`` blocks, the same for every row), KV-cache bytes and generation speed."""

    checkpoint: Callable[[], Path]
    #: KV groups removed, a row each (0: the unpruned model)
    removed: list[int]
    #: blocks of 256 tokens scored (of the first half) and evaluated (of the second half)
    cal_examples: int
    eval_examples: int
    #: blocks per batch (None: headcut's default, 16); neither the scores (absolute values per example) nor the
    #: perplexity (blocks of equal length) depend on it, the memory does (16 x 256 x 262,144 fp32 logits: 4 GiB)
    batch_size: int | None = None


#: the decoders' KV studies. SmolLM2-135M: 30 layers x 3 KV groups of 3 query heads; Gemma 3 270M: 18 layers x 1 KV
#: head of 4 query heads (a group removed empties a layer; 262,144-token vocabulary: fewer blocks)
KV_STUDIES = {
    "smollm": KVStudy(offline.smollm_dir, [0, 6, 12, 18, 30, 45], cal_examples=64, eval_examples=64),
    "gemma3": KVStudy(offline.gemma3_dir, [0, 1, 2, 3, 4, 5, 6], cal_examples=8, eval_examples=16, batch_size=2),
}
#: the KV studies' one interleaved timing of every row's model (``headcut.bench``, batch 1, a 128-token prompt, 32
#: generated tokens): rounds of one forward of each model, then rounds of one generation of each, the order
#: rotated each round; every model in memory at once
KV_ROUNDS, KV_GEN_ROUNDS, KV_WARMUP = 11, 7, 2


def _kv_timing(name: str, src: Path, store: Store, tmp: Path) -> None:
    """Time every row's model in one interleaved ``headcut.bench`` (the unpruned model first: the baseline of the
    paired ratios); each cut is made again from its row's stored mask (``headcut.export``), so the perplexities
    and prune times stay those measured when the row was pruned. Stored per row as ``timing``, with the whole
    timing's settings and the machine's load (``os.getloadavg()`` before and after) as the study's ``timing``."""
    rows = sorted(store.data["rows"], key=lambda r: r["removed"])
    folders: list[Path] = []
    for row in rows:
        if not row["removed"]:
            folders.append(src)
            continue
        folder = tmp / f"{name}-{row['removed']}-timing"
        headcut.export(src, row["mask"], gqa="group").save(folder, force=True)
        folders.append(folder)
    log(f"{name}: timing {len(folders)} models interleaved ({KV_ROUNDS} forward rounds, {KV_GEN_ROUNDS} generation "
        "rounds)")
    load_before = os.getloadavg()
    start = time.perf_counter()
    bench = headcut.bench(folders, names=[str(r["removed"]) for r in rows], batch_size=1, seq_len=128, gen_tokens=32,
                          runs=KV_ROUNDS, gen_runs=KV_GEN_ROUNDS, warmup=KV_WARMUP)
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()
    for row, r in zip(rows, bench.results, strict=True):
        gen = r.generation
        tokens = gen.new_tokens  # batch 1
        row.update(kv_heads=r.kv_heads, heads=r.heads, params=r.params, kv_cache_bytes=gen.kv_cache_bytes)
        for stale in ("tokens_per_s", "forward_ms"):  # the earlier back-to-back times
            row.pop(stale, None)
        row["timing"] = {
            "forward_ms": r.median_ms, "forward_p25_ms": r.p25_ms, "forward_p75_ms": r.p75_ms,
            "forward_runs_ms": r.runs_ms, "speedup": r.speedup, "speedup_p25": r.speedup_p25,
            "speedup_p75": r.speedup_p75, "within_noise": r.within_noise,
            "tokens_per_s": gen.tokens_per_s, "tokens_per_s_p25": 1e3 * tokens / gen.p75_ms,
            "tokens_per_s_p75": 1e3 * tokens / gen.p25_ms, "generation_runs_ms": gen.runs_ms,
            "generation_speedup": gen.speedup, "generation_speedup_p25": gen.speedup_p25,
            "generation_speedup_p75": gen.speedup_p75, "generation_within_noise": gen.within_noise,
            "dtype": r.dtype, "attn_implementation": r.attn_implementation, "threads": r.threads,
        }
    store.data["timing"] = {"interleaved": True, "rounds": KV_ROUNDS, "gen_rounds": KV_GEN_ROUNDS,
                            "warmup": KV_WARMUP, "batch_size": 1, "seq_len": 128, "gen_tokens": 32,
                            "rows": [r["removed"] for r in rows], "load_before": list(load_before),
                            "load_after": list(load_after), "seconds": seconds, "machine": machine()}
    store.save()


def _timed(store: Store) -> bool:
    """Whether the study's rows were all timed in its last interleaved timing."""
    timing = store.data.get("timing") or {}
    rows = sorted(r["removed"] for r in store.data["rows"])
    return timing.get("rows") == rows and all("timing" in r for r in store.data["rows"])


@contextlib.contextmanager
def _kv_data(name: str) -> Iterator[tuple[Path, int, int, dict[str, Any], dict[str, Any], Path, Path, Path]]:
    """A KV study's checkpoint, KV groups, query heads per group, data options (scoring, evaluation) and the two
    halves of hamlet.txt (scored, evaluated), in a temporary folder (also yielded)."""
    spec = KV_STUDIES[name]
    src = spec.checkpoint()
    config = transformers.AutoConfig.from_pretrained(src)
    groups = config.num_hidden_layers * config.num_key_value_heads
    size = config.num_attention_heads // config.num_key_value_heads
    batch = {} if spec.batch_size is None else {"batch_size": spec.batch_size}
    cal_options = {"seq_len": 256, "max_examples": spec.cal_examples, **batch}
    eval_options = {"seq_len": 256, "max_examples": spec.eval_examples, **batch}
    text = offline.hamlet_path().read_text()
    with tempfile.TemporaryDirectory() as tmp:
        half = len(text) // 2
        cal, held = Path(tmp) / "hamlet-a.txt", Path(tmp) / "hamlet-b.txt"
        cal.write_text(text[:half])
        held.write_text(text[half:])
        yield src, groups, size, cal_options, eval_options, cal, held, Path(tmp)


#: variants of a one-shot method in the KV studies: label -> (method, prune keywords, bf16 copy of the checkpoint)
KV_VARIANTS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "fluctuation+bias": ("fluctuation", {"bias_compensation": True}, False),
    "fluctuation layer-wise bf16": ("fluctuation", {"layerwise": True}, True),
    "fluctuation+bias layer-wise bf16": ("fluctuation", {"layerwise": True, "bias_compensation": True}, True),
}


def _bf16_copy(src: Path, tmp: Path) -> Path:
    """``src`` saved in bfloat16 (once per temporary folder): what a layer-wise run reads as stored."""
    folder = tmp / f"{src.name}-bf16"
    if not folder.exists():
        headcut.save(headcut.load(src, dtype=torch.bfloat16), folder, source=src)
    return folder


def _kv_cut(name: str, method: str, removed: int, before: float | None, data: tuple[Any, ...]) -> dict[str, Any]:
    """Perplexity and prune time of one cut of ``removed`` KV groups by ``method`` (0: the unpruned model; a
    :data:`KV_VARIANTS` label: that variant), the saved model reloaded and evaluated on the second half of
    hamlet.txt."""
    spec = KV_STUDIES[name]
    src, groups, size, cal_options, eval_options, cal, held, tmp = data
    chosen, extra, bf16 = KV_VARIANTS.get(method, (method, {}, False))
    if bf16:
        src = _bf16_copy(src, tmp)
    start = time.perf_counter()
    report: dict[str, Any] = {}
    if removed:
        folder = tmp / f"{name}-{method.replace(' ', '-')}-{removed}"
        pruned = headcut.prune(src, chosen, keep=(groups - removed) * size, gqa="group", data=cal,
                               data_options=cal_options, out=folder, **extra)
        mask, report = pruned.mask.to_json(), pruned.report
    else:
        folder, mask = src, None
    after = headcut.evaluate(folder, held, data_options=eval_options).value  # the saved model, reloaded
    seconds = time.perf_counter() - start
    if removed:
        shutil.rmtree(folder)  # a gigabyte each for Gemma 3
    out = {"perplexity_before": before if removed else after, "perplexity": after,
           "prune_seconds": seconds, "cal_examples": spec.cal_examples,
           "eval_examples": spec.eval_examples, "batch_size": spec.batch_size, "mask": mask}
    if "layerwise" in report:
        out["layerwise"] = report["layerwise"]
    if extra:
        out["variant"] = {"method": chosen, **extra, "bf16": bf16}
    return out


def _kv_study(name: str, store: Store) -> None:
    with _kv_data(name) as data:

        def unpruned() -> float:
            return store.row({"removed": 0}, lambda: _kv_cut(name, "gradient", 0, None, data))["perplexity"]

        for removed in KV_STUDIES[name].removed:
            row = store.row({"removed": removed},
                            lambda removed=removed: _kv_cut(name, "gradient", removed, unpruned() if removed else None,
                                                            data))
            log(f"{name}: {removed} KV groups removed, perplexity {row['perplexity']:.2f}")
        if not _timed(store):
            _kv_timing(name, data[0], store, data[-1])


#: the other one-shot methods of the KV studies, at the same budgets (the gradient rows are the KV study's own):
#: study -> methods
KV_METHODS = {"smollm": ["fluctuation", *KV_VARIANTS], "gemma3": ["fluctuation", *KV_VARIANTS]}


def study_kv_methods(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    """:data:`KV_METHODS` on the KV studies' models at their budgets, scored and evaluated as those studies do
    (perplexity of the saved model, reloaded; no timing: the KV study's rows time the cut sizes)."""
    for name, methods in KV_METHODS.items():
        with _kv_data(name) as data:
            for method in methods:
                for removed in [r for r in KV_STUDIES[name].removed if r]:
                    def measure(m: str = method, r: int = removed) -> dict[str, Any]:
                        try:
                            return _kv_cut(name, m, r, None, data)
                        except headcut.HeadcutError as refused:  # e.g. fluctuation where every block is one unit
                            return {"refused": str(refused)}

                    row = store.row({"study": name, "method": method, "removed": removed}, measure)
                    log(f"{name} {method}: {removed} KV groups removed, " + (
                        f"refused: {row['refused']}" if "refused" in row else f"perplexity {row['perplexity']:.2f}"))


#: the KV groups removed by headcut's costly rows in the LLM peer study (iterative: three gradient scorings;
#: recipe: one, then recovery), in the order they are measured (two before the layer-wise rows without bias
#: compensation, the rest after): those the time these 2 CPU cores had allowed are in the results
PEER_LLM_COSTLY_REMOVED = [18, 45, 6, 30, 12]
#: the LLM peer study's cuts, in order: (tool, variant, KV groups removed); ``probe``: what Torch-Pruning's
#: ``BasePruner`` removes at each head ratio (no model measured); ``native``: its LLM example's GQA head pruning at
#: the one ratio it carries out (a third of the query heads, no KV head)
PEER_LLM_CUTS = [("headcut", "unpruned", 0), ("torch-pruning", "unpruned", 0), ("torch-pruning", "probe", 0),
                 ("torch-pruning", "native", 0),
                 *[("torch-pruning", "kv-magnitude", r) for r in KV_STUDIES["smollm"].removed if r],
                 *[("headcut", m, r) for m in ("gradient", "fluctuation") for r in KV_STUDIES["smollm"].removed if r],
                 # issue 34's other headcut rows (``peer_llm.HEADCUT_VARIANTS``), in the order they are measured: the
                 # layer-wise runs with bias compensation (a few minutes a cut) at every budget, the iterative and
                 # recipe runs (ten minutes or more each) at two of PEER_LLM_COSTLY_REMOVED, the layer-wise runs
                 # without it (the one-shot fluctuation cut, read layer by layer) at every budget, then the last
                 *[("headcut", "fluctuation+bias layer-wise", r) for r in KV_STUDIES["smollm"].removed if r],
                 *[("headcut", m, r) for r in PEER_LLM_COSTLY_REMOVED[:2] for m in ("gradient iterative", "recipe")],
                 ("headcut", "unpruned+recovery", 0),  # the recipe's control: its recovery on the uncut model
                 *[("headcut", "fluctuation layer-wise", r) for r in KV_STUDIES["smollm"].removed if r],
                 *[("headcut", m, r) for r in PEER_LLM_COSTLY_REMOVED[2:] for m in ("gradient iterative", "recipe")]]


def study_peer_llm(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    """Torch-Pruning on SmolLM2's attention beside headcut's one-shot KV-group cuts (``benchmarks/studies/peer_llm.py``):
    every cut in its own process, on the smollm study's calibration blocks, measured by one function."""
    from benchmarks.studies import (
        peer_llm,  # a study of its own; it imports torch and headcut, as this module does
    )

    python = args.llm_peer_python or str(peer_llm.ensure_venv())
    with _kv_data("smollm") as data:
        src, groups, size, cal_options, eval_options, cal, held, tmp = data
        tok = load_tokenizer(src)
        cal_blocks = torch.cat([b["input_ids"] for b in
                                load_calibration(headcut.load(src), tok, DataConfig(path=str(cal), **cal_options)).batches])
        ids = tmp / "ids.safetensors"
        held_tokens = peer_llm.write_ids(ids, tok, held.read_text(), cal_blocks)
        store.data.update(eval_tokens=peer_llm.EVAL_TOKENS, held_tokens=held_tokens, windows=peer_llm.WINDOWS,
                          cal_blocks=list(cal_blocks.shape), groups=groups, query_per_group=size,
                          peer_python=python, peer_versions=peer_llm.peer_versions(python))
        for tool, variant, removed in PEER_LLM_CUTS:
            spec = {"tool": tool, "variant": variant, "removed": removed, "src": str(src), "ids": str(ids),
                    "keep": (groups - removed) * size, "cal_text": str(cal), "cal_options": cal_options,
                    "head_ratio": 1 / 3}
            work = tmp / f"{tool}-{variant}-{removed}"

            def measure(spec: dict[str, Any] = spec, work: Path = work, tool: str = tool) -> dict[str, Any]:
                try:
                    return peer_llm.run_cut(python if tool == "torch-pruning" else sys.executable, spec, work)
                finally:
                    shutil.rmtree(work, ignore_errors=True)

            row = store.row({"tool": tool, "variant": variant, "removed": removed}, measure)
            ppl = row.get("perplexity") or {}
            log(f"peer_llm {tool} {variant} {removed}: " + ", ".join(f"ppl@{w} {p:.2f}" for w, p in ppl.items()))


def study_smollm(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    _kv_study("smollm", store)


def study_gemma3(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    _kv_study("gemma3", store)


#: the small-data tasks' heads kept (of 72): the targets' 16 and 8, and the high-sparsity end
SMALL_KS = [16, 8, 4]


def _task_study(task: Task, store: Store, ks: list[int], learned_ks: list[int], args: argparse.Namespace) -> bool:
    """A task's whole curve: the training-free methods at ``ks``, the recipe at ``ks``, the learned-gate methods
    (``voita`` too) at ``learned_ks`` as in ``learned``. ``--methods``/``--ks`` measure only part of it (several
    processes or machines at once, each on a copy of ``results/``); then the study is not complete (False)."""
    chosen = _subset(args.methods, [*ONESHOT, "recipe", *LEARNED, "voita"], "method")
    wanted = _subset(args.ks, [str(k) for k in sorted({*ks, *learned_ks}, reverse=True)], "K")
    ks, learned_ks = [k for k in ks if str(k) in wanted], [k for k in learned_ks if str(k) in wanted]
    store.data.update(unpruned=task.accuracy(), evaluation=task.dev.examples)
    # greedy-gnorm's one run first (it is stored only when done), then the quick methods; michel's and the
    # recipe's runs of a few minutes each last, every one stored as it ends
    first = ["greedy-gnorm"] + [m for m in ONESHOT if m not in ("greedy-gnorm", "michel")]
    _oneshot(task, store, [m for m in first if m in chosen], ks)
    for k in ks if "recipe" in chosen else []:
        options = recipe(k)
        method = options.pop("method")
        row = store.row({"method": "recipe", "k": k}, lambda: task.prune(k, method, **options))
        log(f"{task.name} recipe K={k}: {row['after']:.2f} %")
    _oneshot(task, store, [m for m in ["michel"] if m in chosen], ks)
    for method in [m for m in [*LEARNED, "voita"] if m in chosen]:  # as on the first task
        for k in learned_ks:
            _learned(task, store, method, k)
    return not (args.methods or args.ks)


def _subset(given: str | None, every: list[str], what: str) -> list[str]:
    """The comma-separated ``given`` (None: ``every``), each checked against ``every``."""
    if not given:
        return every
    wrong = [x for x in given.split(",") if x not in every]
    if wrong:
        raise SystemExit(f"unknown {what} {wrong[0]!r}; choose from {', '.join(every)}")
    return given.split(",")


def study_convention(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> bool:
    return _task_study(tasks("convention"), store, KS, LEARNED_KS, args)


def study_review_plot(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> bool:
    return _task_study(tasks("review-plot"), store, SMALL_KS, SMALL_KS, args)


def study_debates(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> bool:
    return _task_study(tasks("debates"), store, SMALL_KS, SMALL_KS, args)


#: the heads kept in the refit study, on every task
REFIT_KS = [16, 8, 4]


def study_refit(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    """On every task: one-shot gradient scores, the cut, then ``--refit`` (least squares, no training) at
    ``REFIT_KS``: the accuracy right after the cut and after the refit."""
    for name in TASKS:
        task = tasks(name)
        store.data.setdefault("unpruned", {})[name] = task.accuracy()
        store.data.setdefault("evaluation", {})[name] = task.dev.examples
        for k in REFIT_KS:
            row = store.row({"task": name, "k": k}, lambda k=k: task.prune(k, "gradient", refit=True))
            log(f"{name} refit K={k}: {row['after_pruning']:.2f} -> {row['after']:.2f} %")


#: every study; one returning False measured only part of itself (``--methods``/``--ks``)
STUDIES: dict[str, Callable[[Callable[[str], Task], Store, argparse.Namespace], bool | None]] = {
    "oneshot": study_oneshot, "peer": study_peer, "recipe": study_recipe, "levers": study_levers,
    "learned": study_learned, "voita": study_voita, "iterative": study_iterative, "claims": study_claims, "speed": study_speed, "smollm": study_smollm,
    "gemma3": study_gemma3, "convention": study_convention, "review_plot": study_review_plot,
    "debates": study_debates, "refit": study_refit, "kv_methods": study_kv_methods, "peer_llm": study_peer_llm,
}


def run_studies(names: list[str], rerun: set[str], args: argparse.Namespace,
                extend: frozenset[str] = frozenset()) -> None:
    loaded: dict[str, Task] = {}

    def tasks(name: str) -> Task:
        if name not in loaded:
            loaded[name] = Task.load(name)
        return loaded[name]

    for name in names:
        store = Store(name, name in rerun)
        if store.complete and name not in extend:
            continue
        log(f"study {name}")
        partial = STUDIES[name](tasks, store, args) is False
        store.save(complete=not partial)
        log(f"study {name}: {store.data['seconds']:.0f} s")
