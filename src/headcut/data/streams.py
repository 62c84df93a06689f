"""The bytes of a data file or pipe: where a ``--data`` path points (:class:`DataSource`: a file, a pipe or a
device, its format and compression), read in chunks, decompressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``, also
recognised from the first bytes), a silent pipe waited for with a line on stderr every :data:`WAIT_NOTICE_S`
seconds (Ctrl-C and SIGTERM stop the wait). Every failure is a one-line :class:`~headcut.errors.HeadcutError`."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import select
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import HeadcutError, first_line
from ..extras import imported
from .config import COMPRESSIONS, FILE_FORMATS, FORMAT_NAMES, parse_format

#: seconds of silence on a pipe before the first "waiting for data" line, and between the later ones
FIRST_NOTICE_S = 2.0


WAIT_NOTICE_S = 10.0


#: bytes read at a time from a file or pipe
CHUNK = 1 << 18


#: first bytes of compressed data -> its suffix
MAGIC = {b"\x1f\x8b": ".gz", b"BZh": ".bz2", b"\xfd7zXZ\x00": ".xz", b"\x28\xb5\x2f\xfd": ".zst"}


def root_message(exc: BaseException) -> str:
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


class PipeReader(io.RawIOBase):
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
def opened(source: DataSource) -> Iterator[IO[bytes]]:
    """The decompressed bytes of ``source`` (a stream's compression recognised from its first bytes)."""
    try:
        if source.stream:
            raw: io.BufferedReader = io.BufferedReader(PipeReader(source.path, source.shown), CHUNK)
        else:
            raw = open(source.path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise HeadcutError(f"cannot read {source.shown}: {exc.strerror or first_line(exc)}") from None
    with raw:
        compression = source.compression
        if source.stream:
            compression = stream_compression(raw, source)
        with contextlib.closing(_decompressed(raw, compression)) as data:
            yield data


def stream_compression(raw: io.BufferedReader, source: DataSource) -> str | None:
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


def read_chunk(f: IO[bytes], source: DataSource, size: int = CHUNK) -> bytes:
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
