"""What the commands share: output routing, one-line errors and signals, output checks, the option groups
(declared once, added to each command by a decorator) and shell completions.

Conventions: a command's result (its table, or the JSON of ``--json -``) goes to stdout; progress, notes
and logs go to stderr; with ``--json -`` stdout holds the JSON alone and the tables go to stderr. This
module imports no torch: ``--help`` and completion stay fast.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from ..catalog import GGUF_TYPES, GQA_POLICIES, METHODS, OUTPUT_FORMATS, SCORERS, TASKS
from ..errors import HeadcutError
from ..files.atomic import OutputDir, OutputFile  # noqa: F401 (the commands use it)
from ..files.plan import plan_outputs  # noqa: F401 (the commands use it)
from ..files.space import file_error  # noqa: F401 (the commands use it)
from ..interrupts import Interrupted
from ..options import OptionSpec, cli_name
from ..progress import Reporter

F = TypeVar("F", bound=Callable[..., Any])


# ---- help -------------------------------------------------------------------------------------------------


def _tidy(params: list[Any]) -> list[Any]:
    """Show arguments as their metavar (``MODEL``) and flags without a ``<bool>`` type in --help."""
    for param in params:
        kind = getattr(param, "param_type_name", "")
        if kind == "argument":
            label = param.metavar or param.name.upper()
            required = param.required
            param._usage_display_name = lambda label=label, required=required: label if required else f"[{label}]"
            param.display_type_rich = lambda ctx: None
        elif kind == "option" and getattr(param, "is_flag", False):
            param.display_type_rich = lambda ctx: None
    return params


def _help_width() -> None:
    """Outside a terminal (``--help | less``, a CI log) lay the help out 120 columns wide, not rich's 80."""
    import typer.rich_utils as rich_utils

    if rich_utils.MAX_WIDTH is None and not sys.stdout.isatty():
        rich_utils.MAX_WIDTH = 120


class TidyCommand(TyperCommand):
    """A command whose help shows plain metavars (see :func:`_tidy`)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _help_width()
        super().format_help(ctx, formatter)

    def get_params(self, ctx: Any) -> list[Any]:
        return _tidy(super().get_params(ctx))


class TidyGroup(TyperGroup):
    """The command group, with the same help as :class:`TidyCommand`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _help_width()
        super().format_help(ctx, formatter)

    def get_params(self, ctx: Any) -> list[Any]:
        return _tidy(super().get_params(ctx))


# ---- output ---------------------------------------------------------------------------------------------


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


# ---- errors and signals -----------------------------------------------------------------------------------


