"""Shell completion of folders, of fixed choices and of a declared option."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..options import OptionSpec


def complete_folders(incomplete: str) -> list[str]:
    """Folders whose path starts with ``incomplete`` (checkpoint folders for MODEL)."""
    typed_dir, prefix = os.path.split(incomplete)
    try:
        entries = list(os.scandir(os.path.expanduser(typed_dir) or "."))
    except OSError:
        return []
    names = sorted(
        e.name
        for e in entries
        if e.is_dir() and e.name.startswith(prefix) and (prefix.startswith(".") or not e.name.startswith("."))
    )
    return [os.path.join(typed_dir, n) + "/" for n in names]


def _choices(values: Any) -> Callable[[str], list[str]]:
    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


def completion(spec: OptionSpec) -> Callable[[str], list[str]] | None:
    """The shell completion of a declared option: its ``choices``, else its ``complete`` (``"folders"`` or
    suggested values), else none."""
    if spec.meta.choices:
        return _choices(spec.meta.choices)
    if spec.meta.complete == "folders":
        return complete_folders
    if isinstance(spec.meta.complete, tuple):
        return _choices(spec.meta.complete)
    return None
