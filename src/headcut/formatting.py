"""How values appear in the methods' summaries and the command line's tables (stdlib only: the tables render
without torch)."""

from __future__ import annotations


def metric_text(value: float | None) -> str:
    """A metric as the summaries show it (4 decimals; ``-`` for none)."""
    return "-" if value is None else f"{value:.4f}"
