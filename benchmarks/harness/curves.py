"""The accuracy curves of the page (accuracy by heads kept, one curve per method): read from the stored rows, as a
table and as a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness.formatting import fmt, pyplot
from headcut.catalog import METHODS

LEARNED_STYLE = {"linestyle": "-.", "marker": "^"}


def oneshot_curves(study: dict[str, Any] | None) -> dict[str, dict[int, float]]:
    curves: dict[str, dict[int, float]] = {}
    for row in (study or {}).get("rows", []):
        if "accuracy" in row:
            curves.setdefault(row["method"], {})[row["k"]] = row["accuracy"]
    return curves


def training_free_curves(data: dict[str, dict[str, Any]]) -> dict[str, dict[int, float]]:
    """The one-shot and iterative methods' curves (nothing trained)."""
    return {**oneshot_curves(data.get("oneshot")), **oneshot_curves(data.get("iterative"))}


def learned_curves(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """The learned-gate runs' curves (500 steps, the papers' loss): every row with an accuracy ``after``."""
    curves: dict[str, dict[int, float]] = {}
    for row in rows:
        if "method" in row and "after" in row:
            curves.setdefault(f"{row['method']} (learned, 500 steps)", {})[row["k"]] = row["after"]
    return curves


def default_rows(data: dict[str, dict[str, Any]], task: str) -> dict[int, dict[str, Any]]:
    """The main job's default on ``task`` (``small_data_cli``'s rows, seed 0): heads -> the row that stands for it, a
    run alone on the machine before one that shared the cores."""
    shown: dict[int, dict[str, Any]] = {}
    for row in (data.get("small_data_cli") or {}).get("rows", []):
        if row["task"] == task and row["run"] in DEFAULT_SHOWN:
            held = shown.get(row["k"])
            if held is None or DEFAULT_SHOWN.index(row["run"]) < DEFAULT_SHOWN.index(held["run"]):
                shown[row["k"]] = row
    return shown


def default_curve(data: dict[str, dict[str, Any]], task: str) -> dict[str, dict[int, float]]:
    rows = default_rows(data, task)
    return {DEFAULT_CURVE: {k: r["after"] for k, r in sorted(rows.items(), reverse=True)}} if rows else {}


def all_curves(data: dict[str, dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Accuracy by heads kept on the README's classifier, per method and per peer run."""
    curves: dict[str, dict[int, float]] = default_curve(data, "rt")
    recipe = [r for r in data.get("recipe", {}).get("rows", []) if r["seed"] == 0]
    if recipe:
        curves["headcut recipe (gradient + distilled recovery)"] = {r["k"]: r["after"] for r in recipe}
    curves.update(learned_curves(data.get("learned", {}).get("rows", []) + data.get("voita", {}).get("rows", [])))
    curves.update(training_free_curves(data))
    for variant, run in data.get("peer", {}).get("runs", {}).items():
        curves[f"textpruner ({variant})"] = {r.get("kept", int(k)): r["accuracy"] for k, r in run["ks"].items()}
    return curves


def absent_methods(curves: dict[str, dict[int, float]], points: dict[str, tuple[int, float]]) -> list[str]:
    """headcut's methods (the inverse-* controls aside) with neither a curve nor a point on the plot."""
    shown = [name.split(" ")[0] for name in [*curves, *points]]
    return [m for m in METHODS if not m.startswith("inverse-") and m not in shown]


def _style(name: str) -> dict[str, Any]:
    if name.startswith("textpruner"):
        return {"color": "black", "linestyle": "--", "marker": "s", "linewidth": 2.0}
    if name == DEFAULT_CURVE:
        return {"color": "darkgreen", "marker": "D", "linewidth": 2.5}
    if name.startswith("headcut recipe"):
        return {"color": "crimson", "marker": "o", "linewidth": 2.5}
    if "(learned" in name:
        return dict(LEARNED_STYLE)
    return {"marker": "o"}


def plot_curves(
    curves: dict[str, dict[int, float]], points: dict[str, tuple[int, float]], unpruned: float, title: str, out: Path
) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 6.5))
    cmap = plt.get_cmap("tab20")
    for i, (name, curve) in enumerate(curves.items()):
        ks = sorted(curve)
        style = {"color": cmap(i % 20), "linewidth": 1.2, **_style(name)}
        ax.plot(ks, [curve[k] for k in ks], label=name, markersize=3.5, **style)
    for name, (k, acc) in points.items():
        ax.plot([k], [acc], marker="*", markersize=13, linestyle="none", label=name)
    ax.axhline(unpruned, color="grey", linewidth=0.8)
    ax.text(71, unpruned + 0.3, f"unpruned {unpruned:.1f} %", ha="right", fontsize=8, color="grey")
    ax.set_xlabel("heads kept (of 72)")
    ax.set_ylabel("accuracy on the held-out set (%)")
    ax.set_title(title)
    ax.set_xlim(0, 73)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def curve_table(curves: dict[str, dict[int, float]]) -> list[str]:
    ks = sorted({k for c in curves.values() for k in c}, reverse=True)
    lines = ["| method | " + " | ".join(str(k) for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, curve in curves.items():
        lines.append(f"| {name} | " + " | ".join(fmt(curve.get(k)) for k in ks) + " |")
    return lines


#: the run name (``small_data.py --reports ... --report-run``) of the main job's default recipe's rows: the
#: fluctuation cut, ``--refit``, recovery with hidden-state matching (weight 2) and weight averaging, in two rounds
#: (``--via 24``) below 24 heads, the first recovering for 250 steps and the second for 750 below 12
#: (``--via-steps 250 --recover-steps 750``)
DEFAULT_RUN = "the default"


#: the run name of the rows of the default before ``--recover-average`` and ``--via 24`` (``--via 16`` below 12 heads)
EARLIER_RUN = "the earlier default"


#: the run name of the rows of the default with ``--recover-average 0.5 --via 24`` but ``--recover-hidden-weight 1``
PREVIOUS_RUN = "the previous default"


#: the default's runs that stand for it in the per-task tables, the first present of each task and K: seed 0 on the
#: command line, alone on the machine first
DEFAULT_SHOWN = (
    "the default (command line), 2 torch threads, alone",
    "the default (command line), the README main job, alone",
    "the default (command line)",
)


#: the default's curve in the accuracy tables and plots
DEFAULT_CURVE = "headcut default (fluctuation, refit, distilled recovery)"


#: what the default's curve is, said above each accuracy table
DEFAULT_SAID = (
    "The default: `encoder`, the default recipe of a classifier, run on the command line, seed 0 (FLAP's fluctuation cut, a "
    "least-squares refit, 1,000 steps of batch 8 of distilled recovery with averaged weights, in two rounds "
    "below 24 heads; [targets on every task](#targets-on-every-task))."
)


#: the training rows of each task (what the classifier and the recipe trained on)
TRAINING_ROWS = {"rt": 4000, "convention": 5718, "review-plot": 900, "debates": 786}
