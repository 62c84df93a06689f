"""``headcut eval``'s tables: the metrics, the perplexity per window length, lm-evaluation-harness results."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table


def _metric(name: str, value: float) -> str:
    if name == "tokens":
        return f"{value:,.0f}"
    if name in ("accuracy", "macro_f1", "mcc"):
        return f"{value:.4f}"
    return f"{value:,.4f}"


def metrics_table(title: str, result: Any) -> Table:
    """The metrics of one evaluation, primary metric first."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("metric")
    table.add_column("value", justify="right")
    arrow = "higher is better" if result.higher_is_better else "lower is better"
    table.add_row(f"{result.primary} ({arrow})", _metric(result.primary, result.value))
    for name, value in result.metrics.items():
        if name != result.primary:
            table.add_row(name, _metric(name, value))
    table.add_row("examples", f"{result.examples:,}")
    table.add_row("examples/s", f"{result.examples_per_s:,.1f}")
    table.add_row("seconds", f"{result.seconds:,.2f}")
    return table


def windows_table(title: str, results: dict[int, Any]) -> Table:
    """Perplexity per window length (``headcut eval --windows``), one row per window length."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for col in ("window", "perplexity (lower is better)", "loss", "windows", "tokens scored", "seconds"):
        table.add_column(col, justify="right")
    for window, result in results.items():
        table.add_row(
            f"{window:,} tokens",
            _metric("perplexity", result.metrics["perplexity"]),
            _metric("loss", result.metrics["loss"]),
            f"{result.examples:,}",
            _metric("tokens", result.metrics["tokens"]),
            f"{result.seconds:,.2f}",
        )
    return table


def harness_table(harness: Any) -> Table:
    """lm-evaluation-harness results: a row per task and metric, with the standard error and the examples."""
    table = Table(box=box.SIMPLE_HEAD)
    for col in ("task", "metric", "value", "stderr", "examples", "shots"):
        table.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for name, entry in harness.tasks.items():
        shown = f"{name} (group)" if entry["group"] else name
        for metric, numbers in entry["metrics"].items():
            value, stderr = numbers["value"], numbers["stderr"]
            table.add_row(
                shown,
                metric,
                "-" if value is None else f"{value:.4f}",
                "-" if stderr is None else f"± {stderr:.4f}",
                "-" if entry["samples"] is None else f"{entry['samples']:,}",
                "-" if entry["num_fewshot"] is None else str(entry["num_fewshot"]),
            )
            shown = ""
    return table
