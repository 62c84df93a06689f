"""Progress of long steps, on stderr: rich bars on a terminal, plain lines in a log, or nothing.

Library functions take a :class:`Reporter` (``progress=``) and report through it; by default they
report nothing. The command line makes one per command:

* **bars** (stderr is a terminal): transient rich bars with the elapsed time and an ETA;
* **lines** (CI, ``| tee log``, a file): while any task runs, the reporter prints a plain line
  whenever it has printed nothing for ``every`` seconds (default 30; environment
  ``HEADCUT_PROGRESS_EVERY``), even inside a single long operation (a heartbeat thread prints the state
  of the newest running task), and a task that printed a line prints one more when it ends. The clock
  is the reporter's, not each task's: a run of tasks that are each shorter than ``every`` (loading,
  reading data, evaluating, timing, one after the other) still gets a line every ``every`` seconds.
  A reporter that finishes its work within ``every`` seconds prints nothing (so a quick failure stays a
  one-line error)::

      fine-tuning: 120/500 steps (24%), loss 0.4123, accuracy 0.8010, 1:02 elapsed, ETA 3:17
      still loading model/ (45 s)

* **quiet** (``--quiet``): nothing.

Slow work deep inside a call reports through a callback its caller passes (fine-tuning's evaluations:
``eval_progress``; timing: :meth:`Reporter.stages`); the 30 s clock belongs to the whole reporter, so
a run of short steps keeps the cadence too.

No line carries ANSI codes unless stderr is a terminal and ``NO_COLOR`` is unset (rich decides).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: the most seconds without a plain progress line while a task runs (lines mode)
DEFAULT_EVERY = 30.0


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _value(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


class Task:
    """One task of a :class:`Reporter`: ``update(done, total, **fields)`` after each unit of work;
    ``fields`` (loss, metric, ...) are shown beside the count."""

    def __init__(self, reporter: Reporter, description: str, total: int | None, unit: str) -> None:
        self.reporter = reporter
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0
        self.fields: dict[str, Any] = {}
        self.start = time.monotonic()
        self.lines = 0
        self.finished = False
        self._bar: Any = None

    def update(self, done: int | None = None, total: int | None = None, **fields: Any) -> None:
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        self.reporter._updated(self)
        if self.total is not None and self.done >= self.total:
            self.finish()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.reporter._finished(self)

    def line(self) -> str:
        """The task's state as one plain line (``still <description> (N s)`` for a running step: a
        task without a count or fields)."""
        elapsed = time.monotonic() - self.start
        if not self.finished and not self.total and not self.done and not self.fields:
            return f"still {self.description} ({max(0, int(elapsed))} s)"
        parts = []
        if self.total:
            pct = 100.0 * self.done / self.total
            parts.append(f"{self.done}/{self.total} {self.unit} ({pct:.0f}%)".replace("  ", " "))
        elif self.done:
            parts.append(f"{self.done} {self.unit}".strip())
        parts += [f"{k} {_value(v)}" for k, v in self.fields.items()]
        parts.append(f"{_clock(elapsed)} elapsed")
        if self.finished:
            parts[-1] = f"done in {_clock(elapsed)}"
        elif self.total and self.done:
            parts.append(f"ETA {_clock(elapsed * (self.total - self.done) / self.done)}")
        return f"{self.description}: {', '.join(parts)}"

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.finish()
        else:
            self.reporter._dropped(self)


class Reporter:
    """Where progress goes (see the module's doc). ``mode``: ``auto`` (bars on a terminal, else
    lines), ``bars``, ``lines`` or ``quiet``. ``stream``: default stderr. ``every``: the most seconds
    without a line while a task runs (default ``HEADCUT_PROGRESS_EVERY`` or 30). ``heartbeat``: whether a
    thread calls :meth:`beat` (about every second) in lines mode; without it only task updates and
    explicit :meth:`beat` calls print (tests drive a fake clock that way)."""

    def __init__(
        self, mode: str = "auto", stream: TextIO | None = None, every: float | None = None, heartbeat: bool = True
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bars" if _is_terminal(self.stream) else "lines"
        if mode not in ("bars", "lines", "quiet"):
            raise ValueError(f"unknown progress mode {mode!r}")
        self.mode = mode
        self.every = every if every is not None else float(os.environ.get("HEADCUT_PROGRESS_EVERY", DEFAULT_EVERY))
        #: when this reporter last printed a line (or was made): the heartbeat's clock
        self.printed = time.monotonic()
        self._beat = max(0.01, min(1.0, self.every))  # the heartbeat thread's period
        self._use_thread = heartbeat
        self._lock = threading.Lock()
        self._tasks: list[Task] = []
        self._progress: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the public part --------------------------------------------------------------------------
    def task(self, description: str, total: int | None = None, unit: str = "") -> Task:
        """Start a task."""
        task = Task(self, description, total, unit)
        if self.mode == "quiet":
            return task
        with self._lock:
            self._tasks.append(task)
            if self.mode == "bars":
                self._bars().start()
                task._bar = self._bars().add_task(self._label(task), total=total or None)
            else:
                self._heartbeat()
        return task

    @contextmanager
    def step(self, description: str) -> Iterator[Task]:
        """A task without a count (``loading X``, ``reading data``): in lines mode a ``still loading X
        (N s)`` line whenever the reporter has been silent for ``every`` seconds while it runs, and
        ``loading X: done in m:ss`` when it ends if it printed one."""
        task = self.task(description)
        with task:
            yield task

    def beat(self) -> None:
        """One heartbeat (lines mode): print the newest running task's state if nothing was printed for
        ``every`` seconds (and that task has run for one beat, so its first update is in). The heartbeat
        thread calls it every ``min(1, every)`` seconds."""
        if self.mode != "lines":
            return
        with self._lock:
            now = time.monotonic()
            if self._tasks and now - self.printed >= self.every and now - self._tasks[-1].start >= self._beat:
                self._emit(self._tasks[-1])

    def stages(self, prefix: str = "") -> Stages:
        """``progress(stage, done, total)`` callbacks (timing's) as tasks of this reporter: see :class:`Stages`."""
        return Stages(self, prefix)

    def close(self) -> None:
        self._stop.set()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the rest ---------------------------------------------------------------------------------
    def _bars(self) -> Any:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
        return self._progress

    @staticmethod
    def _label(task: Task) -> str:
        from rich.markup import escape

        extra = ", ".join(f"{k} {_value(v)}" for k, v in task.fields.items())
        return escape(f"{task.description} ({extra})" if extra else task.description)

    def _emit(self, task: Task) -> None:
        self.stream.write(task.line() + "\n")
        self.stream.flush()
        self.printed = time.monotonic()
        task.lines += 1

    def _updated(self, task: Task) -> None:
        if self.mode == "quiet":
            return
        with self._lock:
            if self.mode == "bars":
                if task._bar is not None:
                    self._bars().update(
                        task._bar, completed=task.done, total=task.total or None, description=self._label(task)
                    )
            elif time.monotonic() - max(self.printed, task.start) >= self.every:
                self._emit(task)  # a task's own updates: once it has run for the period

    def _finished(self, task: Task) -> None:
        if self.mode == "quiet":
            return
        with self._lock:
            if task in self._tasks:
                self._tasks.remove(task)
            if self.mode == "bars":
                if task._bar is not None:
                    self._bars().remove_task(task._bar)
            elif task.lines:
                self._emit(task)

    def _dropped(self, task: Task) -> None:
        with self._lock:
            if task in self._tasks:
                self._tasks.remove(task)
            if self.mode == "bars" and task._bar is not None:
                self._bars().remove_task(task._bar)
        task.finished = True

    def _heartbeat(self) -> None:
        if self._thread is not None or not self._use_thread:
            return

        def beats() -> None:
            while not self._stop.wait(self._beat):
                self.beat()

        self._thread = threading.Thread(target=beats, name="headcut-progress", daemon=True)
        self._thread.start()


class Stages:
    """A ``progress(stage, done, total)`` callback as tasks of ``reporter``: a task ``prefix + stage`` starts
    at a stage's first call (again after it finished) and finishes when ``done`` reaches ``total``;
    :meth:`close` (or leaving the ``with`` block) drops the ones left unfinished, after an error."""

    def __init__(self, reporter: Reporter, prefix: str = "") -> None:
        self.reporter, self.prefix = reporter, prefix
        self.tasks: dict[str, Task] = {}

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        task = self.tasks.get(stage)
        if task is None or task.finished:
            task = self.tasks[stage] = self.reporter.task(self.prefix + stage, total)
        task.update(done, total)

    def close(self) -> None:
        for task in self.tasks.values():
            if not task.finished:
                self.reporter._dropped(task)

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


#: a reporter that reports nothing (the library's default)
def quiet() -> Reporter:
    return Reporter("quiet")
