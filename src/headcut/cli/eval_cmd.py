"""``headcut eval``: the task metric of a model on a data file, perplexity at the pruning papers' windows, and
lm-evaluation-harness tasks."""

from __future__ import annotations

from ..config import EvalOptions
from ..config.run import DataSources, ModelSource, RunSettings
from ..data.config import DataConfig
from ..files.plan import plan_outputs
from .app import app
from .declared import data_spec, with_settings, with_specs
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting
from .params import ModelArg

EVAL_HELP = "\n\n".join(
    [
        "Evaluate MODEL on a data file (the metrics of its task head), on non-overlapping perplexity windows "
        "(--windows), and on lm-evaluation-harness tasks (--lm-eval); --data is needed unless --lm-eval is given.",
        "\n".join(
            [
                "Metrics:",
                "sequence classification: accuracy, macro-F1 (classes in the labels or predictions), mean cross-entropy.",
                "causal LM: perplexity = exp(mean negative log-likelihood of every next token, token-weighted), loss; a .txt "
                "file is cut into --seq-len blocks (the tokenizer's special tokens in each), a table gives one example per "
                "row.",
                "seq2seq LM: loss and perplexity of the target tokens; BLEU of greedy generations if sacrebleu is installed.",
                "masked LM: perplexity over the masked tokens (BERT masking with --seed).",
            ]
        ),
        "--windows 128,2048: the pruning papers' perplexity of a causal LM: the whole --data text (a table's or "
        "datasets split's rows joined by blank lines, as wikitext-2 is read) tokenized once and cut into "
        "non-overlapping windows of each length, one row per length. --lm-eval TASKS runs the harness on the "
        "model as headcut loads it (extra \\[lm-eval]).",
        "Padding is never scored. The tables go to stdout (stderr with --json -); --json PATH|- writes the same "
        "numbers.",
    ]
)


@app.command(
    cls=TidyCommand,
    name="eval",
    help=EVAL_HELP,
    epilog=examples(
        "headcut eval slim/ --data dev.csv",
        "headcut eval model/ --data dev.csv --max-examples 1000 --json -",
        "headcut eval lm/ --data hamlet.txt --seq-len 512",
        "headcut eval lm/ --data wikitext:wikitext-2-raw-v1 --split test --windows 128,2048",
        "headcut eval lm/ --lm-eval default --lm-eval-batch-size 16 --device cuda --json results.json",
        "headcut eval lm/ --lm-eval my_task --lm-eval-include tasks/",
    ),
)
@handle_errors
@with_specs(DataConfig, "data_options")
@with_specs(EvalOptions, "options")
@with_settings(DataSources, "sources", skip=("eval_data", "eval_split", "recover_data"))
@with_settings(RunSettings, "run", skip=("device", "resume"))
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def eval_(
    model: ModelArg,
    sources: DataSources = DataSources(),
    run: RunSettings = RunSettings(),
    reporting: Reporting = Reporting(),
    source: ModelSource = ModelSource(),
    options: dict | None = None,
    data_options: dict | None = None,
) -> None:
    """Evaluate MODEL (see EVAL_HELP)."""
    data, seed, json_out = sources.data, run.seed, reporting.json_out
    out = Out(json_out, reporting.quiet)  # first: the log's 30 s clock starts with the command
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api
    from .render.evaluation import (
        harness_table,
        metrics_table,
        windows_table,
    )

    spec = data_spec(data, data_options or {}, seed) if data is not None else None
    plan_outputs(reads={"MODEL": model, "--data": data}, files={"--json": json_out})
    try:
        ev = api.evaluate(
            model,
            spec,
            task=source.task,
            seed=seed,
            progress=out.progress,
            allow_pickle=source.allow_pickle,
            trust_remote_code=source.trust_remote_code,
            **(options or {}),
        )
    finally:
        out.close()
    if ev.data is not None:
        cols = ", ".join(f"{role}: {name}" for role, name in ev.data["columns"].items())
        if ev.windows:
            out.show(
                f"{model} on {ev.data['source']}: {ev.data['text_tokens']:,} tokens, cut into non-overlapping windows"
            )
            out.show(windows_table(f"causal-lm perplexity ({cols})", ev.windows))
        else:
            out.show(f"{model} on {ev.data['source']}{_layout(ev.data)}")
            out.show(metrics_table(f"{ev.result.task} ({cols})", ev.result))
    if ev.lm_eval is not None:
        out.show(f"{model}: lm-evaluation-harness {ev.lm_eval.version}")
        out.show(harness_table(ev.lm_eval))
    out.notes(ev.notes)
    out.json(ev.report)


def _layout(data: dict) -> str:
    """How a causal LM's examples were cut, for the table's title."""
    if data.get("task") != "causal-lm":
        return ""
    if data.get("layout") == "blocks":
        return f": blocks of {data['seq_len']} tokens"
    return f": one example per row, at most {data['seq_len']} tokens"
