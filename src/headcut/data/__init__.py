"""Calibration and evaluation data: read a data file (or a ``datasets`` name, or rows given in memory),
tokenize it for the model's task head and cut it into batches ready for ``model(**batch)``.

One module per job:

* :mod:`~headcut.data.config`: :class:`DataConfig` and the plain constants (task names, usual column
  names, file formats); standard library only.
* :mod:`~headcut.data.streams`: the bytes of a data file or pipe (format, compression, a silent pipe waited
  for); :mod:`~headcut.data.text`: those bytes decoded, ``.txt`` read lazily, long texts cut into pieces.
* :mod:`~headcut.data.files`: where the rows come from: local files (``.csv``, ``.tsv``, ``.json``,
  ``.jsonl``, ``.parquet``, ``.txt``, compressed text; ``.txt`` read lazily), pipes and devices (with
  ``DataConfig.data_format``), ``datasets`` names ``NAME[:CONFIG]``, or a
  ``datasets.Dataset``/``DatasetDict``/list of dict rows passed to :func:`load_calibration`.
* :mod:`~headcut.data.columns`: which columns and rows are used (usual names, seeded shuffle,
  ``max_examples``), texts and label ids.
* :mod:`~headcut.data.blocks`: a ``.txt`` file for a causal LM cut into blocks of ``seq_len`` tokens.
* :mod:`~headcut.data.windows`: a causal LM's perplexity as the pruning papers measure it: the whole text cut
  into non-overlapping windows of N tokens (:func:`load_windows`).
* :mod:`~headcut.data.tasks`: the task of the model's head (:func:`detect_task`), its tokenizer
  (:func:`load_tokenizer`), tokenizing per task, masking, padded batches (:func:`load_calibration`,
  :class:`Calibration`).

Importing this package is light: the names of :mod:`~headcut.data.config` and
:func:`~headcut.sources.looks_local` are plain; the others import torch, transformers and datasets on first
access (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..sources import looks_local
from .config import (
    COMPRESSIONS,
    FILE_FORMATS,
    LABEL_COLUMNS,
    PAIR_COLUMNS,
    SOURCE_COLUMNS,
    SUPPORTED_HEADS,
    TARGET_COLUMNS,
    TASK_NAMES,
    TEXT_COLUMNS,
    TOKENIZER_FILES,
    DataConfig,
)

if TYPE_CHECKING:
    from .files import open_data
    from .tasks import Calibration, detect_task, load_calibration, load_tokenizer
    from .windows import TextStream, load_windows

#: heavy name -> the submodule that defines it (imported on first access)
_LAZY = {
    "Calibration": "tasks",
    "detect_task": "tasks",
    "load_calibration": "tasks",
    "load_tokenizer": "tasks",
    "open_data": "files",
    "TextStream": "windows",
    "load_windows": "windows",
}

__all__ = [
    "COMPRESSIONS",
    "FILE_FORMATS",
    "LABEL_COLUMNS",
    "PAIR_COLUMNS",
    "SOURCE_COLUMNS",
    "SUPPORTED_HEADS",
    "TARGET_COLUMNS",
    "TASK_NAMES",
    "TEXT_COLUMNS",
    "TOKENIZER_FILES",
    "Calibration",
    "DataConfig",
    "TextStream",
    "detect_task",
    "load_calibration",
    "load_tokenizer",
    "load_windows",
    "looks_local",
    "open_data",
]


def __getattr__(name: str) -> Any:
    """The heavy names, imported from their submodule on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
