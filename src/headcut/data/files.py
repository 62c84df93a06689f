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

import bz2
import codecs
import contextlib
import gzip
import io
import logging
import lzma
import os
import select
import shutil
import stat
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import HeadcutError, first_line
from ..extras import imported
from ..files.leftovers import remove_stale_scratch, scratch_folder
from ..sources import looks_local
from .config import COMPRESSIONS, FILE_FORMATS, FORMAT_NAMES, DataConfig, parse_format

#: seconds of silence on a pipe before the first "waiting for data" line, and between the later ones
FIRST_NOTICE_S = 2.0
WAIT_NOTICE_S = 10.0
#: bytes read at a time from a file or pipe
CHUNK = 1 << 18
#: characters per tokenizer call when a text is cut into causal-LM blocks (a fast tokenizer needs about a
#: hundred bytes per character while it works)
PIECE_CHARS = 1 << 15
#: a pipe copied into the temporary folder stops with an error before its disk keeps less free space than
#: this (or half of what it had, on a disk that had less than twice this)
MIN_FREE_BYTES = 512 << 20
#: the kind of the temporary folders (``headcut-data-PID-...``)
TEMP_KIND = "data"
#: first bytes of compressed data -> its suffix
MAGIC = {b"\x1f\x8b": ".gz", b"BZh": ".bz2", b"\xfd7zXZ\x00": ".xz", b"\x28\xb5\x2f\xfd": ".zst"}


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


@dataclass(frozen=True)
class DataSource:
    """A local data path and how to read it: ``shown`` (as given, for messages), ``stream`` (a pipe or
    device: read once, never sized or reopened), ``suffix`` (its format, e.g. ``.csv``) and
    ``compression`` (``.gz`` ... or None)."""

    path: Path
    shown: str
    stream: bool
    suffix: str
    compression: str | None


def _kind_of(mode: int) -> str:
    return "pipe" if stat.S_ISFIFO(mode) else "device" if stat.S_ISCHR(mode) else "file"


