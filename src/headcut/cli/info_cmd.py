"""``headcut info``: a model's attention blocks and size."""

from __future__ import annotations

from ..files.plan import plan_outputs
from .app import app
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out
from .params import AllowPickle, JsonOut, ModelArg, Quiet, Task, TrustRemote


@app.command(
    cls=TidyCommand,
    epilog=examples(
        "headcut info model/", "headcut info slim/ --json - | jq .total_heads", "headcut info model/ > blocks.txt"
    ),
)
@handle_errors
def info(
    model: ModelArg,
    json_out: JsonOut = None,
    task: Task = None,
    quiet: Quiet = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Show a model's attention blocks: name, kind, layer, heads, KV heads, head size; and its size."""
    from .. import api
    from .render import info_table

    plan_outputs(reads={"MODEL": model}, files={"--json": json_out})
    out = Out(json_out, quiet)
    result = api.info(model, task=task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    for item in info_table(model, result):
        out.show(item)
    out.json(result.to_json())
