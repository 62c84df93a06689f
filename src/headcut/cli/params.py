"""The arguments and flags the commands still type by hand, each once here: MODEL (a positional argument, not an
option: declarations are options) and the commands' own flags that have no declaration yet (``--gqa`` of
``export``, ``--method`` of ``prune``, ``--scorer`` of ``score``: issue 56's other part). The shared flags are
declared in :mod:`headcut.config.run` and :class:`headcut.cli.output.Reporting`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from ..catalog import GQA_POLICIES, METHODS, SCORERS
from .completion import _choices, complete_folders

F = TypeVar("F", bound=Callable[..., Any])


ModelArg = Annotated[
    str,
    typer.Argument(
        help="Checkpoint folder (or Hugging Face Hub id).",
        metavar="MODEL",
        show_default=False,
        autocompletion=complete_folders,
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


ScorerOpt = Annotated[
    str,
    typer.Option(
        "--scorer",
        help=f"Scorer: {', '.join(SCORERS)} (see above).",
        metavar="SCORER",
        autocompletion=_choices(SCORERS),
    ),
]
