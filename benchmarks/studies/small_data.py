"""Why the recipe (one-shot gradient scores, the cut, distilled recovery) loses accuracy at high sparsity on small
data (issue 33): measurements on the page's two small-data tasks (``review-plot``: 900 training rows, three
classes; ``debates``: 786 rows, three classes), kept in ``benchmarks/results/small_data_diagnosis.json`` row by
row (an interrupted run goes on from its last finished row).

    python -m benchmarks.studies.small_data [--tasks review-plot,debates] [--ks 8] [--runs NAME,...]

Each recovery run is evaluated on the held-out split every ``CURVE_EVERY`` steps (250; the first runs stored: 100):
the curve shows what the recovery does over time (a diagnosis only: no run chooses anything on the held-out split).
Several processes at once need a ``--results`` file each (their rows were merged into the one file by hand).
``--tasks TASK --reports FILE...`` measures nothing: it keeps rows of runs made on the command line (``headcut prune ... --json
FILE``; ``results/small_data_cli.json``: the recipe with fluctuation's cut in place of gradient's). Progress goes to
stderr.
"""

from __future__ import annotations

import argparse
import csv
import random
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import headcut
from benchmarks.harness.store import Store, log
from benchmarks.harness.tasks import TRAIN_OPTIONS, Task
from headcut.config import PruneConfig
from headcut.data import DataConfig, load_calibration, load_tokenizer
from headcut.model.evaluation import evaluate
from headcut.model.masks import HeadMask
from headcut.pruning import eval_metric, plan_prune

CURVE_EVERY = 250


def _half(path: Path, folder: Path, part: int) -> Path:
    """Half ``part`` (0 or 1) of a training file's rows (shuffled with seed 0)."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    random.Random(0).shuffle(rows)
    mid = len(rows) // 2
    out = folder / f"half-{part}.csv"
    with out.open("w", newline="") as f:
        csv.writer(f).writerows([header, *(rows[:mid] if part == 0 else rows[mid:])])
    return out


def _overlap(a: HeadMask, b: HeadMask) -> int:
    return sum(len(set(a.keep[n]) & set(b.keep.get(n, []))) for n in a.keep)


def _kept_per_layer(mask: HeadMask) -> list[int]:
    return [len(v) for v in mask.keep.values()]


def stability(task: Task, k: int) -> dict[str, Any]:
    """The one-shot gradient scores' choice of ``k`` heads from all the training rows and from each half of them:
    the heads the halves agree on, and the held-out accuracy right after each cut (gated; no training)."""
    tok = load_tokenizer(task.path)
    masks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in (
            ("all", task.splits["train"]),
            ("half 0", _half(task.splits["train"], Path(tmp), 0)),
            ("half 1", _half(task.splits["train"], Path(tmp), 1)),
        ):
            cal = load_calibration(task.model, tok, DataConfig(path=str(path), batch_size=8))
            masks[name] = plan_prune(task.model, cal, PruneConfig(method="gradient", keep=k)).mask
    return {
        "k": k,
        "after_cut": {n: task.accuracy(m) for n, m in masks.items()},
        "kept_per_layer": {n: _kept_per_layer(m) for n, m in masks.items()},
        "overlap_halves": _overlap(masks["half 0"], masks["half 1"]),
        "overlap_all_half0": _overlap(masks["all"], masks["half 0"]),
    }


#: the one-shot scorers compared right after the cut
SCORERS = ["gradient", "confidence", "entropy", "value-l1", "magnitude", "gnorm"]


def scorers(task: Task) -> dict[str, Any]:
    """The held-out accuracy right after a cut to 16 and to 8 heads chosen by each one-shot scorer on 512 training
    rows (the page's calibration), and, a diagnosis only, by the gradient scores of 512 held-out rows; the unpruned
    model's metrics on its own training rows (how well it fits them)."""
    tok = load_tokenizer(task.path)
    train = load_calibration(task.model, tok, DataConfig(path=str(task.splits["train"]), batch_size=64))
    out: dict[str, Any] = {"train_metrics": dict(evaluate(task.model, train, None, bleu=False).metrics)}
    held = load_calibration(task.model, tok, DataConfig(path=str(task.splits["test"]), batch_size=8, max_examples=512))
    for scorer in SCORERS:
        for k in (16, 8):
            out[f"{scorer} {k}"] = task.accuracy(
                plan_prune(task.model, task.cal, PruneConfig(method=scorer, keep=k)).mask
            )
            if scorer == "gradient":
                mask = plan_prune(task.model, held, PruneConfig(method=scorer, keep=k)).mask
                out[f"gradient (held-out scores) {k}"] = task.accuracy(mask)
    return {"after_cut": out}


def _train_accuracy(task: Task, model: Any) -> float:
    tok = load_tokenizer(task.path)
    cal = load_calibration(model, tok, DataConfig(path=str(task.splits["train"]), batch_size=64))
    return 100.0 * eval_metric(model, cal).measure(HeadMask.full(headcut.model_blocks(model)))


def _curve(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"step": h["step"], **{k: v for k, v in h.items() if k.startswith("eval")}}
        for h in history
        if any(k.startswith("eval") for k in h)
    ]


