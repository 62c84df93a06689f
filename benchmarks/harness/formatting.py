"""What the page's renderers share: a number as the page writes it, and matplotlib's plotting module (imported
only when a plot is drawn: the page's text does not need it)."""

from __future__ import annotations

from typing import Any


def fmt(value: float | None, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals, or nothing for a value not measured."""
    return "" if value is None else f"{value:.{digits}f}"


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    # matplotlib is an optional extra ([plots]), needed only to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
