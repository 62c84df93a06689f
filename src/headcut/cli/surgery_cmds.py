"""``headcut info`` and ``headcut export``."""

from __future__ import annotations

import json
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
    FORCE_HELP,
    AllowPickle,
    JsonOut,
    ModelArg,
    Task,
    TrustRemote,
    console,
    handle_errors,
    local_input,
    plan_outputs,
    write_json,
)

#: the report every output of ``headcut export`` holds (what was cut, and that headcut wrote it)
EXPORT_REPORT = "headcut-report.json"


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
    plan_outputs(reads={"MODEL": model}, files={"--json": json_out})
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
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Remove the heads a mask file drops and save a slimmed model that loads back."""
    if gqa not in GQA_POLICIES:
        from ..errors import HeadcutError

        raise HeadcutError(f"unknown --gqa policy {gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
    target, _ = plan_outputs(reads={"MODEL": model, "--mask": mask}, files={"--json": json_out}, out=out, force=force)
    raw = read_mask_file(mask)
    with target:
        loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        result = slim(loaded, raw, gqa=gqa)
        report = dict(result.to_json(), command="export", model=model, mask=raw, gqa=gqa, out=str(out))

        def write_report(folder: Path) -> None:
            (folder / EXPORT_REPORT).write_text(json.dumps(report, indent=2) + "\n")

        saved = io.save(loaded, target, source=local_input(model), extra=write_report,
                        trust_remote_code=trust_remote_code)
    console.print(
        f"kept {result.total_after} of {result.total_before} heads; parameters "
        f"{result.params_before:,} -> {result.params_after:,}; saved to {out}"
    )
    if result.unshared_params:
        console.print(f"note: unsharing weights added {result.unshared_params:,} parameters before the cut")
    for note in result.notes + saved.notes:
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    write_json(report, json_out)