def _with_copies(
    path: Path,
    out: Path,
    copies: int,
    seed: int,
    make: Callable[[dict[str, str], list[dict[str, str]], random.Random], str],
) -> Path:
    """The training file with ``copies`` rows after every row, each with the text ``make(row, rows, rng)`` and the
    row's label, written to ``out``."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    out_rows = []
    for r in rows:
        out_rows.append(r)
        out_rows += [{**r, "text": make(r, rows, rng)} for _ in range(copies)]
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(out_rows)
    return out


def augmented(path: Path, folder: Path, copies: int, seed: int = 0) -> Path:
    """The training file with ``copies`` perturbed copies of every row (the same label): each word is dropped
    with probability 0.15 or replaced by a random word of the file with probability 0.1."""
    vocab: list[str] = []

    def perturb(r: dict[str, str], rows: list[dict[str, str]], rng: random.Random) -> str:
        if not vocab:
            vocab.extend(w for row in rows for w in row["text"].split())
        words = []
        for w in r["text"].split():
            u = rng.random()
            if u < 0.15:
                continue
            words.append(rng.choice(vocab) if u < 0.25 else w)
        return " ".join(words) or r["text"]

    return _with_copies(path, folder / f"augmented-{copies}.csv", copies, seed, perturb)


def spliced(path: Path, folder: Path, copies: int, seed: int = 0) -> Path:
    """The training file with ``copies`` spliced rows per row: the first words of the row (a random cut) followed by
    the last words of another random row (a random cut): inputs between the rows for distillation alone (alpha 1:
    the label column, the first row's, is not read)."""

    def splice(r: dict[str, str], rows: list[dict[str, str]], rng: random.Random) -> str:
        head, tail = r["text"].split(), rng.choice(rows)["text"].split()
        return " ".join(head[: rng.randint(1, len(head))] + tail[rng.randint(0, max(len(tail) - 1, 0)) :])

    return _with_copies(path, folder / f"spliced-{copies}.csv", copies, seed, splice)


def recovery(task: Task, k: int, steps: int, **finetune: Any) -> dict[str, Any]:
    """The recipe's cut (one-shot gradient scores on every training row; ``method``, ``cut_options``: another
    method's), then ``steps`` of recovery with ``finetune``'s options (default: distilled from the unpruned model,
    alpha 0.5, T 2: the recipe's; ``train_only``: a regular expression of the parameters trained, the others
    frozen), evaluated on the held-out split every ``CURVE_EVERY`` steps (``seed``: of the cut's data order and
    the recovery's)."""
    start = time.perf_counter()
    refit = finetune.pop("refit", False)
    seed = finetune.pop("seed", 0)
    train_only = finetune.pop("train_only", None)
    method, cut_options = finetune.pop("method", "gradient"), finetune.pop("cut_options", {})
    pruned = headcut.prune(
        task.path,
        method,
        keep=k,
        data=task.splits["train"],
        data_options=TRAIN_OPTIONS,
        seed=seed,
        progress=task.progress,
        min_heads_per_block=finetune.pop("min_heads_per_block", 0),
        refit=refit,
        eval_data=task.splits["test"] if refit else None,
        **cut_options,
    )
    after_cut = task.held_out(pruned.model)
    cut_only = {"after_cut": 100 * pruned.report["metric"]["after_pruning"], "after_refit": after_cut} if refit else {}
    if train_only is not None:  # the other parameters frozen (the trainer leaves out those without a gradient)
        for name, p in pruned.model.named_parameters():
            p.requires_grad_(re.search(train_only, name) is not None)
    teacher = finetune.pop("teacher", task.path)
    data = finetune.pop("data", task.splits["train"])
    data_options = dict(TRAIN_OPTIONS, max_examples=finetune.pop("max_examples", TRAIN_OPTIONS["max_examples"]))
    tuned = headcut.finetune(
        pruned.model,
        data,
        eval_data=task.splits["test"],
        teacher=teacher,
        max_steps=steps,
        eval_every=CURVE_EVERY,
        checkpoint_every=None,
        seed=seed,
        data_options=data_options,
        progress=task.progress,
        **finetune,
    )
    return {
        "after_cut": after_cut,
        "after": task.held_out(tuned.model),
        "train_accuracy": _train_accuracy(task, tuned.model),
        "curve": _curve(tuned.result.history),
        "seconds": time.perf_counter() - start,
        **cut_only,
    }


def rounds(task: Task, ks: list[int], steps: int) -> dict[str, Any]:
    """Cuts in rounds: gradient scores of the current model, cut to the next K of ``ks``, ``steps`` of distilled
    recovery (from the unpruned model), and again."""
    start = time.perf_counter()
    model: Any = task.path
    stages = []
    for k in ks:
        pruned = headcut.prune(
            model, "gradient", keep=k, data=task.splits["train"], data_options=TRAIN_OPTIONS, progress=task.progress
        )
        after_cut = task.held_out(pruned.model)  # finetune trains the model in place
        tuned = headcut.finetune(
            pruned.model,
            task.splits["train"],
            teacher=task.path,
            max_steps=steps,
            checkpoint_every=None,
            seed=0,
            data_options=TRAIN_OPTIONS,
            progress=task.progress,
        )
        model = tuned.model
        stages.append({"k": k, "after_cut": after_cut, "after": task.held_out(model)})
    return {"stages": stages, "after": stages[-1]["after"], "seconds": time.perf_counter() - start}


def learned_then_recovery(task: Task, k: int, method: str, gate_steps: int, steps: int) -> dict[str, Any]:
    """Learned gates (``gate_steps`` distilled from the unpruned model, alpha 0.9), then ``steps`` of recovery."""
    start = time.perf_counter()
    pruned = headcut.prune(
        task.path,
        method,
        keep=k,
        data=task.splits["train"],
        data_options=TRAIN_OPTIONS,
        max_steps=gate_steps,
        alpha=0.9,
        recover_steps=steps,
        progress=task.progress,
    )
    return {
        "after": task.held_out(pruned.model),
        "after_gates": 100 * pruned.report["metric"].get("after_pruning", float("nan"))
        if pruned.report.get("metric")
        else None,
        "seconds": time.perf_counter() - start,
    }


def _other_snippets(task: Task, shuffle: bool = True) -> list[dict[str, str]]:
    """The Rotten Tomatoes snippets of the three classes in neither split (review-plot only), shuffled (seed 0)."""
    import bz2

    import headcut_offline as offline

    taken = {r["text"] for p in task.splits.values() for r in csv.DictReader(p.open(newline=""))}
    with bz2.open(offline.data_dir() / "rotten_tomatoes_corpus_full.csv.bz2", "rt", newline="") as f:
        other = [
            {"text": r["text"].strip(), "label": r["category"]}
            for r in csv.DictReader(f)
            if r["category"] in offline.REVIEW_LABELS and r["text"].strip() not in taken
        ]
    if shuffle:
        random.Random(0).shuffle(other)
    return other


def _unlabelled(task: Task, folder: Path, n: int) -> Path:
    """The training rows and Rotten Tomatoes snippets of neither split, ``n`` rows in all (review-plot only): a
    diagnosis of what more inputs would do (trained with distillation alone, their labels are not read)."""
    with task.splits["train"].open(newline="") as f:
        train = list(csv.DictReader(f))
    other = _other_snippets(task)
    rows = train + other[: max(n - len(train), 0)]
    random.Random(1).shuffle(rows)
    out = folder / "more.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)
    return out


def _with_unlabelled(task: Task, k: int, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return recovery(task, k, 1000 if k < 12 else 500, data=_unlabelled(task, Path(tmp), n), alpha=1.0)


def _with_all_inputs(task: Task, k: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """The refit, then ``steps`` of distillation alone on every Rotten Tomatoes snippet of neither split (12,086
    with the training rows; review-plot only): what many more unlabelled in-domain inputs do."""
    with tempfile.TemporaryDirectory() as tmp:
        data = _unlabelled(task, Path(tmp), 10**6)
        return recovery(task, k, steps, data=data, alpha=1.0, refit=True, max_examples=10**6, seed=seed)


def with_recover_data(task: Task, k: int, steps: int = 1000) -> dict[str, Any]:
    """``headcut prune --method gradient --refit --recover-steps STEPS --recover-data FILE`` (the command line's
    path), FILE the other snippets' texts alone, one copy of each, shuffled (seed 0; 11,136, one of them empty;
    review-plot only)."""
    start = time.perf_counter()
    texts = list(dict.fromkeys(r["text"] for r in _other_snippets(task, shuffle=False)))
    random.Random(0).shuffle(texts)
    with tempfile.TemporaryDirectory() as tmp:
        extra = Path(tmp) / "unlabelled.csv"
        with extra.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text"])
            w.writerows([t] for t in texts)
        pruned = headcut.prune(
            task.path,
            "gradient",
            keep=k,
            data=task.splits["train"],
            eval_data=task.splits["test"],
            data_options=TRAIN_OPTIONS,
            refit=True,
            recover_steps=steps,
            recover_data=extra,
            progress=task.progress,
        )
    metric = pruned.report["metric"]
    return {
        "after_cut": 100 * metric["after_pruning"],
        "after_refit": 100 * metric["after_refit"],
        "after": 100 * metric["after"],
        "examples": pruned.report["recovery"]["recover_data"]["examples"],
        "seconds": time.perf_counter() - start,
    }


def _with_augmented(
    task: Task, k: int, copies: int, finetune: dict[str, Any], how: Any = augmented, steps: int | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = how(task.splits["train"], Path(tmp), copies)
        return recovery(task, k, steps or (1000 if k < 12 else 500), data=data, **finetune)


#: distillation alone on many inputs made from the training rows, after the refit, 1,000 steps
_MADE = {"alpha": 1.0, "refit": True, "max_examples": 10**6}


#: recovery with part of the model frozen: (refit first, what is trained, the trained parameters' names: those of
#: the page's classifiers, all BERT-architecture MiniLMs; a benchmark of these tasks, not headcut's own code)
FROZEN = [
    (False, "attention and LayerNorms trained", r"attention\.|LayerNorm|pooler|classifier"),
    (True, "attention and LayerNorms trained", r"attention\.|LayerNorm|pooler|classifier"),
    (True, "attention outputs and LayerNorms trained", r"attention\.output\.|LayerNorm|classifier"),
    (False, "embeddings frozen", r"encoder\.|pooler|classifier"),
    (True, "embeddings frozen", r"encoder\.|pooler|classifier"),
    (True, "biases and LayerNorms trained", r"bias|LayerNorm|classifier"),
]

RUNS = {
    "stability": lambda task, k: stability(task, k),
    "scorers": lambda task, k: scorers(task),
    "recipe": lambda task, k: recovery(task, k, 1000 if k < 12 else 500),
    "task loss only": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, teacher=None),
    "distilled + hidden states": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, hidden_weight=1.0),
    "augmented x3": lambda task, k: _with_augmented(task, k, 3, {}),
    "augmented x3 (distillation only)": lambda task, k: _with_augmented(task, k, 3, {"alpha": 1.0}),
    "4000 inputs (distillation only)": lambda task, k: _with_unlabelled(task, k, 4000),
    "recipe lr 1e-4": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, lr=1e-4),
    "recipe min 1 head per layer": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, min_heads_per_block=1),
    "rounds 36-16-K": lambda task, k: rounds(task, [36, 16, k], 333),
    "refit + recipe": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, refit=True),
    "refit + every in-domain input 2000 steps (distillation only)": lambda task, k: _with_all_inputs(task, k, 2000),
    "refit + 2000 steps on the training rows (distillation only)": lambda task, k: recovery(
        task, k, 2000, alpha=1.0, refit=True
    ),
    "refit + recipe 1000 steps": lambda task, k: recovery(task, k, 1000, refit=True),
    "refit + every in-domain input 1000 steps (distillation only)": lambda task, k: _with_all_inputs(task, k, 1000),
    "refit + recipe 1000 steps seed 1": lambda task, k: recovery(task, k, 1000, refit=True, seed=1),
    "refit + every in-domain input 1000 steps (distillation only) seed 1": lambda task, k: _with_all_inputs(
        task, k, 1000, seed=1
    ),
    "refit + --recover-data 1000 steps": with_recover_data,
    "refit + word-augmented x10 1000 steps (distillation only)": lambda task, k: _with_augmented(
        task, k, 10, dict(_MADE), steps=1000
    ),
    "refit + spliced x10 1000 steps (distillation only)": lambda task, k: _with_augmented(
        task, k, 10, dict(_MADE), how=spliced, steps=1000
    ),
    "refit + word-augmented x10 + hidden states 1000 steps (distillation only)": lambda task, k: _with_augmented(
        task, k, 10, dict(_MADE, hidden_weight=1.0), steps=1000
    ),
    "dsp 500 + recovery 500": lambda task, k: learned_then_recovery(task, k, "dsp", 500, 500),
    **{
        f"{'refit + ' if refit else ''}recipe, {what}": (
            lambda task, k, refit=refit, pattern=pattern: recovery(
                task, k, 1000 if k < 12 else 500, refit=refit, train_only=pattern
            )
        )
        for refit, what, pattern in FROZEN
    },
    "recipe lr 2e-5": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, lr=2e-5),
    "recipe with temperature 5 and alpha 0.9": lambda task, k: recovery(
        task, k, 1000 if k < 12 else 500, temperature=5.0, alpha=0.9
    ),
    "refit + recipe with fluctuation scores and hidden states": lambda task, k: recovery(
        task, k, 1000 if k < 12 else 500, method="fluctuation", refit=True, hidden_weight=1.0
    ),
    "recipe with mixup 0.4": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, mixup=0.4),
    "recipe with fluctuation scores and mixup 0.4": lambda task, k: recovery(
        task, k, 1000 if k < 12 else 500, method="fluctuation", mixup=0.4
    ),
    "recipe, fluctuation scores": lambda task, k: recovery(task, k, 1000 if k < 12 else 500, method="fluctuation"),
    "recipe, fluctuation scores and bias compensation": lambda task, k: recovery(
        task, k, 1000 if k < 12 else 500, method="fluctuation", cut_options={"bias_compensation": True}
    ),
}