def fail(message: str) -> None:
    """Print a one-line error and exit with code 2."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
    raise typer.Exit(2)


#: seconds a process of a multi-process run that stops with the others waits for the main process to print the
#: line they share (:class:`headcut.errors.SharedError`) before it exits
SHARED_GRACE_S = 2.0


def stop_on_signals(stop: bool = True) -> None:
    """Make SIGTERM (a cancelled CI job, a pre-empted node) and SIGHUP (a closed terminal) stop a run the
    way Ctrl-C does: temporary outputs removed, resume checkpoints kept. ``stop=False``: their default action
    again (once a command has ended: a signal then ends the exiting process, with no exception raised into the
    interpreter's shutdown)."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handler if stop else signal.SIG_DFL)


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
    from ..training.checkpoint import locked_output

    try:
        with locked_output(target, main, out, checkpoint):
            yield
    finally:
        log.close()


# ---- completion -------------------------------------------------------------------------------------------


def complete_folders(incomplete: str) -> list[str]:
    """Folders whose path starts with ``incomplete`` (checkpoint folders for MODEL)."""
    typed_dir, prefix = os.path.split(incomplete)
    try:
        entries = list(os.scandir(os.path.expanduser(typed_dir) or "."))
    except OSError:
        return []
    names = sorted(
        e.name
        for e in entries
        if e.is_dir() and e.name.startswith(prefix) and (prefix.startswith(".") or not e.name.startswith("."))
    )
    return [os.path.join(typed_dir, n) + "/" for n in names]


def _choices(values: Any) -> Callable[[str], list[str]]:
    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


# ---- shared options ---------------------------------------------------------------------------------------

DATA_HELP = (
    "Data: a .csv, .tsv, .json, .jsonl, .parquet or .txt file (maybe compressed), a pipe with --data-format, "
    "or a datasets name NAME[:CONFIG] (docs/data.md)."
)
JSON_HELP = "Also write the result as JSON to PATH ('-' for stdout alone; the tables then go to stderr)."
FORCE_HELP = "Replace an existing non-empty --out, but only a folder headcut wrote; never an input (docs/outputs.md)."

ModelArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint folder (or Hugging Face Hub id).",
        metavar="MODEL",
        show_default=False,
        autocompletion=complete_folders,
    ),
]
JsonOut = Annotated[str | None, typer.Option("--json", help=JSON_HELP, metavar="PATH")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or lines, no notes.", metavar="")]
AllowPickle = Annotated[
    bool, typer.Option("--allow-pickle", help="Allow pickle (.bin) weights; they can run code.", metavar="")
]
TrustRemote = Annotated[
    bool, typer.Option("--trust-remote-code", metavar="", help="Allow checkpoints that ship their own model code.")
]
Task = Annotated[
    str | None,
    typer.Option(
        "--task",
        help=f"Task head: {', '.join(TASKS)} (default: the model's).",
        metavar="TASK",
        autocompletion=_choices(TASKS),
    ),
]
Force = Annotated[bool, typer.Option("--force", help=FORCE_HELP, metavar="")]
OutputFormat = Annotated[
    str,
    typer.Option(
        "--format",
        metavar="FORMATS",
        autocompletion=_choices(OUTPUT_FORMATS),
        help="What --out holds, comma-separated: safetensors, onnx (extra \\[onnx]), gguf (llama.cpp; extra \\[gguf]).",
    ),
]
GgufType = Annotated[
    str,
    typer.Option(
        "--gguf-type",
        metavar="TYPE",
        autocompletion=_choices(GGUF_TYPES),
        help=f"GGUF tensor type of the weight matrices with --format gguf: {', '.join(GGUF_TYPES)}.",
    ),
]
Gqa = Annotated[
    str,
    typer.Option(
        "--gqa",
        metavar="POLICY",
        autocompletion=_choices(GQA_POLICIES),
        help="Grouped-query attention: group/auto (remove whole KV groups), uniform (equal query heads in every "
        "remaining group), duplicate (any query head; KV heads copied).",
    ),
]
Out_ = Annotated[
    Path | None, typer.Option("--out", help="Output folder (written atomically).", metavar="DIR", show_default=False)
]
MethodOpt = Annotated[
    str | None,
    typer.Option(
        "--method",
        help="Pruning method (headcut methods lists them).",
        metavar="METHOD",
        show_default=False,
        autocompletion=_choices(METHODS),
    ),
]
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        metavar="",
        rich_help_panel="Training options",
        help="Continue an interrupted run from OUT.headcut-checkpoint/ (the same settings; --epochs/--max-steps may grow).",
    ),
]
Device = Annotated[
    str | None,
    typer.Option(
        "--device",
        metavar="DEVICE",
        rich_help_panel="Training options",
        autocompletion=_choices(("auto", "cpu", "cuda", "mps")),
        help="auto (CUDA when available; the default), cpu, cuda, cuda:N or mps; under accelerate launch/torchrun each "
        "process takes its own GPU.",
    ),
]
ScorerOpt = Annotated[
    str,
    typer.Option(
        "--scorer",
        help=f"Scorer: {', '.join(SCORERS)} (see above).",
        metavar="SCORER",
        autocompletion=_choices(SCORERS),
    ),
]


