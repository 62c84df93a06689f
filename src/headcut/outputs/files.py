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
* **Special files are never replaced.** A rename only ever replaces a regular file (after resolving
  symbolic links). An output file that names a descriptor of the process (``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N`` as a shell's ``>(cmd)`` gives, ``/proc/self/fd/N``) is written
  through that descriptor; a character device (``/dev/null``, a terminal) or a named pipe, also
  through a symbolic link, is opened and written through (see :class:`OutputFile` for a pipe with no
  reader). Nothing is created beside such a file (no temporary, lock or probe file, no sweep), and
  ``--force`` is not needed. Sockets, block devices and other special files are refused, and so is
  an ``--out`` folder that is any of these.
* **Names the file system takes.** A path with a name longer than the file system allows (NAME_MAX,
  255 bytes on most) is refused up front; the temporary, old-copy and lock names of a long but legal
  name embed a shortened copy of it (its start and a hash), so they fit too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import HeadcutError
from ..interrupts import Interrupted, deferred_signals

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
#: the longest name most file systems take (bytes); used where the file system cannot be asked
NAME_MAX = 255
#: the longest copy of a name that headcut's own files beside it embed (bytes): the rest of NAME_MAX
#: leaves room for ``.``, a tag, a pid, a random part and a short suffix
EMBED_MAX = 200
#: the longest suffix a temporary file keeps of its target's name (bytes)
SUFFIX_MAX = 16
#: seconds between the lines a write to a named pipe with no reader prints while it waits
FIFO_NOTICE_S = 15.0


def _cut(name: str, size: int) -> str:
    """The longest start of ``name`` whose encoded form has at most ``size`` bytes."""
    out, used = [], 0
    for ch in name:
        n = len(os.fsencode(ch))
        if used + n > size:
            break
        out.append(ch)
        used += n
    return "".join(out)


def embedded_name(name: str) -> str:
    """The copy of ``name`` that headcut's files beside it (temporaries, old copies, lock) embed: the
    name itself, or for a name too long to leave room for the additions, its start and a hash of the
    whole (the same for the same name, so a later run still recognises them)."""
    raw = os.fsencode(name)
    if len(raw) <= EMBED_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return f"{_cut(name, EMBED_MAX - len(digest) - 1)}~{digest}"


def _temp_suffix(name: str) -> str:
    suffix = Path(name).suffix
    return suffix if len(os.fsencode(suffix)) <= SUFFIX_MAX else ""


def checkpoint_dir_for(out: str | os.PathLike[str]) -> Path:
    """The checkpoint folder of a run writing ``out``: ``<out>.headcut-checkpoint`` beside it (for a
    name too long for that, the shortened copy of :func:`embedded_name`)."""
    path = Path(out).expanduser()
    name = path.name if len(os.fsencode(path.name + CHECKPOINT_SUFFIX)) <= NAME_MAX else embedded_name(path.name)
    return path.with_name(name + CHECKPOINT_SUFFIX)


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
    elif exc.errno == errno.ENAMETOOLONG:
        why = "a name in the path is longer than the file system allows"
    shown = os.fsdecode(path)
    if len(shown) > 120:
        shown = shown[:56] + "..." + shown[-56:]
    return HeadcutError(f"cannot {action} {shown}: {why}")


def size_text(n: int) -> str:
    """A byte count as people read it (``1.5 GiB``, ``320 KiB``)."""
    if n < 1024:
        return f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system is full (or the user's quota is spent): an ``OSError`` with that errno,
    or a writer's own error (safetensors' ``SafetensorError``) that carries the system's message."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    text = str(exc).lower()
    return "no space left on device" in text or "os error 28" in text or "disk quota exceeded" in text


def free_space(path: str | os.PathLike[str]) -> int | None:
    """The bytes free on the file system of ``path`` (or of its nearest existing folder); None where unknown."""
    folder = Path(path)
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def space_error(action: str, target: str | os.PathLike[str], folder: str | os.PathLike[str], need: int | None,
                hint: str = "", free: int | None = None) -> HeadcutError:
    """The one-line error of a full file system: what could not be written (``target``), the ``folder`` that has no
    room, what is free there (``free``: bytes free before the write began, else now) and about what the write
    needs (``need``: bytes, None when unknown)."""
    now = free is None
    free = free_space(folder) if free is None else free
    parts = [f"{size_text(free)} free" + ("" if now else " before writing") if free is not None else "",
             f"at least {size_text(need)} needed" if need else ""]
    told = ", ".join(p for p in parts if p)
    return HeadcutError(f"cannot {action} {os.fsdecode(target)}: no space left on the device in {os.fsdecode(folder)}"
                        + (f" ({told})" if told else "") + (f"; {hint}" if hint else ""))


def write_error(exc: BaseException, action: str, target: str | os.PathLike[str], folder: str | os.PathLike[str],
                need: int | None = None, hint: str = "", free: int | None = None) -> HeadcutError | None:
    """The one-line error of a failed write of ``target`` into ``folder``: a full file system (:func:`space_error`,
    with ``hint``), any other ``OSError`` (:func:`os_error`), or safetensors' own I/O error (not an ``OSError``);
    None for anything else (a refusal of headcut's own included)."""
    if isinstance(exc, HeadcutError):
        return None
    if no_space(exc):
        return space_error(action, target, folder, need, hint, free)
    if isinstance(exc, OSError):
        return os_error(action, target, exc)
    if type(exc).__name__ == "SafetensorError":  # safetensors' Rust error type (importing it costs the CLI a start-up)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return HeadcutError(f"cannot {action} {os.fsdecode(target)}: {why}")
    return None


def file_error(exc: OSError) -> HeadcutError | None:
    """The one-line error of an ``OSError`` about a named file that got past the checks (a path too long
    for the file system, a folder that cannot be listed, ...); None when the error names no file."""
    if exc.filename is None:
        return None
    return os_error("use", exc.filename, exc)


def _name_max(path: Path) -> tuple[int, int]:
    """The longest name and path (bytes) the file system of ``path`` (or its nearest existing folder) takes."""
    folder = path
    while True:
        try:
            if folder.is_dir():
                break
        except OSError:
            pass
        if folder.parent == folder:
            break
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return NAME_MAX, 4096


def check_names(path: str | os.PathLike[str], flag: str) -> None:
    """Refuse a path with a name longer than its file system allows (NAME_MAX), or a path too long as a
    whole (PATH_MAX), before anything touches it (the system would answer ENAMETOOLONG)."""
    full = Path(os.path.abspath(Path(path).expanduser()))
    name_max, path_max = _name_max(full.parent)
    for part in full.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            shown = part if len(part) <= 40 else part[:32] + "..." + part[-5:]
            raise HeadcutError(f"{flag}: the name {shown} is {size} bytes long and the file system allows at most "
                               f"{name_max}; choose a shorter name")
    size = len(os.fsencode(str(full)))
    if size >= path_max:
        raise HeadcutError(f"{flag}: the path is {size} bytes long and the file system allows at most {path_max - 1}; "
                           "choose a shorter path")


_DESCRIPTOR = re.compile(r"^/(?:dev/(?:fd/([0-9]{1,9})|(stdin|stdout|stderr))|proc/(self|thread-self|[0-9]{1,9})/fd/"
                         r"([0-9]{1,9}))$")
_STD = {"stdin": 0, "stdout": 1, "stderr": 2}


def descriptor_of(path: str | os.PathLike[str]) -> int | None:
    """The descriptor number when ``path`` names one of this process's descriptors (``/dev/stdout``,
    ``/dev/stderr``, ``/dev/fd/N`` as a shell's ``>(cmd)`` gives, ``/proc/self/fd/N``), also through
    symbolic links; else None."""
    text = os.path.abspath(os.path.expanduser(os.fspath(path)))
    for _ in range(8):
        m = _DESCRIPTOR.match(text)
        if m:
            fd_dev, std, proc, fd_proc = m.groups()
            if proc is not None and proc not in ("self", "thread-self") and int(proc) != os.getpid():
                return None
            return _STD[std] if std else int(fd_dev if fd_dev is not None else fd_proc)
        try:
            target = os.readlink(text)
        except OSError:
            return None
        text = os.path.normpath(os.path.join(os.path.dirname(text), target))
    return None


#: what :func:`special_kind` calls each kind of file that is neither a regular file nor a folder
_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISBLK, "block device"))
#: kinds an output file is written through (never replaced)
THROUGH = ("descriptor", "character device", "named pipe")
_NOCTTY = getattr(os, "O_NOCTTY", 0)  # opening a terminal never makes it this process's controlling one


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (after resolving symbolic links):
    ``descriptor`` (see :func:`descriptor_of`), ``character device``, ``named pipe``, ``socket``,
    ``block device`` or ``special file``; None for a regular file, a folder or a path that does not
    exist (a broken link included)."""
    if descriptor_of(path) is not None:
        return "descriptor"
    try:
        mode = os.stat(Path(path).expanduser()).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "special file")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _flush_std() -> None:
    """Flush Python's stdout and stderr, so what they hold comes before bytes written to a descriptor."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


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
    nobody else writes it) every one. An old copy whose replacement never arrived (a run killed by SIGKILL
    between the two renames of its commit) is put back in place instead: the earlier output, as it was.
    Returns what was removed."""
    parent = target.parent
    if not parent.is_dir():
        return []
    name = re.escape(embedded_name(target.name))
    pattern = re.compile(rf"^\.{name}({re.escape(TMP_TAG)}|{re.escape(OLD_TAG)})([0-9]{{1,9}})-")
    removed = []
    for entry in sorted(parent.iterdir()):
        m = pattern.match(entry.name)
        if m and (all_of_them or not _pid_alive(int(m.group(2)))):
            if m.group(1) == OLD_TAG and not target.exists() and not target.is_symlink():
                with contextlib.suppress(OSError):
                    os.rename(entry, target)
                    continue
            _remove(entry)
            removed.append(entry)
    return removed


#: headcut's private temporaries in the system's temporary folder: ``headcut-KIND-PID-...`` (folders, and the files
#: written through special outputs), so that a run can tell which were left by a process that is gone
SCRATCH = re.compile(r"headcut-[a-z]+-([0-9]{1,9})-.+")


@contextmanager
def scratch_folder(kind: str, parent: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """A private temporary folder ``headcut-KIND-PID-*`` (in ``parent``, default the system's temporary folder),
    removed on exit; those a killed run left there are removed first (:func:`remove_stale_scratch`)."""
    remove_stale_scratch(parent)
    with tempfile.TemporaryDirectory(prefix=f"headcut-{kind}-{os.getpid()}-", dir=parent) as folder:
        yield Path(folder)


def remove_stale_scratch(parent: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove this user's ``headcut-KIND-PID-*`` temporaries (in ``parent``, default the system's temporary folder)
    whose process is gone: what a SIGKILL left behind (spilled activations can be gigabytes). Returns them."""
    root = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = SCRATCH.fullmatch(entry.name)
        pid = int(match.group(1)) if match else 0
        if not pid or pid == os.getpid():  # not headcut's, or this run's
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or _pid_alive(pid):
            continue
        _remove(Path(entry.path))
        removed.append(Path(entry.path))
    return removed


class RunLock:
    """An exclusive lock on an output path, held for the whole run (``.NAME.headcut-lock`` beside it).

    A second run that asks for the same lock is refused at once with the owner's pid. The lock file
    is removed on :meth:`release`; a killed process's lock is released by the operating system, and
    its file is taken over by the next run."""

    def __init__(self, target: str | os.PathLike[str], what: str = "writing", wait: bool = False) -> None:
        self.target = real_path(target)
        self.path = self.target.with_name(f".{embedded_name(self.target.name)}{LOCK_TAG}")
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
                if owner.isascii() and owner.isdigit() and len(owner) <= 9 and not _pid_alive(int(owner)):
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
            raise HeadcutError(f"{self.flag} {p} is a {kind}, not a folder; headcut writes a folder there and never "
                               "replaces special files: choose another path")
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
        import signal

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
        free = free_space(final.parent)
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
        raise HeadcutError(f"{self.flag} {self.path} is a {kind}: headcut writes regular files, and writes through "
                           "character devices (such as /dev/stdout) and pipes, nothing else; give a file path")

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
            fd, name = tempfile.mkstemp(prefix=f"headcut-through-{os.getpid()}-", suffix=_temp_suffix(self.path.name))
            os.close(fd)
            return Path(name)
        check_names(self.path, self.flag)
        final = real_path(self.path)
        return final.with_name(f".{embedded_name(final.name)}{TMP_TAG}{os.getpid()}-{os.urandom(4).hex()}"
                               f"{_temp_suffix(final.name)}")

    def commit(self, tmp: Path) -> None:
        """Move the finished temporary ``tmp`` into place: a rename over a regular file (or none), or
        its bytes written through a special file (and ``tmp`` removed)."""
        try:
            through = self.special() is not None
        except HeadcutError:
            _remove(tmp)
            raise
        if through:
            try:
                data = tmp.read_bytes()
            except OSError as exc:
                raise os_error("write", self.path, exc) from None
            finally:
                _remove(tmp)
            self.write_through(data)
            return
        with contextlib.suppress(OSError):
            tmp.chmod(0o666 & ~_umask())
        try:
            os.replace(tmp, real_path(self.path))
        except OSError as exc:
            _remove(tmp)
            raise os_error("write", self.path, exc) from None

    def write_through(self, data: bytes) -> None:
        """Write ``data`` through the special file the output names (see the class docstring)."""
        kind = self.special()
        if kind is None:  # a regular file (again): the atomic write
            self.write_bytes(data)
            return
        _flush_std()
        fd = self._descriptor() if kind == "descriptor" else None
        try:
            if fd is not None:
                _write_all(fd, data)
                return
            fd = self._open_pipe() if kind == "named pipe" else os.open(self.path, os.O_WRONLY | _NOCTTY)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise os_error("write", self.path, exc) from None

    def _open_pipe(self) -> int:
        """Open the named pipe for writing; wait (saying so on stderr) while it has no reader."""
        said: float | None = None
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | _NOCTTY)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                now = time.monotonic()
                if said is None or now - said >= FIFO_NOTICE_S:
                    print(f"waiting for a reader of the named pipe {self.path} ({self.flag}); open it for reading, "
                          "or press Ctrl-C", file=sys.stderr, flush=True)
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
            _remove(tmp)
            raise os_error("write", self.path, exc) from None
        except BaseException:
            _remove(tmp)
            raise
        self.commit(tmp)

    def write_text(self, text: str) -> None:
        """Write ``text`` (UTF-8) to the output: atomically, or through a special file."""
        self.write_bytes(text.encode("utf-8"))