def data_source(path: str, data_format: str | None = None) -> DataSource:
    """The :class:`DataSource` of a local data path: its format from its name, else from ``data_format``."""
    p = Path(path).expanduser()
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise HeadcutError(f"data file not found: {path}") from None
    except OSError as exc:
        raise HeadcutError(f"cannot read {path}: {exc.strerror or first_line(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise HeadcutError(f"{path} is a folder; pass a data file (.csv, .tsv, .json, .jsonl, .parquet, .txt)")
    if stat.S_ISSOCK(st.st_mode):
        raise HeadcutError(f"{path} is a socket; pass a data file or a pipe")
    stream = stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)
    suffixes = [s.lower() for s in p.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else None
    suffix = suffixes[-1] if suffixes else ""
    if suffix in FILE_FORMATS and not (compression and suffix == ".parquet"):
        return DataSource(p, path, stream, suffix, compression)
    if data_format is not None and suffix != ".parquet":
        suffix, given = parse_format(data_format)
        if not (suffix == ".parquet" and (given or compression)):
            return DataSource(p, path, stream, suffix, given or compression)
    if stream:
        raise HeadcutError(
            f"{path} is a {_kind_of(st.st_mode)} and its name does not say the data's format; pass --data-format "
            f"({FORMAT_NAMES}; e.g. csv.gz for compressed data)"
        )
    raise HeadcutError(
        f"{path} is not a supported data file; use .csv, .tsv, .json, .jsonl, .parquet or .txt "
        f"(text formats may be compressed: {', '.join(COMPRESSIONS)}), or name its format with --data-format"
    )


# ---- reading bytes: files, pipes, compression ---------------------------------------------------------------


class _PipeReader(io.RawIOBase):
    """A pipe or device opened without blocking and polled: a pipe with no writer does not hang the open,
    a silent one gets a line on stderr after :data:`FIRST_NOTICE_S` seconds and every :data:`WAIT_NOTICE_S` after, and signals stop the wait."""

    def __init__(self, path: Path, shown: str) -> None:
        super().__init__()
        self.shown = shown
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.received = 0

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def _wait(self) -> None:
        """Until the pipe has data or its end (Linux: a FIFO opened before any writer reports neither)."""
        timeout = FIRST_NOTICE_S
        while True:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(self.fd, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
                ready = bool(poller.poll(timeout * 1000))
            else:  # pragma: no cover - platforms without poll()
                ready = bool(select.select([self.fd], [], [], timeout)[0])
            if ready:
                return
            timeout = WAIT_NOTICE_S
            if self.received:
                what = f"more data on {self.shown} ({self.received / 1e6:.1f} MB read so far)"
            else:
                what = f"data on {self.shown} (nothing written to it yet)"
            print(f"waiting for {what}; Ctrl-C to stop", file=sys.stderr, flush=True)

    def readinto(self, buffer: Any) -> int:
        while True:
            self._wait()
            try:
                data = os.read(self.fd, len(buffer))
            except BlockingIOError:  # woken without data (a writer connected): wait again
                time.sleep(0.01)
                continue
            buffer[: len(data)] = data
            self.received += len(data)
            return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def _decompressed(raw: IO[bytes], compression: str | None) -> IO[bytes]:
    if compression is None:
        return raw
    if compression == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if compression == ".bz2":
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if compression == ".xz":
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    zstandard = imported(
        "zstandard",
        "reading .zst data",
        "pip install zstandard",
        missing="reading .zst data needs the zstandard package: pip install zstandard",
    )
    return zstandard.ZstdDecompressor().stream_reader(raw)  # type: ignore[no-any-return]


def _sniff(raw: io.BufferedReader) -> str | None:
    """The compression whose magic bytes the stream starts with (None: none)."""
    head = raw.peek(8)[:8]
    return next((suffix for magic, suffix in MAGIC.items() if head.startswith(magic)), None)


@contextlib.contextmanager
def _opened(source: DataSource) -> Iterator[IO[bytes]]:
    """The decompressed bytes of ``source`` (a stream's compression recognised from its first bytes)."""
    try:
        if source.stream:
            raw: io.BufferedReader = io.BufferedReader(_PipeReader(source.path, source.shown), CHUNK)
        else:
            raw = open(source.path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise HeadcutError(f"cannot read {source.shown}: {exc.strerror or first_line(exc)}") from None
    with raw:
        compression = source.compression
        if source.stream:
            compression = _stream_compression(raw, source)
        with contextlib.closing(_decompressed(raw, compression)) as data:
            yield data


def _stream_compression(raw: io.BufferedReader, source: DataSource) -> str | None:
    """The compression of a stream: from its first bytes (``source.compression`` must match them)."""
    if not raw.peek(8):  # nothing at all: reported as empty
        return source.compression
    found = _sniff(raw)
    if source.compression and found != source.compression:
        raise HeadcutError(
            f"{source.shown} is not {source.compression.lstrip('.')} data (its first bytes are not "
            f"a {source.compression.lstrip('.')} header); drop the compression from --data-format"
        )
    return found


def _read(f: IO[bytes], source: DataSource, size: int = CHUNK) -> bytes:
    """The next bytes of ``f``, with one-line errors for broken compression and failed reads."""
    try:
        return f.read(size)
    except (EOFError, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise HeadcutError(
            f"cannot read {source.shown}: its {source.compression or 'compressed'} data is damaged or "
            f"truncated ({first_line(exc)})"
        ) from None
    except OSError as exc:
        raise HeadcutError(f"cannot read {source.shown}: {exc.strerror or first_line(exc)}") from None
    except Exception as exc:  # zstandard.ZstdError and the like
        raise HeadcutError(f"cannot read {source.shown}: {first_line(exc)}") from None


# ---- text: decoding, lines, pieces ----------------------------------------------------------------------------


def _is_utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name == "utf-8"


def guess_encoding(sample: bytes) -> str:
    """A likely encoding of bytes that are not UTF-8 (cheap: byte-order marks and byte ranges only)."""
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")) or sample[1:200:2].count(0) > 40:
        return "utf-16"
    high = {b for b in sample if 0x80 <= b <= 0x9F}
    if high and not high & {0x81, 0x8D, 0x8F, 0x90, 0x9D}:  # bytes cp1252 maps (curly quotes, dashes, euro)
        return "cp1252"
    return "latin-1"


def _not_text(source: DataSource, encoding: str, exc: UnicodeDecodeError, offset: int) -> HeadcutError:
    """The error for bytes that are not ``encoding`` text (``offset``: of the first bad byte in the file)."""
    byte = exc.object[exc.start] if exc.start < len(exc.object) else None
    sample = exc.object[:4096] if exc.start < 4096 else exc.object[exc.start - 2048 : exc.start + 2048]
    where = f"byte 0x{byte:02x} at offset {offset}" if byte is not None else f"offset {offset}"
    if _is_utf8(encoding):
        return HeadcutError(
            f"cannot read {source.shown}: it is not UTF-8 text ({where}); pass --encoding "
            f"{guess_encoding(sample)} (or the file's encoding)"
        )
    return HeadcutError(
        f"cannot read {source.shown}: it is not {encoding} text ({where}); pass the file's encoding with --encoding"
    )


def _nul_error(source: DataSource, encoding: str) -> HeadcutError:
    if _is_utf8(encoding):
        return HeadcutError(
            f"cannot read {source.shown}: it holds NUL characters, so it is not UTF-8 text; if it is "
            "UTF-16 text, pass --encoding utf-16"
        )
    return HeadcutError(f"cannot read {source.shown}: it holds NUL characters, so it is not {encoding} text")


def decoded(source: DataSource, encoding: str) -> Iterator[str]:
    """The text of ``source`` in chunks (``CHUNK`` bytes each), newlines made ``\\n``: a byte that is not
    ``encoding`` text, or a NUL character, is a one-line error naming its offset and a likely encoding."""
    with _opened(source) as data:
        decoder = codecs.getincrementaldecoder(encoding)("strict")
        offset, carry_cr, first = 0, "", True
        while True:
            chunk = _read(data, source)
            if first and not chunk:
                raise HeadcutError(f"{source.shown} is empty")
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise _not_text(source, encoding, exc, offset - pending + exc.start) from None
            offset += len(chunk)
            if first:
                text, first = text.removeprefix("\ufeff"), False
            if "\x00" in text:
                raise _nul_error(source, encoding)
            text = carry_cr + text
            carry_cr = ""
            if chunk and text.endswith("\r"):
                text, carry_cr = text[:-1], "\r"
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            if text:
                yield text
            if not chunk:
                return


class TextFile:
    """A ``.txt`` data file (or pipe) read lazily: never whole, one chunk of :data:`CHUNK` bytes at a time
    (a pipe can be read once). ``column_names``: the one column, ``text``, as for a table."""

    column_names = ("text",)

    def __init__(self, source: DataSource, encoding: str = "utf-8") -> None:
        self.source, self.encoding = source, encoding

    def lines(self, max_chars: int, limit: int | None = None) -> tuple[list[str], bool]:
        """``(lines, stopped)``: the non-blank lines, each cut to ``max_chars`` characters; at most
        ``limit`` of them (``stopped``: the file was not read to its end)."""
        out: list[str] = []
        current: list[str] = []
        room = max_chars

        def finish() -> None:
            nonlocal current, room
            line = "".join(current)
            if line.strip():
                out.append(line)
            current, room = [], max_chars

        for text in decoded(self.source, self.encoding):
            parts = text.split("\n")
            for i, part in enumerate(parts):
                if i:
                    finish()
                    if limit is not None and len(out) >= limit:
                        return out, True
                if room > 0 and part:
                    current.append(part[:room])
                    room -= min(room, len(part))
        finish()
        if limit is not None and len(out) > limit:
            return out[:limit], True
        return out, False

    def pieces(self) -> Iterator[str]:
        """The whole text (its lines joined by ``\\n``) in pieces (see :func:`pieces_of`)."""
        return pieces_of(decoded(self.source, self.encoding), strip_final_newline=True)


def pieces_of(chunks: Iterable[str], strip_final_newline: bool = False) -> Iterator[str]:
    """The text of ``chunks`` (consecutive parts of one text) in pieces of at most :data:`PIECE_CHARS`
    characters, cut before a line break or space where there is one, so that tokenizing the pieces one by one
    gives the tokens of the whole text (up to a start-of-text marker some tokenizers add to each piece: one
    token in thousands at most) at a small, bounded cost each. ``strip_final_newline``: drop the line break
    that ends the last line of a file."""
    carry = ""
    for text in chunks:
        buffer, start = carry + text, 0
        while len(buffer) - start > PIECE_CHARS:
            end = start + PIECE_CHARS
            cut = buffer.rfind("\n", start + 1, end)
            if cut < 0:
                cut = max(buffer.rfind(" ", start + 1, end), buffer.rfind("\t", start + 1, end))
            if cut < 0:  # no space in a long run: cut anywhere
                cut = end
            yield buffer[start:cut]
            start = cut
        carry = buffer[start:]
    if strip_final_newline:
        carry = carry.removesuffix("\n")
    if carry:
        yield carry


# ---- temporary folders -------------------------------------------------------------------------------------


@contextlib.contextmanager
def temp_folder() -> Iterator[Path]:
    """A private temporary folder ``headcut-data-PID-*``, removed on exit (those of dead runs are removed first:
    :func:`headcut.files.leftovers.scratch_folder`)."""
    with scratch_folder(TEMP_KIND) as folder:
        yield folder


def _copy_stream(source: DataSource, folder: Path, encoding: str) -> DataSource:
    """Copy a pipe's bytes into ``folder`` (a file named for the format) and return that file as the source."""
    try:
        raw = io.BufferedReader(_PipeReader(source.path, source.shown), CHUNK)
    except OSError as exc:
        raise HeadcutError(f"cannot read {source.shown}: {exc.strerror or first_line(exc)}") from None
    with raw:
        compression = _stream_compression(raw, source)
        target = folder / f"data{source.suffix}{compression or ''}"
        written, next_check = 0, 0
        reserve = min(MIN_FREE_BYTES, shutil.disk_usage(folder).free // 2)  # what the copy leaves free
        with target.open("xb") as out:
            while True:
                chunk = _read(raw, source)
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
        raise _not_text(source, encoding, exc, exc.start) from None
    if "\x00" in text:
        raise _nul_error(source, encoding)


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


# ---- datasets ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
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
    if builder in ("csv", "json") and not _is_utf8(encoding):
        options["encoding"] = encoding
    files = str(source.path)
    with _quiet_datasets() as datasets:
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
            message = _root_message(exc)
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
