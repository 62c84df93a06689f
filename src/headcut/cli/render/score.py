"""``headcut score``'s heatmaps: tables shaded by importance, and the PNG of ``--plot``."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text


def _importance_colour(value: float, low: float, high: float) -> str:
    share = 0.0 if high <= low else (value - low) / (high - low)
    level = int(40 + 180 * share)
    return f"on rgb({level // 3},{level // 2},{level})"


def heatmap_tables(blocks: list[Any], scores: Any) -> list[Table]:
    """One table per attention kind: a row per layer, a cell per head, shaded by importance."""
    importance = scores.importance()
    tables = []
    for kind in dict.fromkeys(b.kind for b in blocks):
        of_kind = [b for b in blocks if b.kind == kind]
        values = [v for b in of_kind for v in importance[b.name]]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        width = max((b.heads for b in of_kind), default=0)
        # one power of ten per table keeps the cells short: a cell shows score / 10**exp
        biggest = max((abs(v) for b in of_kind for v in scores.blocks[b.name]), default=0.0)
        exp = math.floor(math.log10(biggest)) if biggest > 0 and math.isfinite(biggest) else 0
        unit = f" (x 1e{exp})" if exp else ""
        table = Table(title=f"{scores.scorer} scores{unit}: {kind} attention", box=box.SIMPLE_HEAD, padding=(0, 1))
        table.add_column("layer", justify="right", no_wrap=True)
        for h in range(width):
            table.add_column(str(h), justify="right", no_wrap=True)
        for b in of_kind:
            cells: list[Any] = []
            for h, raw in enumerate(scores.blocks[b.name]):
                shade = _importance_colour(importance[b.name][h], low, high)
                cells.append(Text(f"{raw / 10**exp:.2f}", style=shade))
            cells += ["-"] * (width - b.heads)
            table.add_row(str(b.layer), *cells)
        tables.append(table)
    return tables


def write_plot(path: str, blocks: list[Any], scores: Any) -> None:
    """A PNG heatmap per attention kind (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(dict.fromkeys(b.kind for b in blocks))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        of_kind = [b for b in blocks if b.kind == kind]
        width = max((b.heads for b in of_kind), default=0)
        grid = np.full((len(of_kind), max(width, 1)), np.nan)
        for i, b in enumerate(of_kind):
            grid[i, : b.heads] = scores.blocks[b.name]
        image = ax.imshow(grid, aspect="auto", cmap="viridis" if scores.higher_is_important else "viridis_r")
        ax.set_xticks(range(width))
        ax.set_yticks(range(len(of_kind)), [str(b.layer) for b in of_kind])
        ax.set_title(f"{scores.scorer}: {kind}")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
