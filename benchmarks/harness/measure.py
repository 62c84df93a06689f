"""The measurements of the page's studies on the classifiers (run by ``python -m benchmarks.harness``): one
``study_*`` function per study, on the tasks of :mod:`benchmarks.harness.tasks`, each writing its rows to its
:class:`~benchmarks.harness.store.Store`; the decoders' studies are in :mod:`benchmarks.harness.measure_kv`.

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
import copy
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

import headcut
from benchmarks.harness.levers import LEVERS
from benchmarks.harness.measure_kv import (
    study_gemma3,
    study_kv_methods,
    study_peer_llm,
    study_smollm,
)
from benchmarks.harness.store import BENCHMARKS, RESULTS, Store, log
from benchmarks.harness.tasks import (
    KS,
    LEARNED,
    LEARNED_KS,
    ONESHOT,
    RANDOM_SEEDS,
    TASKS,
    TRAIN_OPTIONS,
    Task,
    recipe,
    report_summary,
    ticker,
    trajectory_mask,
)
from headcut.config import PruneConfig
from headcut.pruning import plan_prune

STUDY_SCRIPTS = BENCHMARKS / "studies"
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
        r = plan_prune(
            task.model,
            None if method == "random" else task.cal,
            PruneConfig(method=method, keep=k, seed=seed),
            options,
            progress=ticker(f"{method} K={k}"),
        )
        secs.append(time.perf_counter() - start)
        accs.append(task.accuracy(r.mask))
    row = {"accuracy": statistics.mean(accs), "seconds": statistics.mean(secs)}
    if len(accs) > 1:
        row |= {"stdev": statistics.stdev(accs), "seeds": len(accs)}
    return row


def _trajectory(task: Task, store: Store, name: str, method: str, options: dict[str, Any], ks: list[int] = KS) -> None:
    """One iterative run of ``method`` down to the smallest K, its accuracy read off the trajectory at every K
    of ``ks`` and of :func:`peer_kept` (rows named ``name``; the run's wall time on the smallest K's row)."""
    if any(r["method"] == name for r in store.data["rows"]):
        return
    blocks = headcut.model_blocks(task.model)
    start = time.perf_counter()
    r = plan_prune(task.model, task.cal, PruneConfig(method=method, keep=min(ks)), options, progress=ticker(name))
    seconds = time.perf_counter() - start
    for k in sorted({*ks, *peer_kept(task)}, reverse=True):
        store.row(
            {"method": name, "k": k},
            lambda k=k: {
                "accuracy": task.accuracy(trajectory_mask(blocks, r.trajectory, k)),
                "seconds": seconds if k == min(ks) else None,
            },
        )
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
        raise SystemExit(
            "the peer study needs --peer-python (a Python with textpruner and transformers 4: "
            "see benchmarks/studies/peer_textpruner.py)"
        )
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
            cmd = [
                args.peer_python,
                str(STUDY_SCRIPTS / "peer_textpruner.py"),
                str(task.path),
                str(batches),
                "--ks",
                ",".join(map(str, ks)),
                "--n-iters",
                str(args.peer_iters),
                "--out",
                str(result),
            ]
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
    pruned = headcut.prune(
        task.path,
        method,
        keep=keep,
        data=task.splits["train"],
        seed=seed,
        data_options=TRAIN_OPTIONS,
        progress=task.progress,
    )
    recovery = dict(recovery)
    teacher = recovery.pop("teacher", task.path)
    data, extra = task.splits["train"], {}
    with tempfile.TemporaryDirectory() as tmp:
        if recovery.pop("fixed", False):
            data, dev = _fixed_split(task, Path(tmp))
            if "patience" in recovery:
                extra["eval_data"] = dev
        tuned = headcut.finetune(
            pruned.model,
            data,
            teacher=teacher,
            checkpoint_every=None,
            seed=seed,
            data_options=TRAIN_OPTIONS,
            progress=task.progress,
            **extra,
            **recovery,
        )
    after = task.held_out(tuned.model)
    row = {
        "k": keep,
        "method": method,
        "seed": seed,
        "options": {**options, "finetune": recovery},
        "before": task.accuracy(),
        "after": after,
        "seconds": time.perf_counter() - start,
        "train_steps": 0,
        "recover_steps": recovery["max_steps"],
    }
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
    row = store.row(
        {"method": method, "k": k}, lambda: task.prune(k, method, max_steps=500, alpha=0.0, save_to=save_to)
    )
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
        result = headcut.bench(
            [task.path, *kept.values()], names=["72", *kept], batch_size=8, seq_len=128, runs=30, warmup=3
        )
        return {
            "models": [
                {
                    "name": r.name,
                    "median_ms": r.median_ms,
                    "speedup": r.speedup,
                    "flop_ratio": r.flop_ratio,
                    "heads": r.heads,
                }
                for r in result.results
            ]
        }

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
        pruned = headcut.prune(
            task.path,
            "lottery",
            keep=16,
            data=data,
            eval_data=dev,
            control="reinit",
            alpha=0.0,
            data_options=TRAIN_OPTIONS,
            progress=task.progress,
        )
    row = {
        "k": 16,
        "method": "lottery",
        "options": {"control": "reinit", "alpha": 0.0, "eval_data": "dev-500"},
        "before": task.accuracy(),
        "after": task.held_out(pruned.model),
        "seconds": time.perf_counter() - start,
        "heads_after": pruned.report["heads"]["after"],
        "train_steps": (pruned.report.get("training") or {}).get("steps", 0),
        "recover_steps": 0,
        "lottery": report_summary("lottery", pruned.report["lottery"]),
    }
    row["lottery"]["dev_metric"], row["lottery"]["dev_control_metric"] = (
        pruned.report["metric"]["after"],
        row["lottery"]["control_metric"],
    )
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
            rounds.append(
                headcut.bench(
                    models, names=names, device=device, batch_size=8, seq_len=128, runs=SPEED_RUNS, warmup=3
                ).results
            )
        rows = []
        for j, n in enumerate(names):
            medians = [r[j].median_ms for r in rounds]
            rows.append(
                {
                    "heads": int(n),
                    "median_ms": statistics.median(medians),
                    "round_ms": medians,
                    "flop_ratio": rounds[0][j].flop_ratio,
                    "params": rounds[0][j].params,
                }
            )
        for row in rows:
            row["speedup"] = rows[0]["median_ms"] / row["median_ms"]
        out[device] = rows
    store.data.update(devices=out, rounds=SPEED_ROUNDS, runs=SPEED_RUNS)


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
    "oneshot": study_oneshot,
    "peer": study_peer,
    "recipe": study_recipe,
    "levers": study_levers,
    "learned": study_learned,
    "voita": study_voita,
    "iterative": study_iterative,
    "claims": study_claims,
    "speed": study_speed,
    "smollm": study_smollm,
    "gemma3": study_gemma3,
    "convention": study_convention,
    "review_plot": study_review_plot,
    "debates": study_debates,
    "refit": study_refit,
    "kv_methods": study_kv_methods,
    "peer_llm": study_peer_llm,
}


def run_studies(
    names: list[str], rerun: set[str], args: argparse.Namespace, extend: frozenset[str] = frozenset()
) -> None:
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
