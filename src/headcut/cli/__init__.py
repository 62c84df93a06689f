"""The ``headcut`` command line: each command parses its options, calls one function of
:mod:`headcut.api` and renders the result (:mod:`.render`). Nothing here imports torch until a command
runs, so ``--help`` and shell completion are fast."""

from __future__ import annotations

# each module registers its command on ``app``, in the order --help lists them
from . import (  # noqa: F401
    bench_cmd,
    eval_cmd,
    export_cmd,
    finetune_cmd,
    info_cmd,
    methods_cmd,
    prune_cmd,
    recipes_cmd,
    score_cmd,
)
from .app import app
from .failures import stop_on_signals

__all__ = ["app", "main"]


def main() -> None:
    """The console script: ``headcut`` (and ``python -m headcut``)."""
    stop_on_signals()
    try:
        app(prog_name="headcut")
    finally:
        stop_on_signals(False)
