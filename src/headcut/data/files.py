"""Where the rows come from: a local data file, a ``datasets`` name, or a dataset given in memory.

* **Files**: ``.csv``, ``.tsv``, ``.json`` (records, or one field holding them), ``.jsonl``, ``.parquet``
  and ``.txt`` (one example per line), also compressed ``.gz``/``.bz2``/``.xz``/``.zst`` (not parquet),
  read with ``datasets`` with its cache in a temporary folder (nothing is written beside the data).
* **Names**: any other name that does not look like a local path (:func:`headcut.sources.looks_local`) is a
  ``datasets`` name ``NAME[:CONFIG]`` loaded with ``split`` (needs the Hugging Face Hub or its cache).
* **In memory** (Python API): a ``datasets.Dataset``, a ``datasets.DatasetDict`` (its ``split``) or a list
  of dict rows, used as they are.

Every failure is a one-line :class:`~headcut.errors.HeadcutError`. ``datasets`` is imported on first use.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import HeadcutError
from ..sources import looks_local
from .config import COMPRESSIONS, FILE_FORMATS, DataConfig


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type name when it has none)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def _root_message(exc: BaseException) -> str:
    """The most specific message of an exception chain (datasets wraps the parser's error)."""
    messages = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        messages.append(first_line(cur))
        cur = cur.__cause__ or cur.__context__
    generic = ("An error occurred while generating the dataset",)
    specific = [m for m in messages if m not in generic]
    return specific[0] if specific else messages[0]


def _file_format(path: Path) -> tuple[str, dict[str, Any], str]:
    """(builder, options, suffix) of a data file, from its name."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
        compressed = True
    else:
        compressed = False
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in FILE_FORMATS or (compressed and suffix == ".parquet"):
        raise HeadcutError(
            f"{path} is not a supported data file; use .csv, .tsv, .json, .jsonl, .parquet or .txt "
            f"(text formats may be compressed: {', '.join(COMPRESSIONS)})"
        )
    builder, options = FILE_FORMATS[suffix]
    return builder, dict(options), suffix


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """Yield the ``datasets`` module with its progress bars and logging (and the Hub's) silenced."""
    import datasets
    from datasets.utils import logging as ds_logging
    from huggingface_hub.utils import logging as hub_logging

    bars_were_off = datasets.are_progress_bars_disabled()
    verbosity, hub_verbosity = ds_logging.get_verbosity(), hub_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()  # no retry messages: a failure becomes one HeadcutError
    try:
        yield datasets
    finally:
        ds_logging.set_verbosity(verbosity)
        hub_logging.set_verbosity(hub_verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def open_data(config: DataConfig) -> Iterator[tuple[Any, str, bool]]:
    """Yield ``(dataset, source, is_txt)`` for ``config.path``: a ``datasets.Dataset`` of a local file
    (cached in a temporary folder, removed on exit) or of a ``datasets`` name and split."""
    path = str(config.path)
    if looks_local(path):
        p = Path(path).expanduser()
        if not p.exists():
            raise HeadcutError(f"data file not found: {path}")
        if p.is_dir():
            raise HeadcutError(f"{path} is a folder; pass a data file (.csv, .tsv, .json, .jsonl, .parquet, .txt)")
        builder, options, suffix = _file_format(p)
        try:
            size = p.stat().st_size
            with p.open("rb"):
                pass
        except OSError as exc:
            raise HeadcutError(f"cannot read {path}: {exc.strerror or first_line(exc)}") from None
        if size == 0:
            raise HeadcutError(f"{path} is empty")
        with tempfile.TemporaryDirectory(prefix="headcut-data-") as cache, _quiet_datasets() as datasets:
            try:
                ds = datasets.load_dataset(builder, data_files=str(p), split="train", cache_dir=cache, **options)
                if suffix == ".json" and len(ds.column_names) == 1 and _holds_records(ds[ds.column_names[0]][:1]):
                    # {"data": [{...}, ...]}: the records are in one field
                    ds = datasets.load_dataset(builder, data_files=str(p), split="train", cache_dir=cache,
                                               field=ds.column_names[0])
            except Exception as exc:  # pandas, pyarrow and json parsers raise many kinds
                message = _root_message(exc)
                if "corresponds to no data" in message or "at least one example" in message:
                    raise HeadcutError(f"{path} has no examples") from None
                raise HeadcutError(f"cannot read {path}: {message}") from None
            if ds.num_rows == 0:
                raise HeadcutError(f"{path} has no examples")
            yield ds, str(p), builder == "text"
        return
    name, _, cfg = path.partition(":")
    cfg_name = config.config_name or cfg or None
    with _quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, cfg_name, split=config.split)
        except Exception as exc:  # network, missing dataset/config/split: all one-line errors
            shown = name + (f":{cfg_name}" if cfg_name else "")
            hint = "" if ":" in path else f" (a local file needs an existing path, e.g. ./{path})"
            raise HeadcutError(
                f"cannot load the datasets dataset {shown!r} (split {config.split!r}): {_root_message(exc)}{hint}"
            ) from None
    if ds.num_rows == 0:
        raise HeadcutError(f"{path} split {config.split!r} has no examples")
    yield ds, f"{name}{':' + cfg_name if cfg_name else ''}[{config.split}]", False


def _holds_records(values: Sequence[Any]) -> bool:
    return bool(values) and isinstance(values[0], list) and bool(values[0]) and isinstance(values[0][0], dict)


def in_memory(dataset: Any, split: str) -> tuple[Any, str]:
    """``(dataset, source)`` of rows given in memory: a ``datasets.Dataset``, a ``datasets.DatasetDict``
    (its ``split`` is used) or a list of dict rows. ``source`` names it for reports, e.g.
    ``<datasets.Dataset of 100 rows>``; the dataset is returned with plain Python formatting."""
    with _quiet_datasets() as datasets:
        if isinstance(dataset, datasets.DatasetDict):
            if split not in dataset:
                shown = ", ".join(repr(s) for s in dataset) or "none"
                raise HeadcutError(f"the DatasetDict has no split {split!r} (its splits: {shown}); pass another split")
            ds, kind = dataset[split], f"datasets.DatasetDict[{split!r}]"
        elif isinstance(dataset, datasets.Dataset):
            ds, kind = dataset, "datasets.Dataset"
        elif isinstance(dataset, (list, tuple)):
            if not dataset:
                raise HeadcutError(f"the {type(dataset).__name__} of rows is empty")
            for i, row in enumerate(dataset):
                if not isinstance(row, dict):
                    raise HeadcutError(f"dataset rows must be dicts (column -> value); row {i + 1} is {_kind(row)}")
            try:
                ds = datasets.Dataset.from_list([dict(row) for row in dataset])
            except Exception as exc:  # pyarrow cannot type the values (e.g. a column mixing text and numbers)
                raise HeadcutError(f"cannot make a dataset of the list of rows: {_root_message(exc)}") from None
            kind = type(dataset).__name__
        else:
            raise HeadcutError(
                "dataset must be a datasets.Dataset, a datasets.DatasetDict or a list of dict rows, "
                f"not {_kind(dataset)}"
            )
    n = ds.num_rows
    source = f"<{kind} of {n} row{'s' if n != 1 else ''}>"
    if n == 0:
        raise HeadcutError(f"{source} has no examples")
    return ds.with_format(None), source


def _kind(value: Any) -> str:
    """The type of ``value`` for a message: ``str``, ``pandas.core.frame.DataFrame`` ..."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
