"""Progress of long steps, on stderr: rich bars on a terminal, plain lines in a log, or nothing.

Library functions take a :class:`Reporter` (``progress=``) and report through it; by default they
report nothing. The command line makes one per command:

* **bars** (stderr is a terminal): transient rich bars with the elapsed time and an ETA;
* **lines** (CI, ``| tee log``, a file): a task that runs longer than ``every`` seconds (default 30;
  environment ``HEADCUT_PROGRESS_EVERY``) prints a plain line every ``every`` seconds, even inside a
  single long operation (a heartbeat thread repeats the last state), and one when it ends; a shorter
  task prints nothing (so a quick failure stays a one-line error)::

      fine-tuning: 120/500 steps (24%), loss 0.4123, accuracy 0.8010, 1:02 elapsed, ETA 3:17

* **quiet** (``--quiet``): nothing.

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

#: seconds between two plain progress lines of a running task
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
        self.printed = self.start
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
        """The task's state as one plain line."""
        parts = []
        if self.total:
            pct = 100.0 * self.done / self.total
            parts.append(f"{self.done}/{self.total} {self.unit} ({pct:.0f}%)".replace("  ", " "))
        elif self.done:
            parts.append(f"{self.done} {self.unit}".strip())
        parts += [f"{k} {_value(v)}" for k, v in self.fields.items()]
        elapsed = time.monotonic() - self.start
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
    lines), ``bars``, ``lines`` or ``quiet``. ``stream``: default stderr. ``every``: seconds between
    lines (default ``HEADCUT_PROGRESS_EVERY`` or 30)."""

    def __init__(self, mode: str = "auto", stream: TextIO | None = None, every: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bars" if _is_terminal(self.stream) else "lines"
        if mode not in ("bars", "lines", "quiet"):
            raise ValueError(f"unknown progress mode {mode!r}")
        self.mode = mode
        self.every = every if every is not None else float(os.environ.get("HEADCUT_PROGRESS_EVERY", DEFAULT_EVERY))
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
        """A task without a count (loading a model, reading data): a line when it starts, the heartbeat
        while it runs, and one when it ends."""
        task = self.task(description)
        with task:
            yield task

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
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), console=Console(file=self.stream), transient=True,
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
        task.printed = time.monotonic()
        task.lines += 1

    def _updated(self, task: Task) -> None:
        if self.mode == "quiet":
            return
        with self._lock:
            if self.mode == "bars":
                if task._bar is not None:
                    self._bars().update(task._bar, completed=task.done, total=task.total or None,
                                        description=self._label(task))
            elif time.monotonic() - task.printed >= self.every:
                self._emit(task)

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
        if self._thread is not None:
            return

        def beat() -> None:
            while not self._stop.wait(min(1.0, self.every)):
                with self._lock:
                    due = [t for t in self._tasks if time.monotonic() - t.printed >= self.every]
                    for t in due[-1:]:
                        self._emit(t)

        self._thread = threading.Thread(target=beat, name="headcut-progress", daemon=True)
        self._thread.start()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


#: a reporter that reports nothing (the library's default)
def quiet() -> Reporter:
    return Reporter("quiet")