@dataclass
class DataOptions:
    """The data options of the commands that read data (one declaration, see :func:`with_data_options`)."""

    split: str = "train"
    text_col: str | None = None
    text_pair_col: str | None = None
    label_col: str | None = None
    source_col: str | None = None
    target_col: str | None = None
    max_examples: int | None = None
    seq_len: int = 128
    batch_size: int = 16
    data_format: str | None = None
    encoding: str = "utf-8"

    def for_api(self) -> dict[str, Any]:
        """The options :func:`headcut.api` functions take as ``data_options`` (``split`` apart)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "split" and getattr(self, f.name) is not None
        }


def _data_option_params() -> list[inspect.Parameter]:
    from ..data.config import LABEL_COLUMNS, PAIR_COLUMNS, SOURCE_COLUMNS, TARGET_COLUMNS, TEXT_COLUMNS

    def opt(name: str, annotation: Any, default: Any, *flags: str, help: str, metavar: str) -> inspect.Parameter:
        info = typer.Option(*flags, help=help, metavar=metavar, rich_help_panel="Data options")
        return inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, info]
        )

    d = DataOptions()
    return [
        opt(
            "split",
            str,
            d.split,
            "--split",
            help="Split of a datasets name (a local file is one split).",
            metavar="SPLIT",
        ),
        opt(
            "text_col",
            str | None,
            None,
            "--text-col",
            metavar="COLUMN",
            help=f"Text column; default: the first of {', '.join(TEXT_COLUMNS)}.",
        ),
        opt(
            "text_pair_col",
            str | None,
            None,
            "--text-pair-col",
            metavar="COLUMN",
            help=f"Second text of sentence pairs; default: {', '.join(PAIR_COLUMNS)} if any.",
        ),
        opt(
            "label_col",
            str | None,
            None,
            "--label-col",
            metavar="COLUMN",
            help=f"Label column (ids, or names from the model's label2id); default: the first of "
            f"{', '.join(LABEL_COLUMNS)}.",
        ),
        opt(
            "source_col",
            str | None,
            None,
            "--source-col",
            metavar="COLUMN",
            help=f"Seq2seq source column; default: the first of {', '.join(SOURCE_COLUMNS)} (then the text columns).",
        ),
        opt(
            "target_col",
            str | None,
            None,
            "--target-col",
            metavar="COLUMN",
            help=f"Seq2seq target column; default: the first of {', '.join(TARGET_COLUMNS)}.",
        ),
        opt(
            "max_examples",
            int | None,
            None,
            "--max-examples",
            metavar="N",
            help="Use at most this many examples (after shuffling with --seed); default: all.",
        ),
        opt(
            "seq_len",
            int,
            d.seq_len,
            "--seq-len",
            metavar="N",
            help="Tokens per example: truncation length, or causal-LM block size.",
        ),
        opt("batch_size", int, d.batch_size, "--batch-size", metavar="N", help="Examples per forward."),
        opt(
            "data_format",
            str | None,
            None,
            "--data-format",
            metavar="FORMAT",
            help="Format of data whose name does not say it (a pipe, /dev/stdin): csv, tsv, json, jsonl, parquet or "
            "txt, optionally compressed (csv.gz).",
        ),
        opt(
            "encoding",
            str,
            d.encoding,
            "--encoding",
            metavar="ENCODING",
            help="Text encoding of csv, tsv, json, jsonl and txt data, e.g. latin-1, cp1252, utf-16.",
        ),
    ]


def spec_parameters(
    specs: list[OptionSpec], *, hidden: bool = False, skip: tuple[str, ...] = ()
) -> list[inspect.Parameter]:
    """Command parameters for declared options (:mod:`headcut.options`): flag, help, metavar, choices and panel
    from the declaration, the default shown in the help; every default is None (not given: the library
    applies the declared default)."""
    out = []
    for spec in specs:
        if not spec.meta.cli or spec.name in skip:
            continue
        kind = {"int": int, "float": float, "str": str, "bool": bool}[spec.kind]
        shown = spec.default_text()
        text = escape(spec.help) + (f" Default: {escape(shown)}." if shown is not None else "")
        info = typer.Option(
            spec.flag,
            help=text,
            metavar=spec.metavar,
            rich_help_panel=spec.meta.panel,
            hidden=hidden,
            show_default=False,
            autocompletion=_choices(spec.meta.choices) if spec.meta.choices else None,
        )
        out.append(
            inspect.Parameter(
                spec.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, info]
            )
        )
    return out


def click_params(parameters: list[inspect.Parameter]) -> list[Any]:
    """:func:`spec_parameters` as click parameters (for a command that adds them while it parses), made the way
    typer makes a command's own: the parameters of a one-command app built from them (typer's public API only,
    which its releases keep; its private helpers changed between 0.27 and 0.29)."""

    def holder(**kwargs: Any) -> None:
        return None

    holder.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    app = typer.Typer(add_completion=False)
    app.command()(holder)
    return list(typer.main.get_command(app).params)


def with_specs(cls: type, name: str, skip: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Give a command the declared options of ``cls`` (:func:`spec_parameters`), handed to it as keyword
    ``name``: a dict of the options given on the command line."""
    from ..options import specs

    def decorate(fn: F) -> F:
        params = spec_parameters(specs(cls), skip=skip)
        names = [p.name for p in params]
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != name]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {n: kwargs.pop(n) for n in names if n in kwargs}
            kwargs[name] = {k: v for k, v in given.items() if v is not None}
            return fn(*args, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=own + params)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def with_options(builder: Callable[[], list[inspect.Parameter]], cls: type, name: str) -> Callable[[F], F]:
    """Add the parameters ``builder()`` makes to a command's signature, and hand the command one ``cls``
    object (as keyword ``name``) holding their values: the option group is declared once."""

    def decorate(fn: F) -> F:
        params = builder()
        names = [p.name for p in params]
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != name]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**{n: kwargs.pop(n) for n in names if n in kwargs})
            return fn(*args, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=own + params)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def with_data_options(fn: F) -> F:
    """Give a command the data options (``--split``, ``--text-col``, ..., ``--batch-size``) as ``data_options``."""
    return with_options(_data_option_params, DataOptions, "data_options")(fn)


def data_spec(path: str, split: str, options: DataOptions, seed: int) -> Any:
    """A :class:`headcut.data.DataConfig` for ``path`` with the shared options, validated."""
    from ..data.config import DataConfig

    config = DataConfig(path=path, split=split, seed=seed, **options.for_api())
    config.validate()
    return config


def examples(*lines: str) -> str:
    """An Examples section for a command's help (its epilog)."""
    return "Examples:\n\n" + "\n\n".join(f"  {escape(line)}" for line in lines)
