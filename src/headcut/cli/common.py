"""Shared CLI plumbing: one-line errors with exit code 2, JSON output, the rich console."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
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

F = TypeVar("F", bound=Callable[..., Any])

#: the terminal: tables and progress go to stderr, so ``--json -`` keeps stdout clean
console = Console(stderr=True)


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
    raise typer.Exit(2)


def handle_errors(fn: F) -> F:
    """Turn HeadcutError (bad user input) into a one-line error and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HeadcutError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            Console(stderr=True).print("[red]interrupted[/]: nothing was written")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


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
    """Write ``data`` as JSON to a file, or to stdout for ``-``."""
    if dest is None:
        return
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(dest).write_text(text)


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
