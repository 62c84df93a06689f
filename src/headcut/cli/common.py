"""Shared CLI plumbing: one-line errors with exit code 2, JSON output, the rich console."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..errors import HeadcutError
from ..io import TASKS
from ..outputs import OutputDir, OutputFile, check_paths

F = TypeVar("F", bound=Callable[..., Any])

#: the terminal: tables and progress go to stderr, so ``--json -`` keeps stdout clean
console = Console(stderr=True)


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
    raise typer.Exit(2)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, or SIGTERM/SIGHUP turned into the same clean stop (``signum``: the signal's number)."""

    def __init__(self, signum: int = signal.SIGINT, hint: str | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
        self.hint = hint


def stop_on_signals() -> None:
    """Make SIGTERM (a cancelled CI job, a pre-empted node) and SIGHUP (a closed terminal) stop a run the
    way Ctrl-C does: temporary outputs removed, resume checkpoints kept."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handler)


def handle_errors(fn: F) -> F:
    """Turn HeadcutError (bad user input) into a one-line error and exit code 2; an interruption
    (Ctrl-C, SIGTERM, SIGHUP) into a one-line note and exit code 128 + the signal's number."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HeadcutError as exc:
            fail(str(exc))
        except KeyboardInterrupt as exc:
            signum = int(getattr(exc, "signum", signal.SIGINT))
            name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
            hint = getattr(exc, "hint", None) or "nothing was written"
            Console(stderr=True, soft_wrap=True).print(f"interrupted ({name}): {hint}", highlight=False, markup=False)
            raise typer.Exit(128 + signum) from None

    return wrapper  # type: ignore[return-value]


def local_input(value: str | os.PathLike[str] | None) -> Path | None:
    """The local path of an input given as a path or a Hub/datasets name (None when not local)."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return p if p.exists() or p.is_symlink() else None


def plan_outputs(
    *,
    reads: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
    out: Path | None = None,
    force: bool = False,
    checkpoint: Path | None = None,
    file_force: Mapping[str, bool] | None = None,
) -> tuple[OutputDir | None, dict[str, OutputFile]]:
    """Check every output of a command before its work starts (see :mod:`headcut.outputs`).

    ``reads``: flag -> input (paths, Hub ids or datasets names; only local ones are checked);
    ``files``: flag -> output file (``-`` and None skipped); ``out``: the output folder;
    ``checkpoint``: a folder the run may remove (its resume checkpoint); ``file_force``: files that
    need ``--force`` to be replaced. Returns the checked output folder and files."""
    file_paths = {flag: Path(p).expanduser() for flag, p in (files or {}).items() if p not in (None, "-")}
    check_paths(
        reads={flag: local_input(v) for flag, v in reads.items()},
        writes=file_paths,
        replaces={"--out": out, "the checkpoint folder": checkpoint},
    )
    target = OutputDir(out, force).check() if out is not None else None
    checked = {
        flag: OutputFile(p, flag, force=force or not (file_force or {}).get(flag, False)).check()
        for flag, p in file_paths.items()
    }
    return target, checked


def batch_progress(description: str, total: int) -> tuple[Progress, Callable[[int, int | None], None]]:
    """A transient progress bar on stderr and a ``(done, total)`` callback that advances it."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    )
    task_id = progress.add_task(description, total=max(total, 1))

    def update(done: int, total_now: int | None) -> None:
        progress.update(task_id, completed=done, total=max(total_now or total, 1))

    return progress, update


def write_json(data: Any, dest: str | None) -> None:
    """Write ``data`` as JSON to a file (atomically), or to stdout for ``-``."""
    if dest is None:
        return
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        OutputFile(dest, "--json").write_text(text)


FORCE_HELP = ("Replace an existing non-empty --out, but only a folder headcut wrote (it holds a headcut report or "
              "record); any other folder is refused, and so is an --out that is, holds or lies inside an input.")
JSON_HELP = "Also write the result as JSON to PATH ('-' for stdout; the table then goes to stderr)."

# options shared by the commands
ModelArg = Annotated[str, typer.Argument(help="Checkpoint folder (or Hugging Face Hub id).", show_default=False)]
JsonOut = Annotated[Optional[str], typer.Option("--json", help=JSON_HELP, metavar="PATH")]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", help="Allow pickle (.bin) weights; they can run code.")]
TrustRemote = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow checkpoints that ship their own model code.")
]
Task = Annotated[
    Optional[str],
    typer.Option("--task", help=f"Load with this task head ({', '.join(TASKS)}); default: the checkpoint's own."),
]
