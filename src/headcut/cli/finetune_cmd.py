"""``headcut finetune``: recovery training of a (possibly slimmed) model, optionally distilled from a
teacher; saved the same way (``headcut-finetune.json`` inside it, written in the same atomic save)."""

from __future__ import annotations

from pathlib import Path

from ..config import FinetuneConfig, FinetuneInputs
from ..config.run import DataSources, ModelSource, OutputSettings, RunSettings
from ..data.config import DataConfig
from ..errors import HeadcutError
from ..files.plan import plan_outputs
from ..outputs.reports import FINETUNE_REPORT
from .app import app
from .declared import data_options_for_api, data_spec, data_values, report_arguments, with_settings, with_specs
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting
from .params import ModelArg

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
@with_specs(DataConfig, "data_options")
@with_specs(FinetuneConfig, "settings")
@with_specs(FinetuneInputs, "inputs")
@with_settings(DataSources, "sources", skip=("recover_data",), required=("data",))
@with_settings(OutputSettings, "output")
@with_settings(RunSettings, "run")
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def finetune_cmd(
    model: ModelArg,
    sources: DataSources = DataSources(),
    output: OutputSettings = OutputSettings(),
    inputs: dict | None = None,
    run: RunSettings = RunSettings(),
    reporting: Reporting = Reporting(),
    source: ModelSource = ModelSource(),
    settings: dict | None = None,
    data_options: dict | None = None,
) -> None:
    """Fine-tune MODEL (see FINETUNE_HELP)."""
    log = Out(reporting.json_out, reporting.quiet)  # first: the log's 30 s clock starts with the command
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api

    settings, data_options = settings or {}, data_options or {}
    given = FinetuneInputs(**(inputs or {}))
    teacher, labels = given.teacher, given.labels
    data, eval_data, eval_split = str(sources.data), sources.eval_data, sources.eval_split
    out = Path(output.out) if output.out is not None else None
    force, seed, json_out = output.force, run.seed, reporting.json_out
    values = {  # the report's arguments, in the order it has always listed them
        "model": model,
        "data": data,
        "out": out,
        "eval_data": eval_data,
        "eval_split": eval_split,
        "teacher": teacher,
        "labels": labels,
        "force": force,
        "seed": seed,
        "resume": run.resume,
        "device": run.device,
        "formats": output.formats,
        "gguf_type": output.gguf_type,
        "json_out": json_out,
        "task": source.task,
        "quiet": reporting.quiet,
        "allow_pickle": source.allow_pickle,
        "trust_remote_code": source.trust_remote_code,
        **data_values(data_options),
    }
    arguments = report_arguments({**values, **settings})
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the fine-tuned model in")
    data_cfg = data_spec(data, data_options, seed)
    eval_cfg = data_spec(eval_data, data_options, seed, split=eval_split) if eval_data is not None else None
    try:
        reads = {"MODEL": model, "--data": data, "--eval-data": eval_data, "--distill-from": teacher}  # every input
        plan_outputs(reads=reads, files={"--json": json_out}, out=out, force=force)  # --json vs --out
        tuned = api.finetune(
            model,
            data_cfg,
            eval_data=eval_cfg,
            teacher=teacher,
            seed=seed,
            task=source.task,
            labels=labels.split(",") if labels is not None else None,
            split=data_cfg.split,
            eval_split=eval_split,
            data_options=data_options_for_api(data_options),
            device=run.device,
            resume=run.resume,
            restart=force,
            progress=log.progress,
            allow_pickle=source.allow_pickle,
            trust_remote_code=source.trust_remote_code,
            formats=output.formats,
            gguf_type=output.gguf_type,
            out=out,
            force=force,
            arguments=arguments,
            **settings,
        )
    finally:
        log.close()
    if not tuned.report.get("out"):
        return  # a data-parallel run's other processes save nothing
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .render.finetune import finetune_summary

    for line in finetune_summary(tuned.report, tuned.result, FINETUNE_REPORT):
        log.show(line)
    log.notes(tuned.report["notes"])
    log.json(tuned.report)
