"""``headcut methods [NAME]``: the pruning methods, or one method in full (paper, data, defaults, options),
read from the registry and the methods' option declarations without importing torch."""

from __future__ import annotations

from typing import Annotated

import typer

from ..catalog import METHODS, method_entry
from ..options import static_specs
from .app import app
from .completion import _choices
from .declared import with_settings
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting

KIND = {
    "score": "ranked by a scorer",
    "learned": "gates trained with the model",
    "agent": "a DQN agent, layer by layer",
    "rewind": "train, prune, rewind (lottery ticket)",
}
DATA = {
    "none": "none (data-free)",
    "calibration": "calibration data (--data)",
    "training": "labelled training data (--data)",
}


def describe(name: str) -> dict:
    """Method ``name`` as ``headcut methods NAME --json`` writes it."""
    entry = method_entry(name)
    options = [
        {
            "flag": s.flag,
            "keyword": s.name,
            "default": s.default,
            "help": s.help,
            **({"choices": list(s.meta.choices)} if s.meta.choices else {}),
        }
        for s in static_specs(entry.options)
        if s.meta.cli
    ]
    return {
        "name": entry.name,
        "summary": entry.summary,
        "paper": entry.citation,
        "kind": entry.kind,
        "data": entry.data,
        "budget": entry.budget,
        "resumable": entry.resumable,
        "options": options,
    }


@app.command(
    cls=TidyCommand,
    name="methods",
    epilog=examples("headcut methods", "headcut methods pass", "headcut methods --json - | jq -r '.[].name'"),
)
@handle_errors
@with_settings(Reporting, "reporting", skip=("quiet",))
def methods_cmd(
    name: Annotated[
        str | None,
        typer.Argument(help="A method to describe in full.", metavar="NAME", autocompletion=_choices(METHODS)),
    ] = None,
    reporting: Reporting = Reporting(),
) -> None:
    """List the pruning methods (kind, data, paper), or describe one: its paper and section, the data it reads,
    what it trains, and every option with its flag, Python keyword and default."""
    from rich import box
    from rich.table import Table

    log = Out(reporting.json_out)
    if name is None:
        table = Table(box=box.SIMPLE_HEAD, title="pruning methods (headcut methods NAME for one)")
        for column in ("method", "kind", "data", "paper", "options"):
            table.add_column(column)
        for entry in METHODS.values():
            flags = [s.flag for s in static_specs(entry.options) if s.meta.cli]
            table.add_row(entry.name, entry.kind, entry.data, entry.short_citation, str(len(flags)))
        log.show(table)
        log.json([describe(n) for n in METHODS])
        return
    info = describe(name)
    entry = method_entry(name)
    log.show(f"{entry.name}: {entry.summary}")
    log.show(f"paper: {entry.citation}")
    log.show(
        f"kind: {entry.kind} ({KIND[entry.kind]}); data: {DATA[entry.data]}; budget: "
        + ("--keep/--sparsity/--max-drop" if entry.budget == "required" else "optional (an upper bound)")
        + ("; resumable (--resume)" if entry.resumable else "")
    )
    table = Table(box=box.SIMPLE_HEAD, title=f"options of {name} (Python: headcut.prune(..., keyword=value))")
    for column in ("flag", "keyword", "default", "what"):
        table.add_column(column, overflow="fold")
    for option in info["options"]:
        default = "-" if option["default"] is None else str(option["default"])
        table.add_row(option["flag"], option["keyword"], default, option["help"])
    log.show(table)
    log.json(info)
