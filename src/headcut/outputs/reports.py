"""The reports headcut writes: the JSON of every command (``--json``), the report file inside every
output folder, and the trajectory CSV/PNG of ``prune``. The command line and the Python API build
them here, so both give the same report for the same run.

Report files: ``headcut-report.json`` (``export``, ``prune``) and ``headcut-finetune.json``
(``finetune``). Every report has ``report_format``, ``command``, ``model``, ``arguments``, ``seed``
(where the command has one) and ``versions``.
"""

from __future__ import annotations

import csv
import platform
from pathlib import Path
from typing import Any

from .. import __version__

REPORT_FORMAT = 1
#: the report file of ``export`` and ``prune`` outputs
PRUNE_REPORT = "headcut-report.json"
#: the report file of ``finetune`` outputs
FINETUNE_REPORT = "headcut-finetune.json"

#: why a prune search stopped, in words
STOPPED = {
    "budget": "reached the budget",
    "max-drop": "stopped: the next step dropped the metric by more than --max-drop",
    "floor": "reached the floor (--keep/--sparsity, or nothing more may go) within --max-drop",
    "policy": "the method's own choice of how many heads go",
    "bound": "the method's choice, held to the --keep/--sparsity upper bound",
}


def versions() -> dict[str, str]:
    """The versions a report records."""
    import torch
    import transformers

    return {
        "headcut": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def header(command: str, model: str, arguments: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """The fields every report starts with."""
    out: dict[str, Any] = {"report_format": REPORT_FORMAT, "command": command, "model": model, "arguments": arguments}
    if seed is not None:
        out["seed"] = seed
    out["versions"] = versions()
    return out


def weights_bytes(folder: Path | None) -> int | None:
    """Bytes of the safetensors weights in a checkpoint folder (None for a Hub id or no folder)."""
    if folder is None or not folder.is_dir():
        return None
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and f.name.endswith(".safetensors"))


def metric_entry(
    name: str | None, higher: bool | None, before: float | None, after: float | None, **extra: Any
) -> dict[str, Any] | None:
    """A report's ``metric``: name, orientation, before, after and the change."""
    if name is None:
        return None
    change = after - before if before is not None and after is not None else None
    return {"name": name, "higher_is_better": higher, "before": before, "after": after, "change": change, **extra}


def prune_report(
    *,
    model: str,
    arguments: dict[str, Any],
    result: Any,
    slimmed: Any,
    size_before: int | None,
    data: dict[str, Any] | None,
    eval_data: dict[str, Any] | None,
    seconds: float,
    notes: list[str],
) -> dict[str, Any]:
    """The report of one prune run (``headcut-report.json`` and ``--json``); ``out`` and the weights'
    size after are filled in when the model is saved."""
    report = header("prune", model, arguments, result.config.seed)
    report.update(
        {
            "out": None,
            "method": result.method,
            "mask": result.mask.to_json(),
            "stopped": result.stopped,
            "target": result.target,
            "heads": {
                "before": slimmed.total_before,
                "after": slimmed.total_after,
                "per_block_before": dict(slimmed.heads_before),
                "per_block_after": dict(slimmed.heads_after),
            },
            "params": {
                "before": slimmed.params_before,
                "after": slimmed.params_after,
                "unshared": slimmed.unshared_params,
            },
            "size_bytes": {"before": size_before, "after": None},
            "metric": metric_entry(
                result.metric,
                result.higher_is_better,
                result.metric_before,
                result.metric_after,
                max_drop=result.config.max_drop,
            ),
            "trajectory": [p.to_json() for p in result.trajectory],
            "scorings": result.scorings,
            "prune_seconds": result.seconds,
            "seconds": seconds,
            "config": result.config.to_json(),
            "options": None,
            "score_config": None,
            "training": None,
            "data": data,
            "eval_data": eval_data,
            "notes": notes,
        }
    )
    report.update(result.section())
    return report


def finetune_report(
    *,
    model: str,
    teacher: str | None,
    arguments: dict[str, Any],
    result: Any,
    data: dict[str, Any],
    eval_data: dict[str, Any] | None,
    seconds: float,
    notes: list[str],
) -> dict[str, Any]:
    """The report of one finetune run (``headcut-finetune.json`` and ``--json``)."""
    res = result.to_json()
    report = header("finetune", model, arguments, result.config.seed)
    report.update(
        {
            "teacher": teacher,
            "out": None,
            "task": result.task,
            "steps": result.steps,
            "resumed_from": result.resumed_from,
            "metric": res["metric"],
            "eval_before": result.eval_before,
            "eval_after": result.eval_after,
            "history_summary": result.summary(),
            "history": result.history,
            "distributed": result.distributed,
            "early_stopping": result.early_stopping,
            "config": result.config.to_json(),
            "data": data,
            "eval_data": eval_data,
            "train_seconds": result.seconds,
            "seconds": seconds,
            "notes": notes,
        }
    )
    return report


def export_report(
    *, model: str, arguments: dict[str, Any], mask: Any, gqa: str, slimmed: Any, notes: list[str]
) -> dict[str, Any]:
    """The report of one export (``headcut-report.json`` and ``--json``)."""
    report = header("export", model, arguments)
    report.update({"out": None, "mask": mask, "gqa": gqa, **slimmed.to_json(), "notes": notes})
    return report


def write_trajectory_csv(path: Path, result: Any) -> None:
    """One row per step of a prune search: step, heads, metric, within --max-drop, re-scored, heads removed."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "heads", "metric", "within", "rescored", "removed"])
        for p in result.trajectory:
            w.writerow(
                [
                    p.step,
                    p.heads,
                    "" if p.metric is None else repr(p.metric),
                    "" if p.within is None else str(p.within).lower(),
                    str(p.rescored).lower(),
                    " ".join(p.removed),
                ]
            )


def write_trajectory_png(path: Path, result: Any, title: str) -> None:
    """The metric against heads kept (the papers' accuracy-versus-heads curve); needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    points = [p for p in result.trajectory if p.metric is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p.heads for p in points], [p.metric for p in points], marker="o", markersize=3)
    if result.metric_before is not None:
        ax.axhline(result.metric_before, color="grey", linestyle=":", linewidth=1, label="unpruned")
        if result.config.max_drop is not None:
            sign = -1 if result.higher_is_better else 1
            ax.axhline(
                result.metric_before + sign * result.config.max_drop,
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"max drop {result.config.max_drop:g}",
            )
    ax.axvline(result.total_after, color="green", linewidth=1, label=f"kept {result.total_after}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.invert_xaxis()
    ax.set_xlabel("heads kept")
    ax.set_ylabel(result.metric or "metric")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
