"""``headcut finetune``'s summary."""

from __future__ import annotations

from typing import Any

from ...formatting import metric_text as _fmt
from .checkpoint import checkpoint_lines, formats_lines


def finetune_summary(report: dict[str, Any], result: Any, report_name: str) -> list[str]:
    summary = result.summary()
    first, last = summary.get("first", {}), summary.get("last", {})
    resumed = f" (resumed at step {result.resumed_from})" if result.resumed_from is not None else ""
    lines = [
        f"{report['model']}: {result.steps} steps{resumed}, loss {_fmt(first.get('loss'))} -> "
        f"{_fmt(last.get('loss'))}"
        + (f", KL {_fmt(first.get('kl'))} -> {_fmt(last.get('kl'))}" if "kl" in last else "")
    ]
    if result.metric is not None:
        arrow = "higher is better" if result.higher_is_better else "lower is better"
        lines.append(f"{result.metric} ({arrow}): {_fmt(result.metric_before)} -> {_fmt(result.metric_after)}")
    early = getattr(result, "early_stopping", None)
    if early is not None:
        where = f"stopped at step {early['stopped_at']}" if early["stopped_at"] is not None else "ran to the end"
        lines.append(
            f"early stopping ({early['patience']} evaluations): {where}; kept step {early['best_step']} "
            f"({early['metric']} {_fmt(early['best'])})"
        )
    lines += checkpoint_lines(report) + formats_lines(report)
    lines.append(f"saved to {report['out']} (with {report_name})")
    return lines
