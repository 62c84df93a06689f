"""Data options shared by the commands that read data (``eval``, ``score``, ``prune``).

Use the aliases as parameter types and build the library's config with :func:`data_config`::

    def cmd(model: ModelArg, data: DataRequired, split: Split = D.split, text_col: TextCol = None, ...):
        config = data_config(data, split=split, text_col=text_col, ...)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..data import (
    COMPRESSIONS,
    LABEL_COLUMNS,
    PAIR_COLUMNS,
    SOURCE_COLUMNS,
    TARGET_COLUMNS,
    TEXT_COLUMNS,
    Calibration,
    DataConfig,
    load_calibration,
    load_tokenizer,
    looks_local,
)
from ..errors import HeadcutError

#: the defaults (use them as the parameters' defaults: ``seq_len: SeqLen = D.seq_len``)
D = DataConfig(path="")

DATA_HELP = (
    "Data file: .csv, .tsv, .json, .jsonl, .parquet or .txt (one example per line; for causal LMs one text cut "
    f"into --seq-len blocks); text formats may be compressed ({', '.join(COMPRESSIONS)}). Any other name is a "
    "datasets name NAME[:CONFIG] read with --split (needs the Hub or its cache)."
)

DataRequired = Annotated[str, typer.Option("--data", help=DATA_HELP, metavar="FILE|NAME[:CONFIG]", show_default=False)]
DataOptional = Annotated[
    Optional[str], typer.Option("--data", help=DATA_HELP, metavar="FILE|NAME[:CONFIG]", show_default=False)
]
Split = Annotated[str, typer.Option("--split", help="Split of a datasets name (a local file is one split).")]
TextCol = Annotated[
    Optional[str], typer.Option("--text-col", help=f"Text column; default: the first of {', '.join(TEXT_COLUMNS)}.")
]
TextPairCol = Annotated[
    Optional[str],
    typer.Option("--text-pair-col", help=f"Second text of sentence pairs; default: {', '.join(PAIR_COLUMNS)} if any."),
]
LabelCol = Annotated[
    Optional[str],
    typer.Option("--label-col", help=f"Label column (ids, or names from the model's label2id); default: the first "
                 f"of {', '.join(LABEL_COLUMNS)}."),
]
SourceCol = Annotated[
    Optional[str],
    typer.Option("--source-col", help=f"Seq2seq source column; default: the first of {', '.join(SOURCE_COLUMNS)} "
                 "(then the text columns)."),
]
TargetCol = Annotated[
    Optional[str],
    typer.Option("--target-col", help=f"Seq2seq target column; default: the first of {', '.join(TARGET_COLUMNS)}."),
]
MaxExamples = Annotated[
    Optional[int],
    typer.Option("--max-examples", help="Use at most this many examples (after shuffling with --seed); default: all."),
]
SeqLen = Annotated[
    int, typer.Option("--seq-len", help="Tokens per example: truncation length, or causal-LM block size.")
]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Examples per forward.")]
DataSeed = Annotated[int, typer.Option("--seed", help="Seed for shuffling the examples and choosing masked tokens.")]


def data_config(
    data: Optional[str],
    *,
    split: str = D.split,
    text_col: Optional[str] = None,
    text_pair_col: Optional[str] = None,
    label_col: Optional[str] = None,
    source_col: Optional[str] = None,
    target_col: Optional[str] = None,
    max_examples: Optional[int] = None,
    seq_len: int = D.seq_len,
    batch_size: int = D.batch_size,
    seed: int = D.seed,
) -> DataConfig:
    """The :class:`~headcut.data.DataConfig` of the shared options, validated (one-line errors)."""
    if data is None or not data.strip():
        raise HeadcutError("no data given: pass --data FILE (or a datasets name)")
    config = DataConfig(
        path=data, split=split, text_col=text_col, text_pair_col=text_pair_col, label_col=label_col,
        source_col=source_col, target_col=target_col, max_examples=max_examples, seq_len=seq_len,
        batch_size=batch_size, seed=seed,
    )
    config.validate()
    if looks_local(data) and not Path(data).expanduser().exists():  # before minutes of model loading
        raise HeadcutError(f"data file not found: {data}")
    return config


def read_calibration(model_path: str, model: Any, config: DataConfig, trust_remote_code: bool = False) -> Calibration:
    """The checkpoint's tokenizer and the data of ``config`` as model-ready batches (with a spinner)."""
    from .common import console

    tokenizer = load_tokenizer(model_path, trust_remote_code=trust_remote_code)
    with console.status("reading data", spinner="dots"):
        return load_calibration(model, tokenizer, config)
