"""lm-evaluation-harness on the model headcut loaded (``headcut eval --lm-eval``; the optional extra
``headcut[lm-eval]``, lm-eval 0.4.x).

* **The model**: the harness's ``HFLM`` wraps the module and tokenizer headcut loaded (a slimmed checkpoint runs
  as headcut loads it, without remote code), on the module's device, as a causal LM (or seq2seq LM) backend.
* **Tasks**: names, groups, tags or glob patterns the harness's ``TaskManager`` knows, among its own tasks and
  those of an include folder of custom task YAML files; an unknown name is refused before anything runs, with
  the closest names. Every task is built (its dataset read) before the first forward, so a dataset that cannot
  be loaded (no Hub) is a one-line error, not a failure minutes in.
* **Run**: ``simple_evaluate`` with the harness's own defaults (its seeds, few-shot counts and bootstrap
  iterations), so the numbers match its command line; ``num_fewshot``, ``limit`` and the batch size as given.
  The harness seeds Python's, NumPy's and torch's global generators: their states are restored afterwards, and
  the model's train/eval mode.
* **Results** (:class:`HarnessResult`): per task (and group), every metric it reports with its standard error
  (``None`` where the harness computes none), the examples it scored, its few-shot count and whether higher
  is better.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import io
import logging
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data.files import quiet_datasets
from ..data.streams import root_message
from ..errors import HeadcutError, label
from ..extras import imported

__all__ = ["HarnessResult", "PreparedTasks", "check_installed", "check_model", "prepare_tasks", "run_harness"]

#: the harness series headcut is written and tested against
SUPPORTED = "0.4"
INSTALL = "pip install 'headcut[lm-eval]'"


@dataclass
class HarnessResult:
    """What the harness measured: ``tasks`` (name -> ``alias``, ``group``, ``metrics`` {name: {``value``,
    ``stderr``}}, ``samples``, ``num_fewshot``, ``higher_is_better``), the harness ``version``, the
    ``settings`` it ran with, ``seconds`` (wall time of the run, tasks built included) and ``notes``."""

    tasks: dict[str, dict[str, Any]]
    version: str
    settings: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: the harness's modules headcut uses, imported by :func:`check_installed`
HARNESS_MODULES = ("lm_eval", "lm_eval.tasks", "lm_eval.evaluator", "lm_eval.models.huggingface")


def check_installed() -> None:
    """Refuse ``--lm-eval`` when the harness is not installed, or is installed but fails on import (any
    exception: a broken install, a dependency of another version), before any model is loaded."""
    missing = f"{label('lm_eval')} needs lm-evaluation-harness, which is not installed: {INSTALL}"
    for name in HARNESS_MODULES:
        imported(name, label("lm_eval"), INSTALL, missing)


def check_model(task: str) -> None:
    """Refuse a model the harness cannot run (its data task ``task`` is not ``causal-lm`` or ``seq2seq``)."""
    if task not in ("causal-lm", "seq2seq"):
        raise HeadcutError(f"{label('lm_eval')} runs a causal LM or a seq2seq LM; this model has a {task} head")


def _version() -> str:
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _root(exc: BaseException) -> str:

    return root_message(exc)


@contextlib.contextmanager
def _global_seeds_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's global generator states, restored on exit (the harness seeds them)."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def _silent(quiet: bool) -> Iterator[None]:
    """The harness's prints kept off stdout (the result's, and ``--json -``'s), on stderr with its progress bars;
    both swallowed when ``quiet``."""
    if not quiet:
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        yield


@contextlib.contextmanager
def _no_git_describe() -> Iterator[None]:
    """The harness runs ``git describe`` for its own report's ``git_hash`` (headcut's report does not keep it),
    which prints "fatal: not a git repository" outside one: skipped while it runs."""
    import lm_eval.evaluator as evaluator

    original = getattr(evaluator, "get_git_commit_hash", None)
    if original is None:
        yield
        return
    evaluator.get_git_commit_hash = lambda: None
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


def _task_manager(include: str | None) -> Any:
    from lm_eval.tasks import TaskManager

    try:
        return TaskManager(include_path=str(Path(include).expanduser()) if include else None)
    except Exception as exc:  # a YAML file the harness cannot parse, an unreadable folder
        where = f" (with {label('lm_eval_include')} {include})" if include else ""
        raise HeadcutError(f"lm-eval cannot index its tasks{where}: {_root(exc)}") from None


def _expand(names: Sequence[str], manager: Any, include: str | None) -> list[str]:
    """``names`` with glob patterns expanded; an unknown name is refused with the closest known ones."""
    known = set(manager.all_tasks)
    out: list[str] = []
    for name in names:
        if any(ch in name for ch in "*?["):
            matched = [m for m in manager.match_tasks([name]) if m not in out]
            if not matched:
                raise HeadcutError(f"{label('lm_eval')} pattern {name!r} matches no lm-eval task")
            out += matched
        elif name in known or (name.endswith((".yaml", ".yml")) and Path(name).expanduser().is_file()):
            out.append(name)
        else:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            where = f" nor in {include}" if include else f" (custom tasks: {label('lm_eval_include')} DIR)"
            raise HeadcutError(f"unknown lm-eval task {name!r}: not among the harness's tasks{where}{hint}")
    return out


def _build(names: Sequence[str], manager: Any) -> list[Any]:
    """The Task (or Group) objects of ``names``, their datasets read now: a dataset that cannot be loaded is a
    one-line error before any forward."""
    built: list[Any] = []
    for name in names:
        try:
            loaded = manager.load([name])
        except Exception as exc:  # datasets (no Hub, no cache), a bad YAML, a missing data file
            raise HeadcutError(f"lm-eval cannot load task {name!r}: {_root(exc)}") from None
        if name in loaded["groups"]:
            built.append(loaded["groups"][name])
        else:  # a task, or a tag: its tasks
            built.extend(loaded["tasks"].values())
    return built


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _rows(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The harness's results as headcut's per-task entries (groups marked)."""
    shots = results.get("n-shot", {})
    samples = results.get("n-samples", {})
    higher = results.get("higher_is_better", {})
    groups = set(results.get("groups", {}))
    out: dict[str, dict[str, Any]] = {}
    for name, row in {**results.get("results", {}), **results.get("groups", {})}.items():
        metrics: dict[str, dict[str, float | None]] = {}
        for key, value in row.items():
            metric, comma, kept_by = key.partition(",")
            if not comma or metric.endswith("_stderr"):
                continue
            shown = metric if kept_by == "none" else f"{metric},{kept_by}"
            if _number(value) is None and value is not None:
                continue
            metrics[shown] = {"value": _number(value), "stderr": _number(row.get(f"{metric}_stderr,{kept_by}"))}
        count = samples.get(name, {})
        out[name] = {
            "alias": str(row.get("alias", name)).strip(" -"),
            "group": name in groups,
            "metrics": metrics,
            "samples": count.get("effective") if isinstance(count, dict) else None,
            "num_fewshot": shots.get(name),
            "higher_is_better": dict(higher.get(name, {})),
        }
    return out


