"""Where a command writes: its result on stdout (or stderr under ``--json -``), notes and progress on stderr,
JSON to a file atomically or to stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.console import Console

from ..files.atomic import OutputFile
from ..options import option
from ..progress import Reporter

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Reporting:
    """How every command reports, declared once (:mod:`headcut.options`): ``--json`` and ``--quiet`` (the
    command line's own: the Python API returns its results and takes a progress reporter)."""

    json_out: str | None = option(
        None,
        flag="--json",
        metavar="PATH",
        panel="Options",
        help="Also write the result as JSON to PATH ('-' for stdout alone; the tables then go to stderr).",
    )
    quiet: bool = option(False, short="-q", panel="Options", help="No progress bars or lines, no notes.")


def _console(stream: Any) -> Console:
    # outside a terminal (a pipe, a file, CI) rich would wrap at 80 columns: give tables the room they need
    console = Console(file=stream, soft_wrap=False)
    if not console.is_terminal:
        console = Console(file=stream, width=max(console.width, 160))
    return console


class Out:
    """Where one command invocation writes: ``result`` (stdout, or stderr under ``--json -``), ``log``
    (stderr) and ``progress`` (a :class:`headcut.progress.Reporter` on stderr, silent with ``--quiet``)."""

    def __init__(self, json_out: str | None = None, quiet: bool = False) -> None:
        self.json_out = json_out
        self.quiet = quiet
        self.result = _console(sys.stderr if json_out == "-" else sys.stdout)
        self.log = _console(sys.stderr)
        self.progress = Reporter("quiet" if quiet else "auto")

    def show(self, renderable: Any) -> None:
        """A result table or line."""
        if isinstance(renderable, str):
            self.result.print(renderable, highlight=False, markup=False, soft_wrap=True)
        else:
            self.result.print(renderable)

    def note(self, message: str) -> None:
        if not self.quiet:
            self.log.print(f"note: {message}", highlight=False, markup=False, soft_wrap=True)

    def notes(self, messages: list[str]) -> None:
        for message in dict.fromkeys(messages):
            self.note(message)

    def json(self, data: Any) -> None:
        write_json(data, self.json_out)

    def close(self) -> None:
        self.progress.close()


def write_json(data: Any, dest: str | None) -> None:
    """Write ``data`` as JSON to a file (atomically), or to stdout for ``-``; a special file (``/dev/stdout``,
    ``/dev/fd/N``, a device, a named pipe) is written through, never replaced (see :class:`OutputFile`)."""
    if dest is None:
        return
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        OutputFile(dest, "--json").write_text(text)
