"""headcut's layers: the import contract of pyproject.toml (``[tool.importlinter]``) holds, and no module imports
itself through others (no import cycle, imports inside functions included). Both fail without import-linter
(which brings grimp; the ``test`` extra installs it): a check that cannot run is not a check that passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _env() -> dict[str, str]:
    """This tree's sources first, whatever headcut is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _needs_importlinter() -> None:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is not installed (pip install -e '.[test]'): the layers cannot be checked")


def test_the_layers_contract_holds():
    _needs_importlinter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command(['--no-cache']))",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = done.stdout + done.stderr
    broken = report[report.find("Broken contracts") :] if "Broken contracts" in report else report
    assert done.returncode == 0, f"lint-imports: the layers of pyproject.toml are broken:\n{broken}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    _needs_importlinter()
    script = (
        "import json, grimp; g = grimp.build_graph('headcut', cache_dir=None); "
        "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=True
    )
    graph = {m: {t for t in targets if t.startswith("headcut")} for m, targets in json.loads(done.stdout).items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (each line: modules that import each other, directly or not):\n" + "\n".join(
        f"- {', '.join(c)}" for c in cycles
    )


def test_the_cycle_finder():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