def atomic_dir(out: str | os.PathLike[str], force: bool = False, owned: bool = False) -> contextlib.AbstractContextManager[Path]:
    """Check, lock and stage ``out`` in one step (for writers whose work is all inside the block)."""

    @contextmanager
    def run() -> Iterator[Path]:
        with OutputDir(out, force, owned=owned) as target, target.staging() as tmp:
            yield tmp

    return run()


# ---- a command's outputs, checked before its work --------------------------------------------------------

def local_input(value: Any) -> Path | None:
    """The local path of an input given as a path or a Hub/datasets name (None when not local)."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return p if p.exists() or p.is_symlink() else None


def plan_outputs(
    *,
    reads: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
    out: Path | None = None,
    force: bool = False,
    checkpoint: Path | None = None,
    file_force: Mapping[str, bool] | None = None,
) -> tuple[OutputDir | None, dict[str, OutputFile]]:
    """Check every output of a command before its work starts (see :mod:`headcut.outputs.files`).

    ``reads``: flag -> input (paths, Hub ids or datasets names; only local ones are checked);
    ``files``: flag -> output file (``-`` and None skipped); ``out``: the output folder;
    ``checkpoint``: a folder the run may remove (its resume checkpoint); ``file_force``: files that
    need ``--force`` to be replaced. Returns the checked output folder and files."""
    file_paths = {flag: Path(p).expanduser() for flag, p in (files or {}).items() if p not in (None, "-")}
    check_paths(
        reads={flag: local_input(v) for flag, v in reads.items()},
        writes=file_paths,
        replaces={"--out": out, "the checkpoint folder": checkpoint},
    )
    target = OutputDir(out, force).check() if out is not None else None
    checked = {
        flag: OutputFile(p, flag, force=force or not (file_force or {}).get(flag, False)).check()
        for flag, p in file_paths.items()
    }
    return target, checked


@contextmanager
def locked_output(target: OutputDir, main: bool, out: Path, checkpoint: Path | None) -> Iterator[None]:
    """The work of a job that writes ``out``: the output locked (on the main process of a data-parallel run),
    and an interruption that says where the resume checkpoint is and how to resume (training jobs)."""
    import signal

    with target if main else contextlib.nullcontext():
        try:
            yield
        except KeyboardInterrupt as exc:
            if checkpoint is None or target.committed:
                raise
            signum = getattr(exc, "signum", signal.SIGINT)
            from ..training.engine import has_checkpoint

            if has_checkpoint(checkpoint):
                hint = (f"nothing was written to {out}; the last checkpoint is kept in {checkpoint}: run the same "
                        "command with --resume to continue")
            else:
                hint = f"nothing was written to {out}; no checkpoint had been written yet"
            raise Interrupted(signum, hint) from None
