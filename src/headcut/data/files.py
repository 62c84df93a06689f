"""Where the rows come from: a local data file (or pipe), a ``datasets`` name, or a dataset given in memory.

* **Files**: ``.csv``, ``.tsv``, ``.json`` (records, or one field holding them), ``.jsonl``, ``.parquet``
  and ``.txt`` (one example per line), also compressed ``.gz``/``.bz2``/``.xz``/``.zst`` (not parquet),
  in ``DataConfig.encoding`` (UTF-8 by default). Tables are read with ``datasets`` with its cache in a
  private temporary folder (nothing is written beside the data); ``.txt`` is read lazily by
  :class:`TextFile`, never whole: only as far as ``max_examples`` needs, each line cut to what
  ``seq_len`` tokens can use.
* **Pipes and devices** (``<(zcat rows.csv.gz)``, a named pipe, ``/dev/stdin``) are read once, as a stream:
  their name does not say their format, so ``DataConfig.data_format`` (``--data-format``) names it
  (compression is also recognised from the first bytes). A table is copied into the temporary folder
  (stopping before the disk fills), text is streamed. A pipe that stays silent is waited for with a
  line on stderr every :data:`WAIT_NOTICE_S` seconds; Ctrl-C and SIGTERM stop the wait.
* **Temporary folders** are named ``headcut-data-PID-*`` and removed on exit; one left behind by a
  killed process (its PID gone) is removed by the next run.
* **Names**: any other name that does not look like a local path (:func:`headcut.sources.looks_local`) is a
  ``datasets`` name ``NAME[:CONFIG]`` loaded with ``split`` (needs the Hugging Face Hub or its cache).
* **In memory** (Python API): a ``datasets.Dataset``, a ``datasets.DatasetDict`` (its ``split``) or a list
  of dict rows, used as they are.

Every failure is a one-line :class:`~headcut.errors.HeadcutError` with nothing printed before it (the
readers' logging and warnings are silenced while reading). ``datasets`` is imported on first use.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import logging
import shutil
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import HeadcutError, first_line
from ..files.leftovers import remove_stale_scratch, scratch_folder
from ..sources import looks_local
from .config import FILE_FORMATS, DataConfig
from .streams import CHUNK, DataSource, PipeReader, data_source, read_chunk, root_message, stream_compression
from .text import TextFile, decoded, is_utf8, not_text_error, nul_error

#: a pipe copied into the temporary folder stops with an error before its disk keeps less free space than
#: this (or half of what it had, on a disk that had less than twice this)
MIN_FREE_BYTES = 512 << 20


#: the kind of the temporary folders (``headcut-data-PID-...``)
TEMP_KIND = "data"


@contextlib.contextmanager
def temp_folder() -> Iterator[Path]:
    """A private temporary folder ``headcut-data-PID-*``, removed on exit (those of dead runs are removed first:
    :func:`headcut.files.leftovers.scratch_folder`)."""
    with scratch_folder(TEMP_KIND) as folder:
        yield folder


def _copy_stream(source: DataSource, folder: Path, encoding: str) -> DataSource:
    """Copy a pipe's bytes into ``folder`` (a file named for the format) and return that file as the source."""
    try:
        raw = io.BufferedReader(PipeReader(source.path, source.shown), CHUNK)
    except OSError as exc:
        raise HeadcutError(f"cannot read {source.shown}: {exc.strerror or first_line(exc)}") from None
    with raw:
        compression = stream_compression(raw, source)
        target = folder / f"data{source.suffix}{compression or ''}"
        written, next_check = 0, 0
        reserve = min(MIN_FREE_BYTES, shutil.disk_usage(folder).free // 2)  # what the copy leaves free
        with target.open("xb") as out:
            while True:
                chunk = read_chunk(raw, source)
                if not chunk:
                    break
                if not written and compression is None and source.suffix != ".parquet":
                    _check_text_head(chunk, source, encoding)
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise HeadcutError(
                        f"cannot copy {source.shown} into the temporary folder {folder}: "
                        f"{exc.strerror or first_line(exc)}; set TMPDIR to a folder with room"
                    ) from None
                written += len(chunk)
                if written >= next_check:
                    if shutil.disk_usage(folder).free < reserve:
                        raise HeadcutError(
                            f"stopped reading {source.shown} after {written / 1e6:.0f} MB: the temporary folder "
                            f"{folder.parent} is nearly full; set TMPDIR to a folder with more room, or save the "
                            "data to a file first"
                        )
                    next_check = written + (64 << 20)
    if not written:
        raise HeadcutError(f"{source.shown} is empty (nothing was written to it)")
    return DataSource(target, source.shown, False, source.suffix, compression)


def _check_text_head(head: bytes, source: DataSource, encoding: str) -> None:
    """The first bytes of a text table are ``encoding`` text without NUL characters."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    try:
        text = decoder.decode(head, final=False)
    except UnicodeDecodeError as exc:
        raise not_text_error(source, encoding, exc, exc.start) from None
    if "\x00" in text:
        raise nul_error(source, encoding)


_JSON_KINDS = {"-": "number", '"': "string", "t": "boolean", "f": "boolean", "n": "null"}


def _check_table(source: DataSource, encoding: str) -> None:
    """Refuse a local table whose first bytes already say it cannot be read: not ``encoding`` text, NUL
    characters, a JSON file that holds a single value, a JSON Lines file whose first line is not a record."""
    if source.suffix == ".parquet":
        return
    for text in decoded(source, encoding):
        start = text.lstrip()
        if not start:
            continue
        if source.suffix == ".json" and start[0] not in "[{":
            kind = "number" if start[0].isdigit() else _JSON_KINDS.get(start[0], "value that is not JSON")
            raise HeadcutError(
                f"{source.shown} holds a JSON {kind}, not records: a .json file holds a list of records (or an "
                "object with one field holding them); one record per line is .jsonl"
            )
        if source.suffix == ".jsonl" and start[0] != "{":
            raise HeadcutError(
                f"{source.shown}: its first line is not a JSON object; a .jsonl file holds one record "
                '({"column": value, ...}) per line'
            )
        return


@contextlib.contextmanager
def quiet_datasets() -> Iterator[Any]:
    """Yield the ``datasets`` module with its progress bars, logging (and the Hub's) and Python warnings
    silenced: a failure is one HeadcutError with nothing printed before it."""
    import datasets
    from datasets.utils import logging as ds_logging
    from huggingface_hub.utils import logging as hub_logging

    bars_were_off = datasets.are_progress_bars_disabled()
    verbosity, hub_verbosity = ds_logging.get_verbosity(), hub_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity(logging.CRITICAL + 1)  # not even "Failed to read file ..." before our error
    hub_logging.set_verbosity(logging.CRITICAL + 1)  # no retry messages
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield datasets
    finally:
        ds_logging.set_verbosity(verbosity)
        hub_logging.set_verbosity(hub_verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


def _decode_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, UnicodeDecodeError) or "can't decode byte" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _load_table(source: DataSource, cache: Path, encoding: str) -> Any:
    """A ``datasets.Dataset`` of a local table file (``source.shown``: the path the user gave)."""
    builder, options = FILE_FORMATS[source.suffix]
    options = dict(options)
    if builder in ("csv", "json") and not is_utf8(encoding):
        options["encoding"] = encoding
    files = str(source.path)
    with quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=str(cache), **options)
            if source.suffix == ".json" and len(ds.column_names) == 1 and _holds_records(ds[ds.column_names[0]][:1]):
                # {"data": [{...}, ...]}: the records are in one field
                ds = datasets.load_dataset(
                    builder, data_files=files, split="train", cache_dir=str(cache), field=ds.column_names[0], **options
                )
        except Exception as exc:  # pandas, pyarrow and json parsers raise many kinds
            if _decode_failure(exc):
                for _ in decoded(source, encoding):  # raises the exact offset and a likely encoding
                    pass
            message = root_message(exc)
            if "corresponds to no data" in message or "at least one example" in message:
                raise HeadcutError(f"{source.shown} has no examples") from None
            raise HeadcutError(f"cannot read {source.shown}: {message}") from None
    return ds


def _check_file(source: DataSource) -> None:
    """Refuse a local data file this process cannot open, or an empty one."""
    try:
        size = source.path.stat().st_size
        with source.path.open("rb"):
            pass
    except OSError as exc:
        raise HeadcutError(f"cannot read {source.shown}: {exc.strerror or first_line(exc)}") from None
    if size == 0:
        raise HeadcutError(f"{source.shown} is empty")


def precheck(config: DataConfig) -> None:
    """Refuse, before any model is loaded, a local data file that the run would refuse after loading it: one that
    cannot be opened or is empty, a table that is not ``config.encoding`` text anywhere in it (a table is read
    whole) or whose start is not its format, a ``.txt`` file whose first :data:`CHUNK` bytes are not (a text file
    is read lazily, as far as the run needs). A pipe can be read only once: only its kind is checked here."""
    path = str(config.path)
    if not looks_local(path):
        return
    source = data_source(path, config.data_format)
    if source.stream:
        return
    _check_file(source)
    if source.suffix == ".parquet":
        return
    encoding = str(config.encoding)
    if source.suffix == ".txt":
        next(decoded(source, encoding), None)
        return
    _check_table(source, encoding)
    for _ in decoded(source, encoding):
        pass


@contextlib.contextmanager
def open_data(config: DataConfig) -> Iterator[tuple[Any, str, bool]]:
    """Yield ``(dataset, source, is_txt)`` for ``config.path``: a ``datasets.Dataset`` of a local table
    (cached in a temporary folder, removed on exit), a lazy :class:`TextFile` of a ``.txt`` file or pipe,
    or a ``datasets.Dataset`` of a ``datasets`` name and split."""
    path = str(config.path)
    encoding = str(config.encoding)
    if looks_local(path):
        source = data_source(path, config.data_format)
        remove_stale_scratch()
        if not source.stream:
            _check_file(source)
        if source.suffix == ".txt":
            yield TextFile(source, encoding), str(source.path), True
            return
        with temp_folder() as folder:
            local = _copy_stream(source, folder, encoding) if source.stream else source
            local = DataSource(local.path, path, False, local.suffix, local.compression)
            _check_table(local, encoding)
            ds = _load_table(local, folder / "cache", encoding)
            if ds.num_rows == 0:
                raise HeadcutError(f"{path} has no examples")
            yield ds, str(source.path), False
        return
    name, _, cfg = path.partition(":")
    cfg_name = config.config_name or cfg or None
    with quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, cfg_name, split=config.split)
        except Exception as exc:  # network, missing dataset/config/split: all one-line errors
            shown = name + (f":{cfg_name}" if cfg_name else "")
            hint = "" if ":" in path else f" (a local file needs an existing path, e.g. ./{path})"
            raise HeadcutError(
                f"cannot load the datasets dataset {shown!r} (split {config.split!r}): {root_message(exc)}{hint}"
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
    with quiet_datasets() as datasets:
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
                raise HeadcutError(f"cannot make a dataset of the list of rows: {root_message(exc)}") from None
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