@dataclass
class PreparedTasks:
    """The harness's tasks, built (their datasets read) before any model work: ``names`` as given, ``expanded``
    (patterns spelled out), ``built`` (its Task and Group objects) and the ``manager`` that found them."""

    names: list[str]
    expanded: list[str]
    built: list[Any]
    manager: Any
    include: str | None


def prepare_tasks(names: Sequence[str], include: str | None = None, quiet: bool = False) -> PreparedTasks:
    """Find and build the harness's tasks ``names`` (see the module's doc): an unknown name, or a dataset that
    cannot be read, is a one-line error here, before the model runs."""
    check_installed()

    with _silent(quiet), _global_seeds_kept(), quiet_datasets():
        manager = _task_manager(include)
        expanded = _expand(names, manager, include)
        built = _build(expanded, manager)
    return PreparedTasks(list(names), expanded, built, manager, include)


def run_harness(
    model: nn.Module,
    tokenizer: Any,
    task: str,
    tasks: PreparedTasks,
    *,
    num_fewshot: int | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    quiet: bool = False,
) -> HarnessResult:
    """Run the prepared harness ``tasks`` on ``model`` (its data task ``task``: ``causal-lm`` or ``seq2seq``) with
    ``tokenizer`` (see the module's doc). ``quiet``: no harness progress bars."""
    check_model(task)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    version = _version()
    notes = []
    if not version.startswith(SUPPORTED + "."):
        notes.append(f"lm-eval {version}: headcut is tested with lm-eval {SUPPORTED}.x")
    start = time.perf_counter()
    was_training = model.training
    settings = {
        "tasks": tasks.expanded,
        "include": tasks.include,
        "num_fewshot": num_fewshot,
        "limit": limit,
        "batch_size": batch_size,
        "device": str(next(model.parameters()).device),
    }
    try:
        with _silent(quiet):
            hf_log = logging.getLogger("lm_eval.models.huggingface")
            level = hf_log.level
            hf_log.setLevel(logging.ERROR)  # "pretrained is not a str": what headcut means to do
            try:
                lm = HFLM(
                    pretrained=model,
                    tokenizer=tokenizer,
                    backend="causal" if task == "causal-lm" else "seq2seq",
                    batch_size=batch_size,
                )
            finally:
                hf_log.setLevel(level)
            with _global_seeds_kept(), _no_git_describe():
                out = simple_evaluate(
                    model=lm,
                    tasks=tasks.built,
                    num_fewshot=num_fewshot,
                    limit=limit,
                    task_manager=tasks.manager,
                    log_samples=False,
                )
    finally:
        model.train(was_training)
    if not out:
        raise HeadcutError("lm-eval returned no results (a process other than rank 0?)")
    if limit is not None:
        notes.append(f"--lm-eval-limit {limit}: at most {limit} examples per task, not the full sets the papers report")
    return HarnessResult(
        tasks=_rows(out), version=version, settings=settings, seconds=time.perf_counter() - start, notes=notes
    )
