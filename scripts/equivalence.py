"""The equivalence set: what headcut's commands write and print for a fixed set of requests on tiny random models,
timings aside, so that a change meant to keep every result (a restructuring) can be shown to keep them.

    python scripts/equivalence.py record before.json      # on the code before the change
    python scripts/equivalence.py record after.json       # on the code after it
    python scripts/equivalence.py compare before.json after.json

Each case is a command line (run in this process, as ``tests/helpers.py`` runs them) or a call of the Python API.
What is recorded of it: the exit code; stdout and the refusal line with the case's folder written ``<ROOT>``; every
file it wrote with its SHA-256 (the weights, the config, the saved recipe and mask), and the JSON it wrote
(``--json``, the report) with the values that measure time or name this machine left out (:data:`VOLATILE`).
A report's ``arguments`` and the model card are recorded too: a change that moves an output byte shows here.
The cases cover every kind of prune (the default recipes, a recipe file with rounds, its replay, each family of
method, ``--via``, ``--max-drop``, layer-wise, KV budgets, ``--uniform``, refit, recovery), score, export (with
its formats), finetune, eval, bench (its counts, not its timings), info, methods, recipes, and refusals of each.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

#: keys whose values measure time, memory or the machine (left out of a record)
VOLATILE = re.compile(
    r"seconds|elapsed|_ms$|^ms$|latency|per_s$|throughput|peak_memory|time|date|created|speedup|spread|threads|"
    r"^device_name$|^headcut_version$|^torch$|^transformers$|^python$|^platform$|noise|within|runs_ms|p25|p75|median|"
    r"memory_bytes|rss"
)
#: text that varies from run to run in printed lines: durations, rates, memory
NUMBERS_OF_TIME = re.compile(
    r"\d+(\.\d+)?\s*(ms|s|it/s|examples/s|tokens/s|MiB|GiB|MB|GB)\b|\d+:\d\d(:\d\d)?|\d+(\.\d+)?x\b"
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _ordered(value: Any, root: str) -> str:
    """:func:`_clean` ``value`` as JSON text in its own key order (a report's keys keep their order)."""
    return json.dumps(_clean(value, root))


def _clean(value: Any, root: str) -> Any:
    """``value`` (JSON) without its volatile keys, the case's folder written ``<ROOT>``."""
    if isinstance(value, dict):
        return {k: _clean(v, root) for k, v in value.items() if not VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [_clean(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root, "<ROOT>")
    if isinstance(value, float):
        return round(value, 6)
    return value


def _text(text: str, root: str) -> str:
    lines = [NUMBERS_OF_TIME.sub("<T>", line.replace(root, "<ROOT>")).rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line.strip())


def _files(folder: Path, root: str) -> dict[str, Any]:
    """Every file under ``folder``: JSON cleaned, README.md (the card) as text without times, others by digest."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(path.relative_to(folder))
        if path.suffix == ".json":
            try:
                out[name] = _ordered(json.loads(path.read_text()), root)
            except ValueError:
                out[name] = _digest(path)
        elif path.suffix in (".md", ".yaml", ".csv", ".py"):
            out[name] = _text(path.read_text(), root)
        else:
            out[name] = _digest(path)
    return out


class Fixture:
    """The tiny models and data every case reads (made once per record, from fixed seeds)."""

    def __init__(self, root: Path) -> None:
        import torch
        from helpers import cls_rows, save_tiny, sentence, write_rows

        self.root = root
        self.bert = save_tiny(root / "bert", "bert", "BertForSequenceClassification")
        self.llama = save_tiny(root / "llama", "llama", "LlamaForCausalLM")
        self.gemma3 = save_tiny(root / "gemma3", "gemma3", "Gemma3ForCausalLM")
        self.train = write_rows(root / "train.csv", cls_rows(24))
        self.dev = write_rows(root / "dev.csv", cls_rows(12, seed=1))
        rng = torch.Generator().manual_seed(0)
        self.text = root / "text.txt"
        self.text.write_text("\n".join(sentence(rng, 40) for _ in range(24)))
        self.mask = root / "mask.json"
        self.mask.write_text(json.dumps({"drop": {"self.0": [0, 1], "self.1": [3]}}))
        self.lm_mask = root / "lm-mask.json"
        self.lm_mask.write_text(json.dumps({"drop": {"self.0": [0, 1, 2], "self.2": [3, 4, 5]}}))
        self.recipe = root / "rounds.yaml"
        self.recipe.write_text(
            "name: three-rounds\n"
            "stages:\n  - choose: {method: gradient}\n  - cut: {}\n  - refit: {}\n  - recover: {recover_steps: 2}\n"
            "data: {batch_size: 4}\n"
            "schedule:\n  - rounds: [{keep: 6, recover_steps: 1}, {keep: 5}, {keep: budget}]\n"
        )


def cli_cases(f: Fixture) -> dict[str, list[Any]]:
    """Name -> the command line (after ``headcut``); ``OUT`` is the case's output folder, ``JSON`` its --json file."""
    b, lm, g3, train, dev, text = f.bert, f.llama, f.gemma3, f.train, f.dev, f.text
    small = ["--recover-steps", 2, "--batch-size", 4]
    return {
        # prune: recipes
        "prune-default-encoder": ["prune", b, "--keep", 4, "--data", train, "--eval-data", dev, *small],
        "prune-default-encoder-rounds": ["prune", b, "--keep", 2, "--data", train, *small],
        "prune-default-decoder": ["prune", lm, "--keep", 12, "--data", text, "--seq-len", 16],
        "prune-recipe-file-rounds": ["prune", b, "--recipe", f.recipe, "--keep", 3, "--data", train],
        "prune-recipe-by-name": ["prune", b, "--recipe", "encoder", "--keep", 6, "--data", train, *small],
        # prune: methods
        "prune-magnitude": ["prune", b, "--method", "magnitude", "--keep", 4],
        "prune-magnitude-uniform": ["prune", b, "--method", "magnitude", "--keep", 4, "--uniform"],
        "prune-gradient-refit-recover": [
            "prune",
            b,
            "--method",
            "gradient",
            "--keep",
            4,
            "--data",
            train,
            "--refit",
            "--eval-data",
            dev,
            *small,
        ],
        "prune-fluctuation-bias": [
            "prune",
            lm,
            "--method",
            "fluctuation",
            "--keep",
            12,
            "--bias-compensation",
            "--data",
            text,
            "--seq-len",
            16,
        ],
        "prune-gnorm-via": [
            "prune",
            b,
            "--method",
            "gnorm",
            "--keep",
            2,
            "--via",
            5,
            "--data",
            train,
            *small,
            "--via-steps",
            1,
        ],
        "prune-schedule": ["prune", b, "--method", "magnitude", "--keep", 3, "--schedule", "6,4"],
        "prune-distill-recover": [
            "prune",
            lm,
            "--method",
            "magnitude",
            "--keep",
            12,
            "--data",
            text,
            "--seq-len",
            16,
            "--distill-steps",
            3,
            "--recover-steps",
            1,
        ],
        "prune-michel-max-drop": [
            "prune",
            b,
            "--method",
            "michel",
            "--max-drop",
            0.05,
            "--data",
            train,
            "--eval-data",
            dev,
        ],
        "prune-greedy-gnorm": ["prune", b, "--method", "greedy-gnorm", "--keep", 5, "--data", train],
        "prune-random-seed": ["prune", b, "--method", "random", "--keep", 3, "--seed", 7],
        "prune-pass": ["prune", b, "--method", "pass", "--keep", 4, "--data", train, "--max-steps", 3],
        "prune-passconc": ["prune", b, "--method", "passconc", "--keep", 4, "--data", train, "--max-steps", 3],
        "prune-dsp": ["prune", b, "--method", "dsp", "--keep", 4, "--data", train, "--max-steps", 3],
        "prune-ste": ["prune", b, "--method", "ste", "--keep", 4, "--data", train, "--max-steps", 3],
        "prune-voita": ["prune", b, "--method", "voita", "--keep", 4, "--data", train, "--max-steps", 3],
        "prune-lag": ["prune", b, "--method", "lag", "--keep", 4, "--data", train, "--max-steps", 3],
        # prune: decoders, budgets, layer-wise
        "prune-gqa-group": [
            "prune",
            lm,
            "--method",
            "gradient",
            "--keep",
            9,
            "--gqa",
            "group",
            "--data",
            text,
            "--seq-len",
            16,
        ],
        "prune-kv-budget": [
            "prune",
            lm,
            "--method",
            "gradient",
            "--kv-budget",
            0.5,
            "--context",
            64,
            "--data",
            text,
            "--seq-len",
            16,
        ],
        "prune-kv-budget-count": [
            "prune",
            g3,
            "--method",
            "gradient",
            "--kv-budget",
            0.6,
            "--context",
            64,
            "--allocation",
            "count",
            "--data",
            text,
            "--seq-len",
            16,
        ],
        "prune-layerwise": [
            "prune",
            lm,
            "--method",
            "fluctuation",
            "--keep",
            12,
            "--layerwise",
            "--data",
            text,
            "--seq-len",
            16,
        ],
        "prune-layerwise-kv": ["prune", lm, "--method", "magnitude", "--kv-budget", 0.7, "--layerwise"],
        "prune-decilm": ["prune", lm, "--method", "magnitude", "--keep", 15, "--format", "safetensors,decilm"],
        "prune-gguf-refused": ["prune", lm, "--method", "magnitude", "--keep", 12, "--format", "gguf"],
        # refusals
        "refuse-method-and-recipe": ["prune", b, "--method", "pass", "--recipe", "encoder", "--keep", 4],
        "refuse-two-budgets": ["prune", b, "--method", "magnitude", "--keep", 4, "--sparsity", 0.5],
        "refuse-no-budget": ["prune", b, "--method", "magnitude"],
        "refuse-unreachable": ["prune", b, "--method", "magnitude", "--keep", 9],
        "refuse-option-of-other-method": ["prune", b, "--method", "magnitude", "--keep", 4, "--max-steps", 3],
        "refuse-kv-budget-encoder": ["prune", b, "--method", "gradient", "--kv-budget", 0.5, "--data", train],
        "refuse-kv-budget-pass": ["prune", lm, "--method", "pass", "--kv-budget", 0.5, "--data", text],
        "refuse-context-alone": ["prune", lm, "--method", "gradient", "--keep", 6, "--context", 64, "--data", text],
        "refuse-via-learned": ["prune", b, "--method", "pass", "--keep", 2, "--via", 4, "--data", train],
        "refuse-recover-no-data": ["prune", b, "--method", "magnitude", "--keep", 4, "--recover-steps", 2],
        "refuse-refit-no-data": ["prune", b, "--method", "magnitude", "--keep", 4, "--refit"],
        "refuse-max-drop-no-eval": ["prune", b, "--method", "michel", "--max-drop", 0.1, "--data", train],
        "refuse-via-steps-alone": ["prune", b, "--method", "gnorm", "--keep", 2, "--via-steps", 1, "--data", train],
        "refuse-device-scorer": ["prune", b, "--method", "gnorm", "--keep", 2, "--device", "cpu", "--data", train],
        "refuse-no-out": ["prune", b, "--method", "magnitude", "--keep", 4, "NO-OUT"],
        "refuse-bad-gqa": ["prune", lm, "--method", "magnitude", "--keep", 5],
        "refuse-target-speedup-pass": ["prune", lm, "--method", "pass", "--target-speedup", 1.5, "--data", text],
        # the other commands
        "score-gnorm": ["score", b, "--data", train, "--scorer", "gnorm", "--json", "JSON"],
        "score-gradient-lm": ["score", lm, "--data", text, "--scorer", "gradient", "--seq-len", 16, "--json", "JSON"],
        "score-magnitude": ["score", b, "--scorer", "magnitude", "--json", "JSON"],
        "export": ["export", b, "--mask", f.mask],
        "export-lm-formats": ["export", lm, "--mask", f.lm_mask, "--format", "safetensors,decilm,onnx"],
        "finetune": ["finetune", b, "--data", train, "--max-steps", 2, "--batch-size", 4],
        "finetune-distill": ["finetune", b, "--data", train, "--max-steps", 2, "--distill-from", b, "--alpha", 0.5],
        "eval-cls": ["eval", b, "--data", dev, "--json", "JSON"],
        "eval-lm": ["eval", lm, "--data", text, "--windows", "16,32", "--json", "JSON"],
        "bench": ["bench", b, b, "--runs", 2, "--warmup", 0, "--batch-size", 2, "--seq-len", 8, "--json", "JSON"],
        "bench-lm": [
            "bench",
            lm,
            "--runs",
            2,
            "--warmup",
            0,
            "--batch-size",
            1,
            "--seq-len",
            8,
            "--gen-tokens",
            2,
            "--json",
            "JSON",
        ],
        "info": ["info", lm, "--json", "JSON"],
        "methods": ["methods"],
        "methods-pass": ["methods", "pass"],
        "recipes": ["recipes", "--json", "JSON"],
        "recipes-encoder": ["recipes", "encoder"],
        "recipes-file": ["recipes", f.recipe],
    }


def api_cases(f: Fixture) -> dict[str, Callable[[Path], Any]]:
    """Name -> a call of the Python API writing to the given folder (its report is recorded)."""
    import headcut

    b, lm, train, text = f.bert, f.llama, f.train, f.text
    return {
        "api-default-recipe": lambda o: headcut.prune(
            b, keep=4, data=train, recover_steps=2, data_options={"batch_size": 4}, out=o
        ),
        "api-method-options": lambda o: headcut.prune(b, "pass", keep=4, data=train, max_steps=3, out=o),
        "api-recipe-mapping": lambda o: headcut.prune(
            b,
            recipe={"name": "m", "stages": [{"choose": {"method": "gradient"}}, {"cut": {"uniform": True}}]},
            keep=4,
            data=train,
            out=o,
        ),
        "api-kv-budget": lambda o: headcut.prune(
            lm, "gradient", kv_budget=0.5, context=64, data=text, data_options={"seq_len": 16}, out=o
        ),
        "api-replay": lambda o: headcut.prune(
            b, recipe=f.root / "cases" / "prune-recipe-file-rounds" / "OUT", keep=3, data=train, out=o
        ),
        "api-refuse-both": lambda o: headcut.prune(b, "pass", recipe="encoder", keep=4),
        "api-refuse-bad-keep": lambda o: headcut.prune(b, "magnitude", keep=-1),
        "api-export": lambda o: headcut.export(b, {"drop": {"self.0": [1]}}, out=o),
        "api-score": lambda o: headcut.score(b, scorer="magnitude"),
    }


def record(path: Path) -> None:
    from helpers import run

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="headcut-equivalence-") as tmp:
        root = Path(tmp)
        fixture = Fixture(root)
        for name, args in cli_cases(fixture).items():
            start = time.perf_counter()
            folder = root / "cases" / name
            folder.mkdir(parents=True)
            json_file = folder / "result.json"
            full = [json_file if a == "JSON" else a for a in args if a != "NO-OUT"]
            if args[0] in ("prune", "export", "finetune") and "NO-OUT" not in args:
                full += ["--out", folder / "OUT"]
            result = run(*full)
            timed = args[0] in ("bench", "eval")  # their tables print rates: their JSON is recorded
            entry: dict[str, Any] = {
                "exit": result.exit_code,
                "stdout": "" if timed else _text(result.stdout, tmp),
                "error": [_text(line, tmp) for line in result.stderr.splitlines() if line.startswith("error:")],
            }
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                entry["exception"] = repr(result.exception)[:300]
            if json_file.exists():
                entry["json"] = _ordered(json.loads(json_file.read_text()), tmp)
            if (folder / "OUT").exists():
                entry["files"] = _files(folder / "OUT", tmp)
            out[name] = entry
            print(f"{name}: exit {result.exit_code} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
        for name, call in api_cases(fixture).items():
            folder = root / "cases" / name
            folder.mkdir(parents=True)
            try:
                done = call(folder / "OUT")
                entry = {"report": _ordered(getattr(done, "report", None), tmp)}
            except Exception as exc:  # a refusal is a result too
                entry = {"raised": type(exc).__name__, "message": str(exc).replace(tmp, "<ROOT>")}
            if (folder / "OUT").exists():
                entry["files"] = _files(folder / "OUT", tmp)
            out[name] = entry
            print(f"{name}: {'raised ' + entry['raised'] if 'raised' in entry else 'ok'}", file=sys.stderr)
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


def _diff(a: Any, b: Any, at: str, found: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                found.append(f"{at}.{key}: only in {'after' if key not in a else 'before'}")
            else:
                _diff(a[key], b[key], f"{at}.{key}", found)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{at}[{i}]", found)
    elif isinstance(a, str) and isinstance(b, str) and a != b and a[:1] in "{[" and b[:1] in "{[":
        try:
            left, right = json.loads(a), json.loads(b)
        except ValueError:
            left = right = None
        if left is None:
            found.append(f"{at}: {a[:200]!r} -> {b[:200]!r}")
        else:
            before = len(found)
            _diff(left, right, at, found)
            if len(found) == before:  # the same values in another order
                found.append(f"{at}: the same values, keys in another order: {_order(left, right)}")
    elif isinstance(a, str) and isinstance(b, str) and a != b and "\n" in a + b:
        import difflib

        lines = [d for d in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)][2:]
        found.append(f"{at}: " + " | ".join(lines[:8]))
    elif a != b:
        found.append(f"{at}: {str(a)[:200]!r} -> {str(b)[:200]!r}")


def _order(a: Any, b: Any, at: str = "") -> str:
    """Where two equal JSON values first differ in key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{at or '.'}: {list(a)} -> {list(b)}"
        for key in a:
            found = _order(a[key], b[key], f"{at}.{key}")
            if found:
                return found
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _order(x, y, f"{at}[{i}]")
            if found:
                return found
    return ""


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    found: list[str] = []
    _diff(a, b, "", found)
    for line in found:
        print(line)
    print(f"{len(a)} cases, {len(found)} differences", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
