"""The arguments and flags the commands type by hand, each once here: MODEL (a positional argument, not an option:
declarations are options) and ``prune --method`` (required on the command line, and it decides which method
options the command offers, so the generated flag of ``PruneConfig.method`` would show a false default). Every
other flag is generated from its declaration (:mod:`headcut.cli.declared`)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..catalog import METHODS
from .completion import _choices, complete_folders

ModelArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint folder (or Hugging Face Hub id).",
        metavar="MODEL",
        show_default=False,
        autocompletion=complete_folders,
    ),
]


MethodOpt = Annotated[
    str | None,
    typer.Option(
        "--method",
        help="One paper's method alone, with its defaults (headcut methods lists them); without it a recipe runs.",
        metavar="METHOD",
        show_default=False,
        autocompletion=_choices(METHODS),
    ),
]
