"""Devices, checked once for every command and the Python API: ``auto`` (CUDA when available, else CPU; the
training commands' default), ``cpu``, ``cuda`` (the current CUDA device; under a multi-process launch each
process's own), ``cuda:N`` and ``mps`` (Apple silicon, where this torch build has it).

:func:`check_device` refuses a malformed or unavailable device in one line naming the option (``device`` in
Python, ``--device`` on the command line) before any model is loaded."""

from __future__ import annotations

import re

from .errors import HeadcutValueError, label, shown

#: the forms ``--device`` takes (``cuda:N`` for any N)
DEVICE_FORMS = ("auto", "cpu", "cuda", "cuda:N", "mps")


def check_device(requested: str, *, auto: bool = True) -> str:
    """``requested`` if it names a device this machine has (``auto``: only where ``auto`` is allowed), else a
    one-line :class:`HeadcutValueError`."""
    forms = [f for f in DEVICE_FORMS if auto or f != "auto"]
    # the index in ASCII digits without leading zeros, as torch reads it (``\d`` takes other scripts' digits,
    # which torch refuses), and short: torch wraps an index past 127 round to a negative one
    form = re.fullmatch(r"auto|cpu|cuda(?::(0|[1-9][0-9]{0,3}))?|mps", requested) if isinstance(requested, str) \
        else None
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
        raise HeadcutValueError(f"{label('device')} {requested}: CUDA is not available to torch "
                                f"{torch.__version__} here")
    index = None if form.group(1) is None else int(form.group(1))
    if index is not None and index >= torch.cuda.device_count():
        raise HeadcutValueError(f"{label('device')} {requested}: this machine has {torch.cuda.device_count()} CUDA "
                                f"device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return requested
