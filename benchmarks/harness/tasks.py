"""The page's tasks (the README's classifier and three others) and one headcut run on them: :class:`Task` loads a
classifier with its calibration and held-out data and measures a mask's or a pruned model's accuracy; the
studies of :mod:`benchmarks.harness.measure` run on it, and so do ``benchmarks/studies/small_data.py`` and
``refit_choice.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import headcut
import headcut_offline as offline
from benchmarks.classifier import (
    convention_classifier,
    debate_classifier,
    minilm_classifier,
    review_plot_classifier,
)
from benchmarks.harness.store import log
from headcut.data import Calibration, DataConfig, load_calibration, load_tokenizer
from headcut.model.masks import HeadMask
from headcut.progress import Reporter
from headcut.pruning import Metric, eval_metric

#: heads kept (of 72) in the accuracy curves
KS = [60, 48, 36, 24, 16, 12, 8, 6, 4]
#: the training-free methods, in the plot's legend order
ONESHOT = [
    "greedy-gnorm",
    "michel",
    "gradient",
    "gnorm",
    "confidence",
    "entropy",
    "value-l1",
    "fluctuation",
    "magnitude",
    "random",
]
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
        return cls(
            name=name,
            path=path,
            splits=splits,
            model=model,
            cal=cal,
            dev=dev,
            metric=eval_metric(model, dev),
            progress=Reporter("lines"),
        )

    def accuracy(self, mask: HeadMask | None = None) -> float:
        return 100.0 * self.metric.measure(mask or HeadMask.full(headcut.model_blocks(self.model)))

    def held_out(self, model: torch.nn.Module) -> float:
        """The accuracy (%) of another (pruned, trained) model on the held-out snippets, every head on."""
        return 100.0 * eval_metric(model, self.dev).measure(HeadMask.full(headcut.model_blocks(model)))

    def mask_of_layers(self, rows: list[list[int]]) -> HeadMask:
        """A mask from a (layers x heads) 0/1 table, layer i being the model's i-th block."""
        blocks = headcut.model_blocks(self.model)
        return HeadMask(
            {b.name: [h for h, keep in enumerate(row) if keep] for b, row in zip(blocks, rows, strict=True)}
        )

    def prune(self, k: int, method: str, seed: int = 0, save_to: Path | None = None, **options: Any) -> dict[str, Any]:
        """One ``headcut.prune`` run on the training snippets (the CLI's path): accuracies, steps and time;
        ``save_to``: also save the pruned model there."""
        start = time.perf_counter()
        pruned = headcut.prune(
            self.path,
            method,
            keep=k,
            data=self.splits["train"],
            eval_data=self.splits["test"],
            seed=seed,
            data_options=TRAIN_OPTIONS,
            progress=self.progress,
            **options,
        )
        if save_to is not None:
            pruned.save(save_to, force=True)
        metric = pruned.report["metric"]
        row = {
            "k": k,
            "method": method,
            "seed": seed,
            "options": options,
            "before": 100 * metric["before"],
            "after": 100 * metric["after"],
            "seconds": time.perf_counter() - start,
        }
        if "after_pruning" in metric:
            row["after_pruning"] = 100 * metric["after_pruning"]
        row["heads_after"] = pruned.report["heads"]["after"]
        row["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"  # headcut's "auto"
        training = pruned.report.get("training") or {}
        row["train_steps"] = training.get("steps", 0)
        row["recover_steps"] = options.get("recover_steps", 0)
        for key in ("lottery", "auber"):
            if pruned.report.get(key):
                row[key] = report_summary(key, pruned.report[key])
        return row


def report_summary(key: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The parts of a lottery/AUBER report the page shows."""
    if key == "lottery":
        control = entry.get("control") or {}
        converge = {k: v for k, v in (entry.get("converge") or {}).items() if k != "history"}  # per step: too long
        return {
            "iterations": len(entry.get("iterations", [])),
            "converge": converge,
            "control_metric": control.get("metric"),
            "control_steps": control.get("steps"),
        }
    return {"reward_metric": entry.get("reward_metric")}


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
