"""Where headcut writes, and how (the guarantees of the README's "Safety" section).

* **Checked before work starts.** :func:`check_paths` refuses an output that is, contains or lies
  inside one of the run's inputs (the checkpoint, data, teacher, mask), an input that lies inside a
  folder the run would replace, and two outputs that overlap; paths are compared after resolving
  symbolic links. :meth:`OutputDir.check` and :meth:`OutputFile.check` refuse what cannot be written
  (a file where a folder goes, a missing parent folder, a folder that refuses a test write).
* **What ``--force`` replaces.** Only an empty folder or a folder headcut wrote (it holds a headcut
  report, or a ``config.json`` with a ``headcut`` record); any other non-empty folder is refused
  with a message naming what is in it, with or without ``--force``.
* **Atomic.** A folder is written into a temporary folder beside it, then renamed; a file into a
  temporary file, then renamed. Without ``--force`` the rename never replaces what another run put
  there in the meantime. Temporaries are named ``.NAME.headcut-tmp-PID-XXXX``; a run removes those
  a dead process left behind (SIGKILL cannot be caught).
* **One writer.** :class:`RunLock` (an exclusive lock file ``.NAME.headcut-lock`` beside the output)
  refuses a second run that writes the same output, and a second trainer on the same checkpoint
  folder, while the first one is alive. The operating system releases the lock of a killed process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import HeadcutError
from .interrupts import deferred_signals

try:  # POSIX; elsewhere RunLock falls back to an exclusive-create pid file
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: files whose presence marks a folder as written by headcut (reports; config.json is checked apart)
REPORT_FILES = ("headcut-report.json", "headcut-finetune.json")
TMP_TAG = ".headcut-tmp-"
OLD_TAG = ".headcut-old-"
LOCK_TAG = ".headcut-lock"
#: the suffix of the resume-checkpoint folder a training command keeps beside ``--out``
CHECKPOINT_SUFFIX = ".headcut-checkpoint"


def checkpoint_dir_for(out: str | os.PathLike[str]) -> Path:
    """The checkpoint folder of a run writing ``out``: ``<out>.headcut-checkpoint`` beside it."""
    path = Path(out).expanduser()
    return path.with_name(path.name + CHECKPOINT_SUFFIX)


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute with every symbolic link resolved (also for parts that do not exist yet)."""
    return Path(path).expanduser().resolve(strict=False)


def inside(path: Path, folder: Path) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or folder in path.parents


