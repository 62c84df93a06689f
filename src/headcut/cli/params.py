"""The shared flags and arguments the commands write by hand (each typed once here, used by several commands)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from ..catalog import GGUF_TYPES, GQA_POLICIES, METHODS, OUTPUT_FORMATS, SCORERS, TASKS
from .completion import _choices, complete_folders

F = TypeVar("F", bound=Callable[..., Any])


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
