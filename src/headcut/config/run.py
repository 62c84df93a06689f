"""The settings several commands share, each declared once (:mod:`headcut.options`) and offered by every command
that takes it: where the model comes from (:class:`ModelSource`), what data a run reads (:class:`DataSources`),
what it writes (:class:`OutputSettings`) and how it runs (:class:`RunSettings`). A field's name is the keyword
of the Python API (``formats``), its flag may differ (``--format``).

Standard library only: the command line builds its flags and help from this module without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalog import GGUF_TYPES, OUTPUT_FORMATS, TASKS
from ..options import TRAINING_PANEL, option

#: the ``--help`` section of the shared flags (typer's own section)
OPTIONS_PANEL = "Options"

#: the help of ``--data``
DATA_HELP = (
    "Data: a .csv, .tsv, .json, .jsonl, .parquet or .txt file (maybe compressed), a pipe with --data-format, "
    "or a datasets name NAME[:CONFIG] (docs/data.md)."
)

#: how ``--data`` and ``--eval-data`` show their value
DATA_METAVAR = "FILE|NAME[:CONFIG]"


@dataclass
class ModelSource:
    """How a checkpoint is loaded: ``task``: the head to load it with (None: the model's own); ``allow_pickle``:
    also pickle (``.bin``) weights, which can run code; ``trust_remote_code``: checkpoints that ship their own
    model code."""

    task: str | None = option(
        None,
        metavar="TASK",
        panel=OPTIONS_PANEL,
        complete=TASKS,
        help=f"Task head: {', '.join(TASKS)} (default: the model's).",
    )
    allow_pickle: bool = option(False, panel=OPTIONS_PANEL, help="Allow pickle (.bin) weights; they can run code.")
    trust_remote_code: bool = option(
        False, panel=OPTIONS_PANEL, help="Allow checkpoints that ship their own model code."
    )
    #: the model itself (the command line's MODEL): a checkpoint folder, a Hub id or a loaded model
    model: Any = None
    #: a tokenizer to read the data with (the Python API's; the command line reads the checkpoint's)
    tokenizer: Any = None


@dataclass
class DataSources:
    """What a run reads: ``data`` (training or calibration data), ``eval_data`` (held-out data), the split of an
    ``eval_data`` datasets name (``data``'s split is a data option: :class:`headcut.data.DataConfig`), and
    ``recover_data`` (unlabelled inputs a prune's recovery also learns from, alpha 1; the API also takes rows or a
    :class:`~headcut.data.DataConfig`; commands without a recovery do not offer it)."""

    data: str | None = option(None, metavar=DATA_METAVAR, panel=OPTIONS_PANEL, help=DATA_HELP)
    eval_data: str | None = option(
        None,
        metavar=DATA_METAVAR,
        panel=OPTIONS_PANEL,
        help="Held-out data (the formats of --data, other rows): the metric before/after, every --eval-every "
        "steps, prune's --max-drop and --trajectory.",
    )
    eval_split: str = option(
        "validation", metavar="SPLIT", panel=OPTIONS_PANEL, help="Split of an --eval-data datasets name."
    )
    recover_data: str | None = option(
        None, metavar=DATA_METAVAR, panel=OPTIONS_PANEL, help="Unlabelled text for --recover-steps (alpha 1)."
    )


@dataclass
class OutputSettings:
    """Where and how a model is written: ``out`` (a folder, written atomically), ``force`` (replace a folder headcut
    wrote), ``formats`` (comma-separated: safetensors, onnx, gguf, decilm) and ``gguf_type``."""

    out: str | None = option(
        None, metavar="DIR", panel=OPTIONS_PANEL, complete="folders", help="Output folder (written atomically)."
    )
    force: bool = option(
        False,
        panel=OPTIONS_PANEL,
        help="Replace an existing non-empty --out, but only a folder headcut wrote; never an input (docs/outputs.md). "
        "Also a stale checkpoint folder and prune's trajectory files.",
    )
    formats: str = option(
        "safetensors",
        flag="--format",
        metavar="FORMATS",
        panel=OPTIONS_PANEL,
        complete=OUTPUT_FORMATS,
        help="What --out holds, comma-separated: safetensors, onnx (extra [onnx]), gguf (extra [gguf]), decilm (vLLM).",
    )
    gguf_type: str = option(
        "f16",
        metavar="TYPE",
        panel=OPTIONS_PANEL,
        complete=GGUF_TYPES,
        help=f"GGUF tensor type of the weight matrices with --format gguf: {', '.join(GGUF_TYPES)}.",
    )


@dataclass
class RunSettings:
    """How a run goes: ``seed`` (every random choice), ``device`` (where a training run trains) and ``resume``
    (continue an interrupted training run from its checkpoint)."""

    seed: int = option(
        0,
        metavar="N",
        panel=OPTIONS_PANEL,
        help="Seed of every random choice of the run: data shuffling and masking, batch order, dropout, random "
        "scores, synthetic inputs.",
    )
    device: str | None = option(
        None,
        metavar="DEVICE",
        panel=TRAINING_PANEL,
        complete=("auto", "cpu", "cuda", "mps"),
        help="auto (CUDA when available; the default), cpu, cuda, cuda:N or mps; under accelerate launch/torchrun "
        "each process takes its own GPU.",
    )
    resume: bool = option(
        False,
        panel=TRAINING_PANEL,
        help="Continue an interrupted run from OUT.headcut-checkpoint/ (--epochs/--max-steps may grow).",
    )
    #: a training run's resume checkpoint folder (None: OUT.headcut-checkpoint; the Python API's)
    checkpoint_dir: Any = None
    #: discard a stale resume checkpoint (the command line's --force does)
    restart: bool = False
    #: the progress reporter (:class:`headcut.progress.Reporter`; None: silent)
    progress: Any = None
