"""How a command ends when it cannot go on: one-line errors (exit 2), interruptions (exit 128 + the signal),
the warnings and library logs held until it ends, and the output lock of a training run."""

from __future__ import annotations

import functools
import logging
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import HeadcutError
from ..files.atomic import OutputDir
from ..files.space import file_error
from ..formatting import visible
from ..interrupts import Interrupted
from ..options import cli_name
from .output import Out

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2 (control characters in it, from a file name or a file's text,
    shown escaped: :func:`headcut.formatting.visible`)."""
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(visible(message))}", highlight=False, markup=True
    )
    raise typer.Exit(2)


#: seconds a process of a multi-process run that stops with the others waits for the main process to print the
#: line they share (:class:`headcut.errors.SharedError`) before it exits
SHARED_GRACE_S = 2.0


def stop_on_signals(stop: bool = True) -> None:
    """Make SIGTERM (a cancelled CI job, a pre-empted node) and SIGHUP (a closed terminal) stop a run the
    way Ctrl-C does: temporary outputs removed, resume checkpoints kept. ``stop=False``: their default action
    again (once a command has ended: a signal then ends the exiting process, with no exception raised into the
    interpreter's shutdown). A signal the caller ignores (``nohup`` ignores SIGHUP; a shell's background job,
    SIGINT) stays ignored, as Python leaves an ignored SIGINT: closing the terminal of a ``nohup headcut ...`` run
    must not stop it."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            number = getattr(signal, name)
            if signal.getsignal(number) == signal.SIG_IGN:
                continue
            signal.signal(number, handler if stop else signal.SIG_DFL)


#: the loggers whose records a command holds (besides the root logger, which the others propagate to)
HELD_LOGGERS = ("transformers", "datasets", "huggingface_hub", "torch", "accelerate", "fsspec", "filelock")


class _Held(logging.Handler):
    """Keeps the log records it is given (see :func:`held_diagnostics`)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def held_diagnostics() -> Iterator[None]:
    """Hold the Python warnings and library log records a command raises until it ends.

    A command that is refused (a :class:`HeadcutError`) or interrupted drops them, so its refusal is the
    one line it prints; a command that finishes shows them on stderr after its work, through the
    handlers and filters they would have met."""
    held = _Held()
    loggers = [logging.getLogger(name) for name in ("", *HELD_LOGGERS)]
    saved = [(lg, list(lg.handlers), lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = [held]
        lg.propagate = False
    ok = True
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    except (HeadcutError, KeyboardInterrupt):
        ok = False
        raise
    finally:
        for lg, handlers, propagate in saved:
            lg.handlers = handlers
            lg.propagate = propagate
        if ok:
            for w in caught:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
            for record in held.records:
                logger = logging.getLogger(record.name)
                if logger.isEnabledFor(record.levelno):
                    logger.handle(record)


def flag_namer() -> Callable[[str], str]:
    """How the running command names a Python keyword in a message: by the flag or argument that parses into
    it (``keep`` -> ``--keep``, ``lam`` -> ``--lambda``, ``model`` -> ``MODEL``)."""
    from typer.main import get_current_context  # typer's own click, not the installed one

    ctx = get_current_context(silent=True)
    names: dict[str, str] = {}
    if ctx is not None:
        for param in ctx.command.get_params(ctx):
            if getattr(param, "param_type_name", "") == "argument":
                names[param.name] = param.metavar or param.name.upper()
            elif param.name and param.opts:
                names.setdefault(param.name, max(param.opts, key=len))
    return lambda name: names.get(name) or cli_name(name)


def handle_errors(fn: F) -> F:
    """Turn HeadcutError (bad user input) into a one-line error and exit code 2; an interruption
    (Ctrl-C, SIGTERM, SIGHUP) into a one-line note and exit code 128 + the signal's number."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with held_diagnostics():
                return fn(*args, **kwargs)
        except HeadcutError as exc:
            if not getattr(exc, "echo", True):
                # every process of the run stops alike and the main one says why: this one leaves it the time to
                # (a launcher stops the others once one has exited), ending silently on the launcher's signal
                stop_on_signals(False)
                time.sleep(SHARED_GRACE_S)
                raise typer.Exit(2) from None
            fail(exc.render(flag_namer()))
        except OSError as exc:  # a file the checks did not foresee: one line naming it, still
            error = file_error(exc)
            if error is None:
                raise
            fail(str(error))
        except KeyboardInterrupt as exc:
            signum = int(getattr(exc, "signum", signal.SIGINT))
            name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
            hint = getattr(exc, "hint", None) or "nothing was written"
            Console(stderr=True, soft_wrap=True).print(f"interrupted ({name}): {hint}", highlight=False, markup=False)
            raise typer.Exit(128 + signum) from None

    return wrapper  # type: ignore[return-value]


@contextmanager
def locked_run(target: OutputDir, main: bool, out: Path, checkpoint: Path | None, log: Out) -> Iterator[None]:
    """:func:`headcut.training.checkpoint.locked_output`, with the progress closed at the end."""
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from ..training.checkpoint import locked_output

    try:
        with locked_output(target, main, out, checkpoint):
            yield
    finally:
        log.close()
