"""``headcut info``'s table."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table


def info_table(model: str, result: Any) -> list[Any]:
    table = Table(box=box.SIMPLE_HEAD)
    for col in ("block", "kind", "layer", "heads", "kv heads", "head dim"):
        table.add_column(col, justify="left" if col in ("block", "kind") else "right")
    for b in result.blocks:
        kind = b.kind if b.mixer == "attention" else f"{b.kind} ({b.mixer})"
        table.add_row(b.name, kind, str(b.layer), str(b.heads), str(b.kv_heads), str(b.head_dim))
    total = f"{result.total_heads} heads in {len(result.blocks)} blocks, {result.params:,} parameters" + (
        " (slimmed by headcut)" if result.cut else ""
    )
    return [f"{model}: {result.architecture} ({result.family})", table, total, *(f"note: {n}" for n in result.notes)]
