"""The ``headcut`` Typer application the command modules register their commands on (its own module, so the
commands import it without importing the package that imports them)."""

from __future__ import annotations

import typer

from .help import TidyGroup

app = typer.Typer(
    cls=TidyGroup,
    name="headcut",
    help="Make transformer checkpoints smaller and faster by removing attention heads, exactly.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
