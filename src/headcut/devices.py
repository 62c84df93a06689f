"""Devices, checked once for every command and the Python API: ``auto`` (CUDA when available, else CPU; the
training commands' default), ``cpu``, ``cuda`` (the current CUDA device; under a multi-process launch each
process's own), ``cuda:N`` and ``mps`` (Apple silicon, where this torch build has it).

:func:`check_device` refuses a malformed or unavailable device in one line naming the option (``device`` in
Python, ``--device`` on the command line) before any model is loaded. Also the machine's memory: what is
available, the process's peak, sizes such as ``12GB`` (:func:`parse_size`), and handing freed heap memory back."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import re
import resource
import sys
from pathlib import Path

from .errors import HeadcutError, HeadcutValueError, label, shown

#: the forms ``--device`` takes (``cuda:N`` for any N)
DEVICE_FORMS = ("auto", "cpu", "cuda", "cuda:N", "mps")


def check_device(requested: str, *, auto: bool = True) -> str:
    """``requested`` if it names a device this machine has (``auto``: only where ``auto`` is allowed), else a
    one-line :class:`HeadcutValueError`."""
    forms = [f for f in DEVICE_FORMS if auto or f != "auto"]
    # the index in ASCII digits without leading zeros, as torch reads it (``\d`` takes other scripts' digits,
    # which torch refuses), and short: torch wraps an index past 127 round to a negative one
    form = (
        re.fullmatch(r"auto|cpu|cuda(?::(0|[1-9][0-9]{0,3}))?|mps", requested) if isinstance(requested, str) else None
    )
    if form is None or (requested == "auto" and not auto):
        raise HeadcutValueError(f"unknown {label('device')} {shown(requested)}; choose {', '.join(forms)}")
    if requested in ("auto", "cpu"):
        return requested
    import torch

    if requested == "mps":
        backend = getattr(torch.backends, "mps", None)
        if backend is None or not backend.is_available():
            raise HeadcutValueError(f"{label('device')} mps: this torch ({torch.__version__}) has no MPS device here")
        return requested
    if not torch.cuda.is_available():
        raise HeadcutValueError(
            f"{label('device')} {requested}: CUDA is not available to torch {torch.__version__} here"
        )
    index = None if form.group(1) is None else int(form.group(1))
    if index is not None and index >= torch.cuda.device_count():
        raise HeadcutValueError(
            f"{label('device')} {requested}: this machine has {torch.cuda.device_count()} CUDA "
            f"device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})"
        )
    return requested


# ---- memory ---------------------------------------------------------------------------------------------------


def _proc_kib(path: str, key: str) -> int | None:
    """The ``key`` line of a ``/proc`` file (a size in kB), in bytes; None where there is no such file or line."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss() -> int:
    """The process's peak resident memory so far, in bytes: ``VmHWM`` of ``/proc/self/status`` where there is one
    (``getrusage``'s maximum also counts the parent's memory at the ``fork`` before this program started)."""
    peak = _proc_kib("/proc/self/status", "VmHWM:")
    if peak is not None:
        return peak
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * (1 if sys.platform == "darwin" else 1024)


def available_memory() -> int:
    """The memory headcut may use by default: the machine's available memory (``MemAvailable``), else its total."""
    available = _proc_kib("/proc/meminfo", "MemAvailable:")
    if available is not None:
        return available
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 1024**3


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


#: the largest size :func:`parse_size` takes (8 EiB: more than any machine's memory, and still a 64-bit count)
MAX_SIZE = 2**63


def parse_size(text: str | int) -> int:
    """Bytes from ``12GB``, ``12GiB``, ``500MB`` or a plain number of bytes (ASCII digits, at most
    :data:`MAX_SIZE`); HeadcutError otherwise."""
    value: int | float
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = text, ""
    else:
        s = str(text).strip().lower().replace(" ", "")
        digits = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        value_text, unit = digits, s[len(digits) :]
        try:
            value = float(value_text) if value_text.isascii() else -1.0
        except ValueError:
            value = -1.0
        if unit not in _UNITS:
            value = -1.0
    if not (value > 0 and (isinstance(value, int) or math.isfinite(value)) and value * _UNITS[unit] <= MAX_SIZE):
        raise HeadcutError(
            f"{label('max_memory')} must be a size such as 12GB, 12GiB or 500MB, at most 8 EiB (got {shown(text)})"
        )
    return int(value * _UNITS[unit])


def gib(n: int | float) -> str:
    return f"{n / 1024**3:.2f} GiB"


def trim_memory() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``; elsewhere nothing): a layer's tensors
    are freed after each step, and without it the process's resident size keeps their high-water mark."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
