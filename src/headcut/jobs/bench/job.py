"""``headcut.bench``: time models on synthetic inputs (``headcut bench``; the timing is
:mod:`headcut.jobs.bench.run`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ...arguments.kinds import values
from ...arguments.table import checked
from ...config import BenchConfig
from ...errors import HeadcutError
from ...model.checks import check_checkpoint
from ...outputs.modelcard import update_speed
from ...progress import Reporter, Task, quiet
from ..base import ModelLike
from .results import device_name
from .run import timed


@dataclass
class Benchmark:
    """What :func:`bench` measured: one :class:`headcut.jobs.bench.results.BenchResult` per model (speed-up and FLOP
    ratio relative to the first) and the report ``headcut bench --json`` writes."""

    results: list[Any]
    config: BenchConfig
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    cards: list[Path] = field(default_factory=list)


@checked("bench")
def bench(
    models: Sequence[ModelLike],
    *,
    config: BenchConfig | None = None,
    names: Sequence[str] | None = None,
    task: str | None = None,
    progress: Reporter | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    update_cards: bool = False,
    on_warning: Callable[[str], None] | None = None,
    **settings: Any,
) -> Benchmark:
    """Time ``models`` on synthetic inputs (``headcut bench``): latency, throughput, FLOPs, memory, and
    generation speed and KV-cache size for decoders. ``settings``: fields of :class:`BenchConfig`
    (``device``, ``batch_size``, ``seq_len``, ``runs``, ``runtime="torch,onnxruntime"`` for a row per
    model and runtime, ``interleave=False`` to time one model after the other, ...), or pass ``config``.
    By default the models are timed interleaved, in rounds (all of them in memory at once), and every
    result after the first carries the interval of its per-round speed-ups and a ``within_noise`` verdict
    (see :mod:`headcut.jobs.bench.run`). ``update_cards``: write the measured speed-up into the model
    card (README.md) of every headcut output after the first model (``headcut bench --update-card``).
    ``on_warning``: called with each doubtful setting's warning as soon as the settings are checked, before any
    model is read (they are also the report's ``warnings``)."""
    # torch is imported with the timing, not at ``import headcut``
    from .results import report_json

    with values():
        if config is None:
            allowed = {f.name for f in fields(BenchConfig)}
            wrong = sorted(set(settings) - allowed)
            if wrong:
                raise HeadcutError(f"unknown bench setting {wrong[0]!r}; settings: {', '.join(sorted(allowed))}")
            config = BenchConfig(**settings)
        elif settings:
            raise HeadcutError("give config= or settings, not both")
        notes = config.validate()
    if on_warning is not None:
        for warning in notes:
            on_warning(warning)
    for m in models:  # refuse a missing folder before spending minutes on the others
        if isinstance(m, (str, os.PathLike)):
            check_checkpoint(m, allow_pickle)
    progress = progress or quiet()
    tasks: dict[tuple[int, str], Task] = {}

    def on_progress(index: int, name: str, stage: str, done: int, total: int) -> None:
        task = tasks.get((index, stage))
        if task is None:  # index -1: the interleaved rounds of all the models
            where = f"[{index + 1}/{len(models)}] {name}" if index >= 0 else name
            task = tasks[(index, stage)] = progress.task(f"{where}: {stage}", total, "")
        task.update(done, total)

    with contextlib.ExitStack() as stack:

        def finish_all() -> None:
            for t in tasks.values():
                t.finish()

        stack.callback(finish_all)
        results = timed(
            list(models),
            config,
            names=names,
            task=task,
            allow_pickle=allow_pickle,
            trust_remote_code=trust_remote_code,
            progress=on_progress,
        )
    warnings = list(notes)
    report = report_json(results, config, warnings)
    for r in results:
        notes += [f"{r.name}: {n}" for n in r.notes]
    if len(results) > 1 and not config.interleave:
        notes.append(
            "timed back to back (--no-interleave): one model after the other, so a change in the "
            "machine's load between them shows as a speed difference; the speed-ups are not comparable "
            "under load"
        )
    cards: list[Path] = []
    if update_cards:
        threads = f", {results[0].threads} threads" if results and config.device == "cpu" else ""
        cards, skipped = update_speed(results, list(models), f"{device_name(config.device)} ({config.device}{threads})")
        notes += skipped
    return Benchmark(results=results, config=config, report=report, notes=notes, cards=cards)