def os_error(action: str, path: str | os.PathLike[str], exc: OSError) -> HeadcutError:
    """A one-line error for a failed read or write (a full disk, a read-only folder, ...)."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        why = "no space left on the device"
    elif exc.errno == errno.EROFS:
        why = "the file system is read-only"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = "permission denied"
    return HeadcutError(f"cannot {action} {path}: {why}")


def check_paths(
    reads: Mapping[str, str | os.PathLike[str] | None],
    writes: Mapping[str, str | os.PathLike[str] | None],
    replaces: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """Refuse outputs that would touch the run's inputs, before any work.

    ``reads``: flag -> local input path (the checkpoint folder, data files, teacher, mask; None or a
    non-local name is skipped). ``writes``: flag -> output path (files or folders). ``replaces``:
    flag -> folders the run may delete or replace as a whole (``--out`` and its checkpoint folder);
    an input inside one of them is refused. Symbolic links are resolved before comparing."""
    real_reads = {flag: real_path(p) for flag, p in reads.items() if p is not None}
    real_writes = {flag: real_path(p) for flag, p in writes.items() if p is not None}
    real_replaced = {flag: real_path(p) for flag, p in (replaces or {}).items() if p is not None}
    for wflag, w in {**real_writes, **real_replaced}.items():
        for rflag, r in real_reads.items():
            if w == r:
                raise HeadcutError(f"{wflag} {w} is the {rflag} input itself: headcut never writes over its inputs")
            if inside(w, r):
                raise HeadcutError(f"{wflag} {w} lies inside the {rflag} input {r}: headcut never writes into its "
                                   "inputs")
            if inside(r, w):
                raise HeadcutError(f"{wflag} {w} contains the {rflag} input {r}: writing it would delete the input")
    outs = list({**real_writes, **real_replaced}.items())
    for i, (flag_a, a) in enumerate(outs):
        for flag_b, b in outs[i + 1:]:
            if inside(a, b) or inside(b, a):
                raise HeadcutError(f"{flag_a} {a} and {flag_b} {b} overlap: give them separate paths")


def headcut_wrote(folder: Path) -> bool:
    """Whether ``folder`` holds a headcut report or a config.json with a headcut record."""
    if any((folder / name).is_file() for name in REPORT_FILES):
        return True
    config = folder / "config.json"
    if not config.is_file():
        return False
    try:
        import json

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


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def remove_stale(target: Path, all_of_them: bool = False) -> list[Path]:
    """Remove the temporaries of ``target`` (``.NAME.headcut-tmp-PID-*`` and ``.NAME.headcut-old-PID-*``
    beside it) that a dead process left; with ``all_of_them`` (the caller holds ``target``'s lock, so
    nobody else writes it) every one. Returns what was removed."""
    parent = target.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(target.name)}(?:{re.escape(TMP_TAG)}|{re.escape(OLD_TAG)})(\d+)-")
    removed = []
    for entry in parent.iterdir():
        m = pattern.match(entry.name)
        if m and (all_of_them or not _pid_alive(int(m.group(1)))):
            _remove(entry)
            removed.append(entry)
    return removed


class RunLock:
    """An exclusive lock on an output path, held for the whole run (``.NAME.headcut-lock`` beside it).

    A second run that asks for the same lock is refused at once with the owner's pid. The lock file
    is removed on :meth:`release`; a killed process's lock is released by the operating system, and
    its file is taken over by the next run."""

    def __init__(self, target: str | os.PathLike[str], what: str = "writing", wait: bool = False) -> None:
        self.target = real_path(target)
        self.path = self.target.with_name(f".{self.target.name}{LOCK_TAG}")
        self.what = what
        self.wait = wait
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = self._open()
            except OSError as exc:
                raise os_error("create the lock file", self.path, exc) from None
            if fd is None:
                continue
            self._fd = fd
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            return self

    def _owner(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def _refuse(self) -> HeadcutError:
        return HeadcutError(f"another headcut run (pid {self._owner()}) is {self.what} {self.target}; wait for it "
                            "to finish, or choose another path")

    def _open(self) -> int | None:
        if fcntl is None:  # pragma: no cover - Windows: exclusive create, a dead owner's file is taken over
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner.isdigit() and not _pid_alive(int(owner)):
                    with contextlib.suppress(OSError):
                        self.path.unlink()
                    return None
                raise self._refuse() from None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._refuse() from None
        # the previous owner may have removed the file between our open and our lock: retry on the new one
        try:
            same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return None
        return fd

    def release(self) -> None:
        if self._fd is None:
            return
        with deferred_signals():
            with contextlib.suppress(OSError):
                self.path.unlink()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class OutputDir:
    """A folder written as a whole (``--out``): checked up front, locked, written atomically.

    ``force``: replace an existing non-empty folder, provided headcut wrote it. ``owned``: the caller
    owns the path (headcut's own caches), so any existing content may be replaced, and a second
    process that builds the same cache waits for the first instead of being refused."""

    def __init__(self, path: str | os.PathLike[str], force: bool = False, flag: str = "--out",
                 owned: bool = False) -> None:
        self.path = Path(path).expanduser()
        self.force = force
        self.flag = flag
        self.owned = owned
        self.lock = RunLock(self.path, wait=owned)

    def _existing_ok(self) -> None:
        p = self.path
        if not p.exists() and not p.is_symlink():
            return
        if p.is_symlink() and not p.exists():
            raise HeadcutError(f"{self.flag} {p} is a broken symbolic link")
        if not p.is_dir():
            raise HeadcutError(f"{self.flag} {p} exists and is not a folder; headcut writes a folder there")
        if not any(p.iterdir()) or self.owned:
            return
        if not self.force:
            raise HeadcutError(f"{self.flag} {p} already exists and is not empty; pass --force to replace it")
        if not headcut_wrote(p):
            raise HeadcutError(f"{self.flag} {p} is not empty and headcut did not write it (it holds "
                               f"{_listing(p)}); --force replaces only folders headcut wrote: choose another "
                               "path or empty it yourself")

    def check(self) -> OutputDir:
        """Refuse what cannot or may not be written, before any work (one-line errors)."""
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

    def __exit__(self, *exc: Any) -> None:
        self.release()

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """Yield an empty temporary folder beside the output; on success it becomes the output, on any
        error or interruption it is removed and the output is left as it was."""
        self._existing_ok()  # again: the folder may have changed while the run worked
        final = real_path(self.path)
        tmp: Path | None = None
        try:
            # a stop signal waits until the folder is named here, so the cleanup below can remove it
            with deferred_signals():
                try:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}{TMP_TAG}{os.getpid()}-", dir=final.parent))
                except OSError as exc:
                    raise os_error("write", self.path, exc) from None
            try:
                yield tmp
            except OSError as exc:
                raise os_error("write", self.path, exc) from None
            with deferred_signals():  # never stop between moving the old output aside and the new one in
                self._commit(tmp, final)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _commit(self, tmp: Path, final: Path) -> None:
        _usual_modes(tmp)
        if final.is_dir() and any(final.iterdir()):
            self._existing_ok()
            old = final.with_name(f".{final.name}{OLD_TAG}{os.getpid()}-{os.urandom(4).hex()}")
            try:
                os.rename(final, old)
                os.rename(tmp, final)
            except OSError as exc:
                if old.exists() and not final.exists():
                    os.rename(old, final)
                raise os_error("replace", self.path, exc) from None
            _remove(old)
            return
        try:
            # rename never replaces a non-empty folder: a run that finished first keeps its output
            os.rename(tmp, final)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise HeadcutError(f"{self.flag} {self.path} was written by another run while this one worked; "
                                   "nothing was replaced (pass --force to replace it)") from None
            if exc.errno == errno.ENOTDIR:
                raise HeadcutError(f"{self.flag} {self.path} became a file while this run worked; nothing was "
                                   "written") from None
            raise os_error("write", self.path, exc) from None


class OutputFile:
    """A single output file (``--json``, ``--trajectory``, ``--plot``): checked up front, written
    through a temporary file beside it and renamed, so it is whole or absent."""

    def __init__(self, path: str | os.PathLike[str], flag: str, force: bool = True) -> None:
        self.path = Path(path).expanduser()
        self.flag = flag
        self.force = force

    def check(self) -> OutputFile:
        p = self.path
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

    def temp(self) -> Path:
        """A fresh temporary path beside the file (rename it over the file with :meth:`commit`)."""
        final = real_path(self.path)
        return final.with_name(f".{final.name}{TMP_TAG}{os.getpid()}-{os.urandom(4).hex()}{final.suffix}")

    def commit(self, tmp: Path) -> None:
        with contextlib.suppress(OSError):
            tmp.chmod(0o666 & ~_umask())
        try:
            os.replace(tmp, real_path(self.path))
        except OSError as exc:
            _remove(tmp)
            raise os_error("write", self.path, exc) from None

    def write_text(self, text: str) -> None:
        tmp = self.temp()
        try:
            tmp.write_text(text)
        except OSError as exc:
            _remove(tmp)
            raise os_error("write", self.path, exc) from None
        except BaseException:
            _remove(tmp)
            raise
        self.commit(tmp)


def atomic_dir(out: str | os.PathLike[str], force: bool = False, owned: bool = False) -> contextlib.AbstractContextManager[Path]:
    """Check, lock and stage ``out`` in one step (for writers whose work is all inside the block)."""

    @contextmanager
    def run() -> Iterator[Path]:
        with OutputDir(out, force, owned=owned) as target, target.staging() as tmp:
            yield tmp

    return run()