#: ``headcut prune`` arguments a report's command line repeats (the data paths are the task's splits)
_FLAGS = (
    "method",
    "keep",
    "via",
    "via_steps",
    "max_examples",
    "batch_size",
    "recover_steps",
    "recover_hidden_weight",
    "recover_average",
    "refit",
    "bias_compensation",
    "seed",
)


def report_row(path: Path) -> dict[str, Any]:
    """A row of a ``headcut prune ... --eval-data TEST --json FILE`` run on the command line (``--reports``) on the
    task of ``--tasks``: the accuracy after the cut and after the recovery, the whole command's time, and the
    command."""
    import json

    report = json.loads(path.read_text())
    args = report["arguments"]
    flags = [
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k in _FLAGS
        if (v := args.get(k)) not in (None, False) and not (k == "seed" and v == 0)
    ]
    metric = report["metric"]
    rounds = [
        {"k": r["keep"], **{k: 100 * v for k, v in r["metric"].items() if v is not None}}
        for r in report.get("rounds", [])
    ]
    steps = sum((r.get("recovery") or {}).get("steps", 0) for r in [*report.get("rounds", []), report])
    extra = args.get("recover_data")
    flags += [f"--recover-data {Path(extra).name}"] if extra else []
    return {
        "k": args["keep"],
        "steps": steps,
        **({"rounds": rounds} if rounds else {}),
        "before": 100 * metric["before"],
        "after_cut": 100 * metric["after_pruning"],
        "after": 100 * metric["after"],
        "seconds": report["seconds"],
        "command": " ".join(
            ["headcut prune", Path(args["model"]).name, *flags, "--data train.csv --eval-data test.csv"]
        ),
        **({"after_refit": 100 * metric["after_refit"]} if metric.get("after_refit") is not None else {}),
    }


