"""Special output files: descriptors of the process, character devices and named pipes, written through."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from pathlib import Path

#: seconds between the lines a write to a named pipe with no reader prints while it waits
FIFO_NOTICE_S = 15.0

_DESCRIPTOR = re.compile(
    r"^/(?:dev/(?:fd/([0-9]{1,9})|(stdin|stdout|stderr))|proc/(self|thread-self|[0-9]{1,9})/fd/"
    r"([0-9]{1,9}))$"
)
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
_KINDS = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISFIFO, "named pipe"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISBLK, "block device"),
)
#: kinds an output file is written through (never replaced)
THROUGH = ("descriptor", "character device", "named pipe")
NOCTTY = getattr(os, "O_NOCTTY", 0)  # opening a terminal never makes it this process's controlling one


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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def flush_std() -> None:
    """Flush Python's stdout and stderr, so what they hold comes before bytes written to a descriptor."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
