"""Command parameters made from ``option()`` declarations (:mod:`headcut.options`): flags, help, metavars,
completion and the default shown, added to a command by a decorator; and the data options."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ..options import OptionSpec
from .completion import completion

F = TypeVar("F", bound=Callable[..., Any])


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
            *([spec.flag, spec.meta.short] if spec.meta.short else [spec.flag]),
            help=text,
            metavar=spec.metavar,
            rich_help_panel=spec.meta.panel,
            hidden=hidden,
            show_default=False,
            autocompletion=completion(spec),
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
