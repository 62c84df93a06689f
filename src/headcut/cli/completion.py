"""Shell completion of folders and of fixed choices."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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