def run_names(arg: str) -> list[str]:
    """``--runs``' names: comma-separated, a name's own commas kept (the longest name of ``RUNS`` that the next
    comma-separated parts spell)."""
    parts, names = arg.split(","), []
    while parts:
        for n in range(len(parts), 0, -1):
            name = ",".join(parts[:n]).strip()
            if name in RUNS:
                names.append(name)
                del parts[:n]
                break
        else:
            raise SystemExit(f"unknown run {parts[0].strip()!r}; the runs: {'; '.join(RUNS)}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="review-plot,debates")
    ap.add_argument("--ks", default="8")
    ap.add_argument("--runs", default=",".join(RUNS), help="runs to measure, comma-separated (names of RUNS)")
    ap.add_argument(
        "--results",
        default=None,
        help="the results file's name (one per process when several run at once; default: "
        "small_data_diagnosis, with --reports small_data_cli)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument(
        "--reports",
        nargs="*",
        default=[],
        metavar="FILE",
        help="keep rows of command-line runs instead of measuring: `headcut prune` --json reports "
        "of the one task of --tasks, run name --report-run",
    )
    ap.add_argument(
        "--report-run",
        default="recipe with fluctuation's cut (command line)",
        help="the run name of the --reports rows",
    )
    ap.add_argument(
        "--report-timing",
        default=None,
        metavar="TEXT",
        help="how the --reports runs were timed, where not alone on the machine (the rows' 'timing')",
    )
    ap.add_argument(
        "--report-device",
        default=None,
        metavar="NAME",
        help="the GPU the --reports runs ran on (the rows' 'device'; the page judges no GPU time "
        "against the CPU limit)",
    )
    args = ap.parse_args()
    args.results = args.results or ("small_data_cli" if args.reports else "small_data_diagnosis")
    if args.reports:
        if "," in args.tasks:
            raise SystemExit("--reports: name their task with --tasks (one task)")
        store = Store(args.results, rerun=False)
        for path in map(Path, args.reports):
            row = (
                report_row(path)
                | ({"timing": args.report_timing} if args.report_timing else {})
                | ({"device": args.report_device} if args.report_device else {})
            )
            store.data.setdefault("unpruned", {})[args.tasks] = row.pop("before")
            key = {"task": args.tasks, "k": row.pop("k"), "run": args.report_run}
            if not any(all(r.get(k) == v for k, v in key.items()) for r in store.data["rows"]):
                store.data["rows"].append({**row, **key})
        store.save(complete=False, measured=False)  # measured elsewhere: the study's machine and time stay
        return
    run_names(args.runs)  # unknown names refused before any work
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    store = Store(args.results, rerun=False)
    for name in args.tasks.split(","):
        task = Task.load(name)
        store.data.setdefault("unpruned", {})[name] = task.accuracy()
        for k in map(int, args.ks.split(",")):
            for run in run_names(args.runs):
                row = store.row({"task": name, "k": k, "run": run}, lambda: RUNS[run](task, k))
                log(f"{name} K={k} {run}: {row.get('after', row.get('after_cut'))}")
    store.save(complete=False)


if __name__ == "__main__":
    main()
