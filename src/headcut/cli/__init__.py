"""The ``headcut`` command line: each command parses its options, calls one function of
:mod:`headcut.api` and renders the result (:mod:`.render`). Nothing here imports torch until a command
runs, so ``--help`` and shell completion are fast."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="headcut",
    help="Make transformer checkpoints smaller and faster by removing attention heads, exactly.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# each module registers its command on ``app``, in the order --help lists them
from . import (  # noqa: E402,F401
    bench_cmd,
    eval_cmd,
    export_cmd,
    finetune_cmd,
    info_cmd,
    prune_cmd,
    score_cmd,
)


def _tidy(command: object) -> None:
    """Show arguments as their metavar (``MODEL``) and flags without a ``<bool>`` type in --help."""
    commands = getattr(command, "commands", {}) or {}
    for sub in [command, *commands.values()]:
        for param in getattr(sub, "params", []):
            kind = getattr(param, "param_type_name", "")
            if kind == "argument":
                label = param.metavar or param.name.upper()
                required = param.required
                param._usage_display_name = lambda label=label, required=required: label if required else f"[{label}]"
                param.display_type_rich = lambda ctx: None
            elif kind == "option" and getattr(param, "is_flag", False):
                param.display_type_rich = lambda ctx: None
        make_help = getattr(sub, "get_help_option", None)
        if make_help is not None:
            def get_help_option(ctx: object, make_help: object = make_help) -> object:
                option = make_help(ctx)  # type: ignore[operator]
                if option is not None:
                    option.display_type_rich = lambda ctx: None
                return option

            sub.get_help_option = get_help_option


def main() -> None:
    """The console script: ``headcut`` (and ``python -m headcut``)."""
    import typer.main

    from .common import stop_on_signals

    stop_on_signals()
    command = typer.main.get_command(app)
    _tidy(command)
    command(prog_name="headcut")
