"""The project's own checks as tests, so the README's test command (and CI) runs them: ruff (lint and format)
over the sources, tests, benchmarks and the repository's helpers (``headcut_offline``), and mypy over the public API
(``[tool.mypy]`` in pyproject.toml). The import layers are checked in test_layers.py. A tool that is not installed
fails its test (the ``test`` extra, which the README's test command installs, has them all): a check that cannot
run is not a check that passed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "benchmarks", "scripts", "headcut_offline"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def _needs(module: str) -> None:
    if (
        shutil.which(module) is None
        and subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode != 0
    ):
        pytest.fail(f"{module} is not installed (pip install -e '.[test]'): its check cannot run")


def test_ruff_lint():
    _needs("ruff")
    result = _run("ruff", "check", "--no-cache", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    _needs("ruff")
    result = _run("ruff", "format", "--check", "--no-cache", *PATHS)
    assert result.returncode == 0, "run `ruff format`:\n" + result.stdout + result.stderr


def test_mypy_on_the_public_api():
    _needs("mypy")
    result = _run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr
