"""``headcut finetune``: recovery training of a (possibly slimmed) model, optionally distilled from a
teacher; saved the same way (``headcut-finetune.json`` inside it, written in the same atomic save)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..config import FinetuneConfig, FinetuneInputs
from ..errors import HeadcutError
from ..files.plan import plan_outputs
from ..outputs.reports import FINETUNE_REPORT
from .app import app
from .declared import DataOptions, data_spec, with_data_options, with_specs
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out
from .params import (
    DATA_HELP,
    FORCE_HELP,
    AllowPickle,
    Device,
    GgufType,
    JsonOut,
    ModelArg,
    Out_,
    OutputFormat,
    Quiet,
    Resume,
    Task,
    TrustRemote,
)
from .prune_cmd import _after, _arguments

FINETUNE_HELP = "\n\n".join(
    [
        "Fine-tune MODEL (original or slimmed) on --data to recover accuracy; its heads are kept, and it is saved "
        "the same way (it still loads with headcut.load and with transformers' trust_remote_code).",
        "Loss: the task loss; with --distill-from TEACHER, alpha * T^2 * KL(teacher/T || model/T) + (1 - alpha) * "
        "task loss over the labelled positions (the teacher needs the same vocabulary or labels).",
        "Checkpoints go to OUT.headcut-checkpoint/ (every --checkpoint-every steps and at the end); if a run is "
        "interrupted, run the same command with --resume to continue it exactly (other settings are refused and "
        "listed). The folder is removed after a successful save.",
    ]
)


@app.command(
    cls=TidyCommand,
    name="finetune",
    help=FINETUNE_HELP,
    epilog=examples(
        "headcut finetune slim/ --data train.csv --eval-data dev.csv --out tuned/ --epochs 3",
        "headcut finetune slim/ --data train.csv --out tuned/ --distill-from model/ --alpha 0.5 --temperature 2",
        "headcut finetune slim/ --data train.csv --out tuned/ --resume   # after an interruption",
        "headcut finetune encoder/ --task sequence-classification --labels neg,pos --data train.csv --out classifier/",
    ),
)
@handle_errors
@with_data_options
@with_specs(FinetuneInputs, "inputs")
@with_specs(FinetuneConfig, "settings")
def finetune_cmd(
    model: ModelArg,
    data: Annotated[str, typer.Option("--data", help=DATA_HELP, metavar="FILE|NAME[:CONFIG]", show_default=False)],
    out: Out_ = None,
    eval_data: Annotated[
        str | None,
        typer.Option(
            "--eval-data",
            metavar="FILE|NAME[:CONFIG]",
            help="Evaluation data, in the formats of --data (and must "
            "differ from it): the metric before/after, and every --eval-every steps.",
        ),
    ] = None,
    eval_split: Annotated[
        str, typer.Option("--eval-split", help="Split of an --eval-data datasets name.", metavar="SPLIT")
    ] = "validation",
    force: Annotated[
        bool, typer.Option("--force", metavar="", help=FORCE_HELP + " Also starts over from a stale checkpoint folder.")
    ] = False,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed: data shuffling and masking, batch order and dropout.")
    ] = 0,
    resume: Resume = False,
    device: Device = None,
    formats: OutputFormat = "safetensors",
    gguf_type: GgufType = "f16",
    json_out: JsonOut = None,
    task: Task = None,
    quiet: Quiet = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
    data_options: DataOptions = DataOptions(),
    settings: dict | None = None,
    inputs: dict | None = None,
) -> None:
    """Fine-tune MODEL (see FINETUNE_HELP)."""
    log = Out(json_out, quiet)  # first: the log's 30 s clock starts with the command, not after torch loads
    from .. import api

    settings = settings or {}
    given = FinetuneInputs(**(inputs or {}))
    teacher, labels = given.teacher, given.labels
    values = {k: v for k, v in locals().items() if k not in ("settings", "api", "inputs", "given", "teacher", "labels")}
    values = _after(values, "eval_split", {"teacher": teacher, "labels": labels})  # where the report lists them
    arguments = _arguments({**values, **settings})
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the fine-tuned model in")
    data_cfg = data_spec(data, data_options.split, data_options, seed)
    eval_cfg = data_spec(eval_data, eval_split, data_options, seed) if eval_data is not None else None
    try:
        plan_outputs(reads={"MODEL": model}, files={"--json": json_out}, out=out, force=force)  # --json vs --out
        tuned = api.finetune(
            model,
            data_cfg,
            eval_data=eval_cfg,
            teacher=teacher,
            seed=seed,
            task=task,
            labels=labels.split(",") if labels is not None else None,
            split=data_options.split,
            eval_split=eval_split,
            data_options=data_options.for_api(),
            device=device,
            resume=resume,
            restart=force,
            progress=log.progress,
            allow_pickle=allow_pickle,
            trust_remote_code=trust_remote_code,
            formats=formats,
            gguf_type=gguf_type,
            out=out,
            force=force,
            arguments=arguments,
            **settings,
        )
    finally:
        log.close()
    if not tuned.report.get("out"):
        return  # a data-parallel run's other processes save nothing
    from .render import finetune_summary

    for line in finetune_summary(tuned.report, tuned.result, FINETUNE_REPORT):
        log.show(line)
    log.notes(tuned.report["notes"])
    log.json(tuned.report)
