"""The ``headcut`` command line: thin wrappers over the library (see each command's module)."""

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

# each module registers its command(s) on ``app``
from . import bench_cmd, eval_cmd, finetune_cmd, prune_cmd, score_cmd, surgery_cmds  # noqa: E402,F401


def main() -> None:
    import huggingface_hub
    import transformers

    # headcut draws its own progress bars; transformers' per-file loading bars would interleave
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    from .common import stop_on_signals

    stop_on_signals()
    app()
