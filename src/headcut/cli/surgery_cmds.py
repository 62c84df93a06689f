"""``headcut info`` and ``headcut export``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .. import io
from ..info import info as model_info
from ..masks import GQA_POLICIES, read_mask_file
from ..surgery import slim
from . import app
from .common import (
    AllowPickle,
    JsonOut,
    ModelArg,
    Task,
    TrustRemote,
    console,
    handle_errors,
    write_json,
)


@app.command()
@handle_errors
def info(
    model: ModelArg,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Show a model's attention blocks: name, kind, layer, heads, KV heads, head size; and its size."""
    loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    result = model_info(loaded)
    table = Table(title=f"{model}: {result.architecture} ({result.family})")
    for col in ("block", "kind", "layer", "heads", "kv heads", "head dim"):
        table.add_column(col, justify="left" if col in ("block", "kind") else "right")
    for b in result.blocks:
        table.add_row(b.name, b.kind, str(b.layer), str(b.heads), str(b.kv_heads), str(b.head_dim))
    console.print(table)
    console.print(
        f"{result.total_heads} heads in {len(result.blocks)} blocks, {result.params:,} parameters"
        + (" (slimmed by headcut)" if result.cut else "")
    )
    write_json(result.to_json(), json_out)


@app.command()
@handle_errors
def export(
    model: ModelArg,
    mask: Annotated[Path, typer.Option("--mask", help='Mask JSON: {"keep": {block: [heads]}} or {"drop": ...}.')],
    out: Annotated[Path, typer.Option("--out", help="Output folder (written atomically).")],
    gqa: Annotated[
        str,
        typer.Option(
            "--gqa",
            help="Grouped-query attention policy: group (whole KV groups), uniform (same query heads per "
            "group), duplicate (any subset, KV heads copied), auto (group, else uniform).",
        ),
    ] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing non-empty --out.")] = False,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Remove the heads a mask file drops and save a slimmed model that loads back."""
    if gqa not in GQA_POLICIES:
        from ..errors import HeadcutError

        raise HeadcutError(f"unknown --gqa policy {gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
    raw = read_mask_file(mask)
    io.check_output(out, force)
    loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    result = slim(loaded, raw, gqa=gqa)
    io.save(loaded, out, source=model if Path(model).is_dir() else None, force=force)
    console.print(
        f"kept {result.total_after} of {result.total_before} heads; parameters "
        f"{result.params_before:,} -> {result.params_after:,}; saved to {out}"
    )
    if result.unshared_params:
        console.print(f"note: unsharing weights added {result.unshared_params:,} parameters before the cut")
    for note in result.notes:
        console.print(f"note: {note}")
    write_json(dict(result.to_json(), out=str(out)), json_out)
