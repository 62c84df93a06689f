"""The result store: one JSON file per study in ``benchmarks/results/`` (its rows, the machine, the versions, the
date and the time it took), saved after every row so an interrupted study goes on where it stopped.

Reading the store (:func:`load_results`) needs neither torch nor headcut: the page renders from it alone.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the benchmarks folder, the stored results and the docs the page is written to
BENCHMARKS = Path(__file__).resolve().parent.parent
RESULTS = BENCHMARKS / "results"
DOCS = BENCHMARKS.parent / "docs"
#: the fields that name a row (``Store.row``'s keys across the studies)
ROW_KEYS = ("method", "k", "seed", "task", "lever", "run", "variant", "bench")


def log(message: str) -> None:
    print(f"[page {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_results(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every stored study: results file stem -> its contents (a ``.jsonl`` file, a check's raw output, as
    ``{"rows": [one dict a line]}``)."""
    data = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}
    for path in sorted(results.glob("*.jsonl")):
        data[path.stem] = {"rows": [json.loads(line) for line in path.read_text().splitlines() if line.strip()]}
    return data


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    # torch, transformers and headcut only when measuring: rendering the page reads the store alone
    import torch
    import transformers

    import headcut

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "headcut": headcut.__version__,
        "date": datetime.date.today().isoformat(),
    }


class Store:
    """A study's rows, saved after every row, so an interrupted study goes on where it stopped."""

    def __init__(self, name: str, rerun: bool, results: Path = RESULTS) -> None:
        self.results = results
        self.path = results / f"{name}.json"
        self.data: dict[str, Any] = {}
        if self.path.is_file() and not rerun:
            self.data = json.loads(self.path.read_text())
        self.data.setdefault("study", name)
        self.data.setdefault("rows", [])
        self.data.setdefault("seconds", 0.0)
        self.started = time.perf_counter()
        self.spent = self.data["seconds"]

    @property
    def complete(self) -> bool:
        return bool(self.data.get("complete"))

    def row(self, key: dict[str, Any], measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The stored row whose fields match ``key``, or ``measure()``'s (stored with ``key``)."""
        for row in self.data["rows"]:
            if all(row.get(k) == v for k, v in key.items()):
                return row
        row = {**measure(), **key}
        self.data["rows"].append(row)
        self.save()
        return row

    def save(self, complete: bool = False, measured: bool = True, **fields: Any) -> None:
        """Write the study's file; ``measured`` False (rows merged from elsewhere): its machine and time stay."""
        self.data.update(fields)
        if measured:
            self.data["machine"] = machine()
            self.data["seconds"] = round(self.spent + time.perf_counter() - self.started, 1)
        self.data["complete"] = complete
        self.results.mkdir(exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def merge(paths: list[Path], copied: str | None = None) -> None:
    """Fold partial results (a copy of ``results/`` measured elsewhere with ``--methods``/``--ks``) into
    ``results/``: each file's rows its study lacks are added, with the machine they ran on, the unpruned accuracy
    measured there and ``copied`` (how the classifier was carried there, for the page); the study's own machine
    and time are not changed."""
    for path in paths:
        other = json.loads(path.read_text())
        store = Store(other["study"], rerun=False)
        have = {tuple(r.get(k) for k in ROW_KEYS) for r in store.data["rows"]}
        new = [r for r in other["rows"] if tuple(r.get(k) for k in ROW_KEYS) not in have]
        for row in new:
            row.setdefault("machine", other.get("machine"))
            if other.get("unpruned") is not None:
                row.setdefault("unpruned_there", other["unpruned"])
            if copied:
                row.setdefault("copied", copied)
        store.data["rows"] += new
        store.save(complete=store.complete, measured=False)
        log(f"{path}: {len(new)} rows added to {other['study']}")
