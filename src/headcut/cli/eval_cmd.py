"""``headcut eval``: a model's task metrics on a data file."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from .. import io
from ..evaluation import EvalResult, evaluate
from . import app
from .common import (
    AllowPickle,
    JsonOut,
    ModelArg,
    Task,
    TrustRemote,
    batch_progress,
    console,
    handle_errors,
    plan_outputs,
    write_json,
)
from .data_opts import (
    BatchSize,
    D,
    DataRequired,
    DataSeed,
    LabelCol,
    MaxExamples,
    SeqLen,
    SourceCol,
    Split,
    TargetCol,
    TextCol,
    TextPairCol,
    data_config,
    read_calibration,
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
    "Padding is never scored. The table goes to stderr; --json PATH|- writes the same numbers.",
])


def _fmt(name: str, value: float) -> str:
    if name == "tokens":
        return f"{value:,.0f}"
    if name in ("accuracy", "macro_f1"):
        return f"{value:.4f}"
    return f"{value:,.4f}"


def metrics_table(title: str, result: EvalResult) -> Table:
    """The metrics of one evaluation, primary metric first."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("metric")
    table.add_column("value", justify="right")
    arrow = "higher is better" if result.higher_is_better else "lower is better"
    table.add_row(f"{result.primary} ({arrow})", _fmt(result.primary, result.value))
    for name, value in result.metrics.items():
        if name != result.primary:
            table.add_row(name, _fmt(name, value))
    table.add_row("examples", f"{result.examples:,}")
    table.add_row("examples/s", f"{result.examples_per_s:,.1f}")
    table.add_row("seconds", f"{result.seconds:,.2f}")
    return table


@app.command(name="eval", help=EVAL_HELP)
@handle_errors
def eval_(
    model: ModelArg,
    data: DataRequired,
    split: Split = D.split,
    text_col: TextCol = None,
    text_pair_col: TextPairCol = None,
    label_col: LabelCol = None,
    source_col: SourceCol = None,
    target_col: TargetCol = None,
    max_examples: MaxExamples = None,
    seq_len: SeqLen = D.seq_len,
    batch_size: BatchSize = D.batch_size,
    seed: DataSeed = D.seed,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Evaluate MODEL on --data (see EVAL_HELP)."""
    config = data_config(
        data, split=split, text_col=text_col, text_pair_col=text_pair_col, label_col=label_col,
        source_col=source_col, target_col=target_col, max_examples=max_examples, seq_len=seq_len,
        batch_size=batch_size, seed=seed,
    )
    plan_outputs(reads={"MODEL": model, "--data": data}, files={"--json": json_out})
    loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    calibration = read_calibration(model, loaded, config, trust_remote_code)
    progress, on_progress = batch_progress(f"evaluating ({calibration.task})", len(calibration.batches))
    with progress:
        result = evaluate(loaded, calibration, progress=on_progress)
    cols = ", ".join(f"{role}: {name}" for role, name in calibration.columns.items())
    console.print(f"{model} on {calibration.source}", highlight=False, markup=False, soft_wrap=True)
    console.print(metrics_table(f"{calibration.task} ({cols})", result))
    for note in calibration.notes + result.notes:
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    data_json: dict[str, Any] = {"model": model, **result.to_json(), "data": calibration.to_json()}
    write_json(data_json, json_out)
