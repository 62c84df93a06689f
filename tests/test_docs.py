"""The README, .ci/run and the shell completions stay in step with the code."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main
from typer._completion_shared import get_completion_script

from headcut.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_lines = [
        ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith(("#", "set ", "cd "))
    ]
    assert len(ci_lines) == 1
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert ci_lines[0] in blocks


def test_completion_scripts_are_current():
    for shell in ("bash", "zsh", "fish"):
        expected = get_completion_script(prog_name="headcut", complete_var="_HEADCUT_COMPLETE", shell=shell)
        assert (ROOT / "completions" / f"headcut.{shell}").read_text() == expected.rstrip() + "\n", shell


def test_every_command_is_documented():
    readme = (ROOT / "README.md").read_text()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    names = sorted(typer.main.get_command(app).commands)
    assert names
    for name in names:
        assert f"headcut {name}" in readme, name
        assert f"`{name}`" in changelog or f"headcut {name}" in changelog, name


def test_generated_reference_is_current():
    from headcut.cli.reference import update

    assert update(ROOT, check=True) == [], "run: python -m headcut.cli.reference"
