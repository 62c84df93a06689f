"""Atomic writing of a folder (:class:`OutputDir`) or a file (:class:`OutputFile`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import HeadcutError
from ..interrupts import Interrupted, deferred_signals
from . import space  # space.free_space looked up at each call (tests stand in for it)
from .leftovers import remove_path, remove_stale
from .lock import RunLock
from .names import OLD_TAG, REPORT_FILES, TMP_TAG, check_names, embedded_name, real_path, temp_suffix
from .space import os_error, space_error, write_error
from .special import FIFO_NOTICE_S, NOCTTY, THROUGH, descriptor_of, flush_std, special_kind, write_all

try:  # POSIX; elsewhere a descriptor's access mode is not checked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def headcut_wrote(folder: Path) -> bool:
    """Whether ``folder`` holds a headcut report or a config.json with a headcut record."""
    if any((folder / name).is_file() for name in REPORT_FILES):
        return True
    config = folder / "config.json"
    if not config.is_file():
        return False
    try:
        return isinstance(json.loads(config.read_text()).get("headcut"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def _listing(folder: Path, limit: int = 4) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _probe_folder(folder: Path, what: str) -> None:
    """Refuse a folder that cannot take a new file (read-only, no permission, full)."""
    with deferred_signals():
        try:
            fd, probe = tempfile.mkstemp(prefix=f".headcut-probe-{os.getpid()}-", dir=folder)
        except OSError as exc:
            raise os_error(f"write {what} in", folder, exc) from None
        os.close(fd)
        os.unlink(probe)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _usual_modes(folder: Path) -> None:
    """Give a staged folder and its files the modes a plain ``mkdir``/``open`` would (temporary folders
    and files are private while they are written)."""
    mask = _umask()
    with contextlib.suppress(OSError):
        for p in folder.rglob("*"):
            if p.is_file() and not p.is_symlink():
                p.chmod(0o666 & ~mask)
        folder.chmod(0o777 & ~mask)


class OutputDir:
    """A folder written as a whole (``--out``): checked up front, locked, written atomically.

    ``force``: replace an existing non-empty folder, provided headcut wrote it. ``owned``: the caller
    owns the path (headcut's own caches), so any existing content may be replaced, and a second
    process that builds the same cache waits for the first instead of being refused."""

    def __init__(
        self, path: str | os.PathLike[str], force: bool = False, flag: str = "--out", owned: bool = False
    ) -> None:
        self.path = Path(path).expanduser()
        self.force = force
        self.flag = flag
        self.owned = owned
        self.lock = RunLock(self.path, wait=owned)
        #: whether this run's output is in place (a stop signal after that leaves the new, complete output)
        self.committed = False

    def _existing_ok(self) -> None:
        p = self.path
        if not p.exists() and not p.is_symlink():
            return
        if p.is_symlink() and not p.exists():
            raise HeadcutError(f"{self.flag} {p} is a broken symbolic link")
        kind = special_kind(p)
        if kind is not None:
            kind = "descriptor of this process" if kind == "descriptor" else kind
            raise HeadcutError(
                f"{self.flag} {p} is a {kind}, not a folder; headcut writes a folder there and never "
                "replaces special files: choose another path"
            )
        if not p.is_dir():
            raise HeadcutError(f"{self.flag} {p} exists and is not a folder; headcut writes a folder there")
        if not any(p.iterdir()) or self.owned:
            return
        if not self.force:
            raise HeadcutError(f"{self.flag} {p} already exists and is not empty; pass --force to replace it")
        if not headcut_wrote(p):
            raise HeadcutError(
                f"{self.flag} {p} is not empty and headcut did not write it (it holds "
                f"{_listing(p)}); --force replaces only folders headcut wrote: choose another "
                "path or empty it yourself"
            )

    def check(self) -> OutputDir:
        """Refuse what cannot or may not be written, before any work (one-line errors)."""
        check_names(self.path, self.flag)
        self._existing_ok()
        parent = real_path(self.path).parent
        ancestor = parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise HeadcutError(f"{self.flag} {self.path}: {ancestor} is a file, not a folder")
        _probe_folder(ancestor, self.flag)
        return self

    def acquire(self) -> OutputDir:
        """Lock the output for this run and remove temporaries that earlier, killed runs left."""
        self.lock.acquire()
        remove_stale(real_path(self.path), all_of_them=True)
        return self

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> OutputDir:
        self.check()
        return self.acquire()

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.release()
        if isinstance(exc, KeyboardInterrupt):
            raise self.interrupted(exc) from None

    def interrupted(self, exc: KeyboardInterrupt) -> Interrupted:
        """The stop of a run writing this output, saying what the output is now: the new, complete one (the signal
        came after it was put in place, or while it was), or the earlier one, untouched."""
        signum = int(getattr(exc, "signum", signal.SIGINT))
        if self.committed:
            return Interrupted(signum, f"{self.path} was written completely before the signal came")
        hint = getattr(exc, "hint", None)
        if hint is None:
            with contextlib.suppress(OSError):
                if self.path.is_dir() and any(self.path.iterdir()):
                    hint = f"nothing was written: {self.path} still holds its earlier output"
        return Interrupted(signum, hint)

    @contextmanager
    def staging(self, need: int | None = None) -> Iterator[Path]:
        """Yield an empty temporary folder beside the output; on success it becomes the output, on any
        error or interruption it is removed and the output is left as it was. ``need``: the bytes the output will
        hold at least (its tensors), when known: a file system with less free space is refused before anything is
        written, and a full one named with it."""
        self._existing_ok()  # again: the folder may have changed while the run worked
        final = real_path(self.path)
        free = space.free_space(final.parent)
        if need is not None and free is not None and free < need:
            raise space_error("write", self.path, final.parent, need)
        tmp: Path | None = None
        try:
            # a stop signal waits until the folder is named here, so the cleanup below can remove it
            with deferred_signals():
                try:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    prefix = f".{embedded_name(final.name)}{TMP_TAG}{os.getpid()}-"
                    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
                except OSError as exc:
                    raise os_error("write", self.path, exc) from None
            try:
                yield tmp
            except Exception as exc:  # a full disk, a read-only folder, safetensors' I/O errors: one line
                error = write_error(exc, "write", self.path, final.parent, need, free=free)
                if error is None:
                    raise
                raise error from None
            try:
                with deferred_signals():  # never stop between moving the old output aside and the new one in
                    self._commit(tmp, final)
                    self.committed = True
            except KeyboardInterrupt as exc:  # a signal held while the output was put in place
                if not self.committed:
                    raise
                raise self.interrupted(exc) from None
        except BaseException:
            if tmp is not None and not self.committed:
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _commit(self, tmp: Path, final: Path) -> None:
        _usual_modes(tmp)
        if final.is_dir() and any(final.iterdir()):
            self._existing_ok()
            old = final.with_name(f".{embedded_name(final.name)}{OLD_TAG}{os.getpid()}-{os.urandom(4).hex()}")
            try:
                os.rename(final, old)
                os.rename(tmp, final)
            except OSError as exc:
                if old.exists() and not final.exists():
                    os.rename(old, final)
                raise os_error("replace", self.path, exc) from None
            remove_path(old)
            return
        try:
            # rename never replaces a non-empty folder: a run that finished first keeps its output
            os.rename(tmp, final)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise HeadcutError(
                    f"{self.flag} {self.path} was written by another run while this one worked; "
                    "nothing was replaced (pass --force to replace it)"
                ) from None
            if exc.errno == errno.ENOTDIR:
                raise HeadcutError(
                    f"{self.flag} {self.path} became a file while this run worked; nothing was written"
                ) from None
            raise os_error("write", self.path, exc) from None


class OutputFile:
    """A single output file (``--json``, ``--trajectory``, ``--plot``): checked up front, written
    through a temporary file beside it and renamed, so it is whole or absent.

    A special file is never replaced (see the module's docstring): a descriptor of this process
    (``/dev/stdout``, ``/dev/fd/N``), a character device or a named pipe (FIFO), also behind a
    symbolic link, is written through, with nothing created beside it; :meth:`temp` then gives a
    private temporary in the system's temporary folder, whose bytes :meth:`commit` copies through.
    Sockets, block devices and other special files are refused by :meth:`check`.

    A named pipe with no reader: the write waits for one (a reader may well start later, as with
    ``mkfifo``), printing a plain line on stderr at once and every ``FIFO_NOTICE_S`` (15) seconds while
    it waits; Ctrl-C or SIGTERM stops it like any other wait. A reader that goes away mid-write ends
    in a one-line error (a broken pipe)."""

    def __init__(self, path: str | os.PathLike[str], flag: str, force: bool = True) -> None:
        self.path = Path(path).expanduser()
        self.flag = flag
        self.force = force

    def special(self) -> str | None:
        """What the output is when it is written through (``descriptor``, ``character device``, ``named
        pipe``); None for a regular file or a new one. Any other special file is refused."""
        kind = special_kind(self.path)
        if kind is None or kind in THROUGH:
            return kind
        raise HeadcutError(
            f"{self.flag} {self.path} is a {kind}: headcut writes regular files, and writes through "
            "character devices (such as /dev/stdout) and pipes, nothing else; give a file path"
        )

    def check(self) -> OutputFile:
        """Refuse what cannot or may not be written, before any work (one-line errors)."""
        p = self.path
        check_names(p, self.flag)
        kind = self.special()
        if kind == "descriptor":
            self._descriptor()
        if kind is not None:
            return self  # written through: nothing is probed, swept or replaced beside a special file
        if p.is_dir():
            raise HeadcutError(f"{self.flag} {p} is a folder; give a file path")
        if p.exists() and not self.force:
            raise HeadcutError(f"{p} already exists; pass --force to replace it")
        parent = real_path(p).parent
        if not parent.is_dir():
            raise HeadcutError(f"{self.flag} {p}: the folder {parent} does not exist")
        _probe_folder(parent, self.flag)
        remove_stale(real_path(p))
        return self

    def _descriptor(self) -> int:
        """The descriptor the output names, open for writing in this process (else a one-line error)."""
        fd = descriptor_of(self.path)
        assert fd is not None
        if fcntl is None:  # pragma: no cover - Windows
            return fd
        try:
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except (OSError, OverflowError):
            raise HeadcutError(f"{self.flag} {self.path}: descriptor {fd} is not open in this process") from None
        if mode == os.O_RDONLY:
            raise HeadcutError(f"{self.flag} {self.path}: descriptor {fd} is open for reading only") from None
        return fd

    def temp(self) -> Path:
        """A fresh temporary path beside the file (rename it over the file with :meth:`commit`); for an
        output written through, a private temporary file in the system's temporary folder."""
        if self.special() is not None:
            fd, name = tempfile.mkstemp(prefix=f"headcut-through-{os.getpid()}-", suffix=temp_suffix(self.path.name))
            os.close(fd)
            return Path(name)
        check_names(self.path, self.flag)
        final = real_path(self.path)
        return final.with_name(
            f".{embedded_name(final.name)}{TMP_TAG}{os.getpid()}-{os.urandom(4).hex()}{temp_suffix(final.name)}"
        )

    def commit(self, tmp: Path) -> None:
        """Move the finished temporary ``tmp`` into place: a rename over a regular file (or none), or
        its bytes written through a special file (and ``tmp`` removed)."""
        try:
            through = self.special() is not None
        except HeadcutError:
            remove_path(tmp)
            raise
        if through:
            try:
                data = tmp.read_bytes()
            except OSError as exc:
                raise os_error("write", self.path, exc) from None
            finally:
                remove_path(tmp)
            self.write_through(data)
            return
        with contextlib.suppress(OSError):
            tmp.chmod(0o666 & ~_umask())
        try:
            os.replace(tmp, real_path(self.path))
        except OSError as exc:
            remove_path(tmp)
            raise os_error("write", self.path, exc) from None

    def write_through(self, data: bytes) -> None:
        """Write ``data`` through the special file the output names (see the class docstring)."""
        kind = self.special()
        if kind is None:  # a regular file (again): the atomic write
            self.write_bytes(data)
            return
        flush_std()
        fd = self._descriptor() if kind == "descriptor" else None
        try:
            if fd is not None:
                write_all(fd, data)
                return
            fd = self._open_pipe() if kind == "named pipe" else os.open(self.path, os.O_WRONLY | NOCTTY)
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise os_error("write", self.path, exc) from None

    def _open_pipe(self) -> int:
        """Open the named pipe for writing; wait (saying so on stderr) while it has no reader."""
        said: float | None = None
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | NOCTTY)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                now = time.monotonic()
                if said is None or now - said >= FIFO_NOTICE_S:
                    print(
                        f"waiting for a reader of the named pipe {self.path} ({self.flag}); open it for reading, "
                        "or press Ctrl-C",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = now
                time.sleep(0.05)
                continue
            os.set_blocking(fd, True)
            return fd

    def write_bytes(self, data: bytes) -> None:
        """Write ``data`` to the output: atomically, or through a special file."""
        if self.special() is not None:
            self.write_through(data)
            return
        tmp = self.temp()
        try:
            tmp.write_bytes(data)
        except OSError as exc:
            remove_path(tmp)
            raise os_error("write", self.path, exc) from None
        except BaseException:
            remove_path(tmp)
            raise
        self.commit(tmp)

    def write_text(self, text: str) -> None:
        """Write ``text`` (UTF-8) to the output: atomically, or through a special file."""
        self.write_bytes(text.encode("utf-8"))


def atomic_dir(
    out: str | os.PathLike[str], force: bool = False, owned: bool = False
) -> contextlib.AbstractContextManager[Path]:
    """Check, lock and stage ``out`` in one step (for writers whose work is all inside the block)."""

    @contextmanager
    def run() -> Iterator[Path]:
        with OutputDir(out, force, owned=owned) as target, target.staging() as tmp:
            yield tmp

    return run()


# ---- a command's outputs, checked before its work --------------------------------------------------------
