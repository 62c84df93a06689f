"""Optional packages (headcut's extras: lm-eval, onnx, onnxruntime, gguf, sacrebleu, zstandard, matplotlib):
whether one is installed, and importing one with a one-line :class:`~headcut.errors.HeadcutError` when it is
installed but fails on import (a broken install, a version that does not fit its dependencies: any exception,
not only ImportError), before any long work.

Standard library only (plus :mod:`headcut.errors`): the checks run before torch-heavy work starts."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import HeadcutError, first_line


def installed(name: str) -> bool:
    """Whether the module ``name`` can be found. A package found but broken counts as installed (importing it
    says what is wrong): looking up ``a.b`` imports ``a``, which may fail, and a module left in ``sys.modules``
    without a spec makes the lookup raise ValueError."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError as exc:  # a parent package that is not there, or one missing a dependency
        return exc.name is None or not name.startswith(exc.name + ".")
    except Exception:  # ValueError, or a parent package that raises anything on import
        return True


def imported(name: str, what: str, install: str, missing: str | None = None) -> ModuleType:
    """``import name`` for ``what`` (the option or work that needs it, e.g. ``--lm-eval``), or a one-line
    HeadcutError: ``missing`` (default: ``what needs name, which is not installed: install``) when it is not
    installed, else one naming the module and the error it fails with, and ``install`` (how to reinstall it)."""
    if not installed(name):
        raise HeadcutError(missing or f"{what} needs {name}, which is not installed: {install}")
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as exc:  # a package may raise anything on import, or even exit
        why = f"{type(exc).__name__}: {first_line(exc)}" if str(exc).strip() else type(exc).__name__
        raise HeadcutError(
            f"{what} needs {name}, which is installed but fails on import ({why[:200]}); reinstall it: {install}"
        ) from None


def usable(name: str) -> bool:
    """Whether the module ``name`` is installed and imports (for what is optional: a plot written when it can be)."""
    try:
        imported(name, name, "")
    except HeadcutError:
        return False
    return True
