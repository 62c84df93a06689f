"""``headcut eval``: the task metric of a model on a data file."""

from __future__ import annotations

from typing import Annotated

import typer

from . import app
from .common import (
    DATA_HELP,
    AllowPickle,
    DataOptions,
    JsonOut,
    ModelArg,
    Out,
    Quiet,
    Task,
    TidyCommand,
    TrustRemote,
    data_spec,
    examples,
    handle_errors,
    plan_outputs,
    with_data_options,
)

EVAL_HELP = "\n\n".join([
    "Evaluate MODEL on a data file: the metrics of its task head.",
    "\n".join([
        "Metrics:",
        "sequence classification: accuracy, macro-F1 (classes in the labels or predictions), mean cross-entropy.",
        "causal LM: perplexity = exp(mean negative log-likelihood of every next token, token-weighted), loss.",
        "seq2seq LM: loss and perplexity of the target tokens; BLEU of greedy generations if sacrebleu is installed.",
        "masked LM: perplexity over the masked tokens (BERT masking with --seed).",
    ]),
    "Padding is never scored. The table goes to stdout (stderr with --json -); --json PATH|- writes the same "
    "numbers.",
])


@app.command(cls=TidyCommand, name="eval", help=EVAL_HELP, epilog=examples(
    "headcut eval slim/ --data dev.csv", "headcut eval model/ --data dev.csv --max-examples 1000 --json -",
    "headcut eval lm/ --data hamlet.txt --seq-len 512"))
@handle_errors
@with_data_options
def eval_(
    model: ModelArg,
    data: Annotated[str, typer.Option("--data", help=DATA_HELP, metavar="FILE|NAME[:CONFIG]", show_default=False)],
    seed: Annotated[int, typer.Option("--seed", metavar="N",
                                      help="Seed for shuffling the examples and choosing masked tokens.")] = 0,
    json_out: JsonOut = None,
    task: Task = None,
    quiet: Quiet = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
    data_options: DataOptions = DataOptions(),
) -> None:
    """Evaluate MODEL on --data (see EVAL_HELP)."""
    out = Out(json_out, quiet)  # first: the log's 30 s clock starts with the command
    from .. import api
    from .render import metrics_table

    spec = data_spec(data, data_options.split, data_options, seed)
    plan_outputs(reads={"MODEL": model, "--data": data}, files={"--json": json_out})
    try:
        ev = api.evaluate(model, spec, task=task, seed=seed, progress=out.progress, allow_pickle=allow_pickle,
                          trust_remote_code=trust_remote_code)
    finally:
        out.close()
    cols = ", ".join(f"{role}: {name}" for role, name in ev.data["columns"].items())
    out.show(f"{model} on {ev.data['source']}")
    out.show(metrics_table(f"{ev.result.task} ({cols})", ev.result))
    out.notes(ev.notes)
    out.json(ev.report)
