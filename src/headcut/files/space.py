"""One-line errors for failed writes: operating-system errors and full disks (with the space free and needed)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ..errors import HeadcutError


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


def space_error(
    action: str,
    target: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    need: int | None,
    hint: str = "",
    free: int | None = None,
) -> HeadcutError:
    """The one-line error of a full file system: what could not be written (``target``), the ``folder`` that has no
    room, what is free there (``free``: bytes free before the write began, else now) and about what the write
    needs (``need``: bytes, None when unknown)."""
    now = free is None
    free = free_space(folder) if free is None else free
    parts = [
        f"{size_text(free)} free" + ("" if now else " before writing") if free is not None else "",
        f"at least {size_text(need)} needed" if need else "",
    ]
    told = ", ".join(p for p in parts if p)
    return HeadcutError(
        f"cannot {action} {os.fsdecode(target)}: no space left on the device in {os.fsdecode(folder)}"
        + (f" ({told})" if told else "")
        + (f"; {hint}" if hint else "")
    )


def write_error(
    exc: BaseException,
    action: str,
    target: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    need: int | None = None,
    hint: str = "",
    free: int | None = None,
) -> HeadcutError | None:
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
