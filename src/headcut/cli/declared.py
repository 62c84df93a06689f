"""Command parameters made from ``option()`` declarations (:mod:`headcut.options`): flags, help, metavars,
completion and the default shown, added to a command by a decorator (:func:`with_specs`: a dict of the options
given; :func:`with_settings`: a typed object); and the data options' :class:`headcut.data.DataConfig`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from ..data.config import DataConfig
from ..options import OptionSpec, specs
from .completion import completion

F = TypeVar("F", bound=Callable[..., Any])


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


def _placed(fn: Callable[..., Any], name: str, params: list[inspect.Parameter]) -> inspect.Signature:
    """``fn``'s signature with ``params`` where its parameter ``name`` stands (it marks their place in
    ``--help``), keyword-only from there on."""
    sig = inspect.signature(fn, eval_str=True)
    own = list(sig.parameters.values())
    at = next((i for i, p in enumerate(own) if p.name == name), len(own))
    after = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[at + 1 :]]
    return sig.replace(parameters=own[:at] + params + after)


def _required(params: list[inspect.Parameter], required: tuple[str, ...]) -> list[inspect.Parameter]:
    """``params`` with those named in ``required`` made required (no default: the command refuses to run
    without them, as click says)."""
    out = []
    for p in params:
        if p.name in required:
            kind, info = p.annotation.__args__[0], p.annotation.__metadata__[0]
            kind = next(k for k in kind.__args__ if k is not type(None))  # int | None -> int
            p = p.replace(default=inspect.Parameter.empty, annotation=Annotated[kind, info])
        out.append(p)
    return out


def with_specs(
    cls: type | list[OptionSpec], name: str, skip: tuple[str, ...] = (), required: tuple[str, ...] = ()
) -> Callable[[F], F]:
    """Give a command the declared options of ``cls`` (:func:`spec_parameters`; or the specs given, e.g. a stage
    kind's read from its source), handed to it as keyword ``name``: a dict of the options given on the command
    line. Where the command's signature has a parameter ``name``, the options stand there in ``--help`` (else at
    the end); ``skip``: fields the command does not offer; ``required``: options the command cannot run without."""

    def decorate(fn: F) -> F:
        params = _required(spec_parameters(cls if isinstance(cls, list) else specs(cls), skip=skip), required)
        names = [p.name for p in params]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {n: kwargs.pop(n) for n in names if n in kwargs}
            kwargs[name] = {k: v for k, v in given.items() if v is not None}
            return fn(*args, **kwargs)

        wrapper.__signature__ = _placed(fn, name, params)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def with_settings(cls: type, name: str, skip: tuple[str, ...] = (), required: tuple[str, ...] = ()) -> Callable[[F], F]:
    """:func:`with_specs`, handing the command one ``cls`` object (keyword ``name``): the options given, the
    declared defaults for the others (a shared group of flags, such as :class:`headcut.config.run.ModelSource`)."""
    specs_of = with_specs(cls, name, skip, required)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def typed(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**kwargs[name])
            return fn(*args, **kwargs)

        typed.__signature__ = inspect.signature(fn, eval_str=True)  # type: ignore[attr-defined]
        return specs_of(typed)  # type: ignore[return-value]

    return decorate


def data_spec(path: str, options: dict[str, Any], seed: int, split: str | None = None) -> Any:
    """A :class:`headcut.data.DataConfig` for ``path`` with the data options given (``options``, as
    :func:`with_specs` hands them; ``split``: another split than theirs, for ``--eval-data``); the API checks it,
    once, before it reads anything."""
    values = {**options, **({"split": split} if split is not None else {})}
    return DataConfig(path=path, seed=seed, **values)


def data_values(options: dict[str, Any]) -> dict[str, Any]:
    """Every data option the command line offers, in their declared order: the value given (``options``, as
    :func:`with_specs` hands them), else the declared default."""
    return {s.name: options.get(s.name, s.default) for s in specs(DataConfig) if s.meta.cli}


def data_options_for_api(options: dict[str, Any]) -> dict[str, Any]:
    """The data options as :mod:`headcut.api` functions take them (``data_options``): :func:`data_values` but
    ``split``, None left out."""
    return {k: v for k, v in data_values(options).items() if k != "split" and v is not None}


def report_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """A command's arguments as its report records them: flag names as parameters (the few reports have always
    named otherwise renamed), paths as text, values of other kinds left out."""
    from pathlib import Path

    renamed = {"teacher": "distill_from", "formats": "output_format"}  # the names reports have always used
    out: dict[str, Any] = {}
    for key, value in ((renamed.get(k, k), v) for k, v in values.items()):
        if isinstance(value, Path):
            out[key] = str(value)
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
    return out
