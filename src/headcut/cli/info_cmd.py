"""``headcut info``: a model's attention blocks and size."""

from __future__ import annotations

from ..config.run import ModelSource
from ..files.plan import plan_outputs
from .app import app
from .declared import with_settings
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting
from .params import ModelArg


@app.command(
    cls=TidyCommand,
    epilog=examples(
        "headcut info model/", "headcut info slim/ --json - | jq .total_heads", "headcut info model/ > blocks.txt"
    ),
)
@handle_errors
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def info(model: ModelArg, reporting: Reporting = Reporting(), source: ModelSource = ModelSource()) -> None:
    """Show a model's attention blocks: name, kind, layer, heads, KV heads, head size; and its size."""
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api
    from .render.info import info_table

    plan_outputs(reads={"MODEL": model}, files={"--json": reporting.json_out})
    out = Out(reporting.json_out, reporting.quiet)
    result = api.info(
        model, task=source.task, allow_pickle=source.allow_pickle, trust_remote_code=source.trust_remote_code
    )
    for item in info_table(model, result):
        out.show(item)
    out.json(result.to_json())
