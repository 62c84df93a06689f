"""How a command's ``--help`` looks: plain metavars, 120 columns outside a terminal, an Examples section."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

F = TypeVar("F", bound=Callable[..., Any])


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
    """Outside a terminal (``--help | less``, a CI log) lay the help out 120 columns wide, not rich's 80, unless
    ``COLUMNS`` says the width."""
    import typer.rich_utils as rich_utils

    if rich_utils.MAX_WIDTH is None and not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
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


def examples(*lines: str) -> str:
    """An Examples section for a command's help (its epilog)."""
    return "Examples:\n\n" + "\n\n".join(f"  {escape(line)}" for line in lines)
