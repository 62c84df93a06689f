"""One writer per output: :class:`RunLock`."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ..errors import HeadcutError
from ..interrupts import deferred_signals
from .leftovers import pid_alive
from .names import LOCK_TAG, embedded_name, real_path
from .space import os_error

try:  # POSIX; elsewhere RunLock falls back to an exclusive-create pid file
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


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
        return HeadcutError(
            f"another headcut run (pid {self._owner()}) is {self.what} {self.target}; wait for it "
            "to finish, or choose another path"
        )

    def _open(self) -> int | None:
        if fcntl is None:  # pragma: no cover - Windows: exclusive create, a dead owner's file is taken over
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner.isascii() and owner.isdigit() and len(owner) <= 9 and not pid_alive(int(owner)):
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
