"""The benchmark page's harness on the stored results: every results file belongs to a registered study and loads,
the verdicts come from the declared rules, and the page rendered from the store is the committed one (so the page
cannot drift from the store). No model runs: the renderer reads ``benchmarks/results/`` alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

# benchmarks/ is a folder of the repository, not an installed package: pytest's pythonpath (pyproject.toml)
# puts the repository root on sys.path
from benchmarks.harness.registry import BY_NAME, MEASURED_HERE, STUDIES
from benchmarks.harness.render import page
from benchmarks.harness.store import DOCS, RESULTS, load_results
from benchmarks.harness.verdicts import CLAIMS, TARGETS, TASK_TARGETS, Rule

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stored() -> dict:
    return load_results(RESULTS)


def test_every_stored_result_is_a_registered_study(stored: dict) -> None:
    files = sorted(p for p in RESULTS.iterdir() if not p.name.startswith("."))
    assert {p.stem for p in files} == set(stored), "a results file that is neither .json nor .jsonl"
    assert set(stored) <= set(BY_NAME), f"results of no registered study: {sorted(set(stored) - set(BY_NAME))}"
    assert len(BY_NAME) == len(STUDIES)
    for study in STUDIES:
        assert study.name in stored, f"{study.name}: registered, but nothing is stored"
        assert stored[study.name], f"{study.name}: its results file is empty"


def test_the_page_is_the_one_the_store_gives(stored: dict) -> None:
    rendered = page(stored)
    committed = (DOCS / "benchmarks.md").read_text()
    assert rendered == committed, (
        "docs/benchmarks.md differs from the page benchmarks/results/ gives: run "
        "`python -m benchmarks.harness --studies none`"
    )
    for image in {line.split("](", 1)[1].rstrip(")") for line in rendered.splitlines() if line.startswith("![")}:
        assert (DOCS / image).is_file(), image


def test_the_decoder_recipes_measurements_are_the_studys(stored: dict) -> None:
    """The built-in ``decoder`` recipe's ``measured`` rows are the decoder study's rows that ran it, number for
    number, SmolLM2's among them (issue 70's default has not run on Gemma 3 yet: the page says so)."""
    from benchmarks.harness.render_decoder_default import measured_rows
    from headcut.recipes import builtin_recipes

    recipe = builtin_recipes()["decoder"]
    rows = measured_rows(stored["decoder_recipe"], recipe)
    assert [dict(m) for m in recipe.measured] == rows
    assert "SmolLM2-135M-Instruct" in {r["model"] for r in rows}


def test_the_summary_holds_the_declared_verdicts(stored: dict) -> None:
    summary = page(stored).split("\n## ", 2)[1]
    assert summary.startswith("Summary")
    for k in TARGETS:
        assert f"{k} heads within" in summary
    for claim in CLAIMS.values():
        assert claim.claim in summary, claim.claim
    assert summary.count("**holds") >= 2 * len(TASK_TARGETS)


def test_rules_and_targets_are_data() -> None:
    assert Rule(">", 3.0).holds(80.0, 76.9) and not Rule(">", 3.0).holds(80.0, 77.0)
    assert Rule("<=").holds(1.0, 1.0) and Rule(">=").holds(2.0, 2.0) and not Rule(">").holds(2.0, 2.0)
    target = TASK_TARGETS[16]
    assert target.limit(2.45) == 2.45 and target.limit(0.5) == target.points
    assert target.holds(0.9, 1000, 60 * 15) and not target.holds(0.9, 1001) and not target.holds(0.9, 10, 60 * 16)
    assert target.holds(0.9, 10, None)  # a GPU's time: not judged


def test_the_harness_measures_the_studies_it_registers() -> None:
    # measure.py imports torch: read its STUDIES table instead of importing it
    tree = ast.parse((ROOT / "benchmarks" / "harness" / "measure.py").read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "STUDIES"
    )
    assert isinstance(table, ast.Dict)
    assert {key.value for key in table.keys if isinstance(key, ast.Constant)} == set(MEASURED_HERE)


def test_scripts_import_no_other_script() -> None:
    """The studies, checks and archived scripts import the harness (and the classifier), never one another."""
    shared = ("benchmarks.harness", "benchmarks.classifier")
    scripts = {p.stem for p in (ROOT / "benchmarks").rglob("*.py")} - {"__init__", "__main__"}
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        if path.parent.name == "harness" or path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in scripts, f"{path.name} imports the script {name}"
                assert not name.startswith("benchmarks") or name.startswith(shared), f"{path.name} imports {name}"


def test_the_command_checks_the_page() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.harness", "--check"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert run.returncode == 0, run.stderr
