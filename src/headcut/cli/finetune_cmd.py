"""``headcut finetune``: recovery training of a (possibly slimmed) model, optionally distilled from a
teacher; saves it the same way (``headcut-finetune.json`` inside it, written in the same atomic save)."""

from __future__ import annotations

import contextlib
import json
import platform
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import transformers
import typer

from .. import __version__, io
from ..distributed import from_env
from ..errors import HeadcutError
from ..evaluation import PRIMARY
from ..data import DataConfig
from ..finetune import FinetuneConfig, FinetuneResult, finetune
from ..outputs import OutputDir, real_path
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
from .data_opts import (
    BatchSize,
    D,
    DataRequired,
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
from .prune_cmd import same_data
from .train_opts import (
    CheckpointEvery,
    Device,
    Epochs,
    EvalEvery,
    GradAccum,
    MaxSteps,
    Resume,
    WarmupSteps,
    check_resume,
    checkpoint_dir_for,
    clear_stale,
    move_to,
    resumable,
    training_progress,
)

REPORT_NAME = "headcut-finetune.json"
REPORT_FORMAT = 1

FINETUNE_HELP = "\n\n".join([
    ("Fine-tune MODEL (original or slimmed) on --data to recover accuracy; its heads are kept, and it is saved "
    "the same way (it still loads with headcut.load and with transformers' trust_remote_code)."),
    ("Loss: the task loss; with --distill-from TEACHER, alpha * T^2 * KL(teacher/T || model/T) + (1 - alpha) * "
    "task loss over the labelled positions (the teacher needs the same vocabulary or labels)."),
    ("Checkpoints go to OUT.headcut-checkpoint/ (every --checkpoint-every steps and at the end); if a run is "
    "interrupted, run the same command with --resume to continue it exactly. The folder is removed after a "
    "successful save."),
])


def build_report(*, model: str, teacher: str | None, out: Path, arguments: dict[str, Any], result: FinetuneResult,
                 data: dict[str, Any], eval_data: dict[str, Any] | None, seconds: float,
                 notes: list[str]) -> dict[str, Any]:
    """The report of one ``headcut finetune`` run (``headcut-finetune.json`` and ``--json``)."""
    res = result.to_json()
    return {
        "report_format": REPORT_FORMAT,
        "command": "finetune",
        "model": model,
        "teacher": teacher,
        "out": str(out),
        "arguments": arguments,
        "seed": result.config.seed,
        "versions": {
            "headcut": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "task": result.task,
        "steps": result.steps,
        "resumed_from": result.resumed_from,
        "metric": res["metric"],
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "history_summary": result.summary(),
        "history": result.history,
        "distributed": result.distributed,
        "config": result.config.to_json(),
        "data": data,
        "eval_data": eval_data,
        "train_seconds": result.seconds,
        "seconds": seconds,
        "notes": notes,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@app.command(name="finetune", help=FINETUNE_HELP)
@handle_errors
def finetune_cmd(
    model: ModelArg,
    data: DataRequired,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output folder (written atomically).", show_default=False)
    ] = None,
    eval_data: Annotated[
        str | None, typer.Option("--eval-data", help="Evaluation data, in the formats of --data (and must differ "
                                    "from it): the metric before/after, and every --eval-every steps.",
                                    metavar="FILE|NAME[:CONFIG]")
    ] = None,
    eval_split: Annotated[str, typer.Option("--eval-split", help="Split of an --eval-data datasets name.")] = "validation",
    epochs: Epochs = None,
    max_steps: MaxSteps = None,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (AdamW, linear decay).")] = 5e-5,
    grad_accum: GradAccum = 1,
    warmup_steps: WarmupSteps = 0,
    eval_every: EvalEvery = None,
    checkpoint_every: CheckpointEvery = 100,
    distill_from: Annotated[
        str | None, typer.Option("--distill-from", help="Teacher checkpoint (same vocabulary or labels): "
                                    "distil its outputs.", metavar="TEACHER")
    ] = None,
    alpha: Annotated[
        float, typer.Option("--alpha", help="Weight of the distillation term in [0, 1] (the usual default 0.5).",
                            metavar="A")
    ] = 0.5,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Distillation temperature (the usual default 2.0).", metavar="T")
    ] = 2.0,
    resume: Resume = False,
    device: Device = None,
    force: Annotated[
        bool, typer.Option("--force", help=FORCE_HELP + " Also starts over from a stale checkpoint folder.")
    ] = False,
    split: Split = D.split,
    text_col: TextCol = None,
    text_pair_col: TextPairCol = None,
    label_col: LabelCol = None,
    source_col: SourceCol = None,
    target_col: TargetCol = None,
    max_examples: MaxExamples = None,
    seq_len: SeqLen = D.seq_len,
    batch_size: BatchSize = D.batch_size,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed: data shuffling and masking, batch order and dropout.")
    ] = D.seed,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Fine-tune MODEL (see FINETUNE_HELP)."""
    start = time.perf_counter()
    arguments = {k: (str(v) if isinstance(v, Path) else v) for k, v in locals().items() if k != "start"}
    # ---- every refusal before any work
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the fine-tuned model in")
    if epochs is not None and max_steps is not None:
        raise HeadcutError("give --epochs or --max-steps, not both")
    if distill_from is None and (alpha != 0.5 or temperature != 2.0):
        raise HeadcutError("--alpha and --temperature need --distill-from TEACHER")
    config = FinetuneConfig(
        epochs=epochs, max_steps=max_steps, lr=lr, warmup_steps=warmup_steps, grad_accum=grad_accum,
        eval_every=eval_every, checkpoint_every=checkpoint_every, seed=seed, alpha=alpha, temperature=temperature,
    )
    config.validate()
    if eval_every is not None and eval_data is None:
        raise HeadcutError("--eval-every needs --eval-data")
    opts: dict[str, Any] = dict(
        text_col=text_col, text_pair_col=text_pair_col, label_col=label_col, source_col=source_col,
        target_col=target_col, max_examples=max_examples, seq_len=seq_len, batch_size=batch_size, seed=seed,
    )
    data_cfg = data_config(data, split=split, **opts)
    eval_cfg = data_config(eval_data, split=eval_split, **opts) if eval_data is not None else None
    if eval_cfg is not None:
        why = same_data(data_cfg, eval_cfg)
        if why:
            raise HeadcutError(f"--data and --eval-data are the same data ({why}): hold out part of the data for "
                               "--eval-data")
    dist = from_env()
    torch_device = dist.device(device or "auto")
    ckpt = checkpoint_dir_for(out)
    target, _ = plan_outputs(
        reads={"MODEL": model, "--data": data, "--eval-data": eval_data, "--distill-from": distill_from},
        files={"--json": json_out}, out=out, force=force, checkpoint=ckpt,
    )
    assert target is not None
    check_resume(out, resume, force)
    if distill_from is not None:
        io.check_checkpoint(distill_from, allow_pickle)
    with target if dist.main else contextlib.nullcontext():
        _finetune_work(
            model=model, config=config, data_cfg=data_cfg, eval_cfg=eval_cfg, out=out, target=target, ckpt=ckpt,
            resume=resume, dist=dist, torch_device=torch_device, distill_from=distill_from, task=task,
            allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, json_out=json_out, arguments=arguments,
            start=start,
        )


def _finetune_work(*, model: str, config: FinetuneConfig, data_cfg: DataConfig, eval_cfg: DataConfig | None,
                   out: Path, target: OutputDir, ckpt: Path, resume: bool, dist: Any, torch_device: Any,
                   distill_from: str | None, task: str | None, allow_pickle: bool, trust_remote_code: bool,
                   json_out: str | None, arguments: dict[str, Any], start: float) -> None:
    """The work of ``headcut finetune`` once every refusal has been made (the output is locked)."""
    notes: list[str] = []
    loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, notes=notes)
    teacher = None
    if distill_from is not None:
        teacher = io.load(distill_from, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    train = read_calibration(model, loaded, data_cfg, trust_remote_code)
    eval_cal = read_calibration(model, loaded, eval_cfg, trust_remote_code) if eval_cfg is not None else None
    for cal, what in ((train, "data"), (eval_cal, "eval data")):
        if cal is not None:
            notes += [f"{what}: {n}" for n in cal.notes]
    clear_stale(ckpt, resume, dist)

    # ---- the work
    move_to(loaded, torch_device)
    if teacher is not None:
        move_to(teacher, torch_device)
    shard = len(train.batches) // dist.world
    total = config.train_config().total_steps(max(shard, 1))
    metric = PRIMARY[eval_cal.task][0] if eval_cal is not None else None
    progress, on_done, show = training_progress("fine-tuning", total, metric, dist)
    identity = {"model": _where(model), "teacher": _where(distill_from)}
    with progress, resumable(out, ckpt, config.checkpoint_every, show) as on_step:
        result = finetune(loaded, train, config, teacher=teacher, eval_calibration=eval_cal, checkpoint_dir=ckpt,
                          resume=resume, progress=on_done, on_step=on_step, dist=dist, identity=identity)
    loaded.to("cpu")
    if not dist.main:
        return
    source = local_input(model)
    report: dict[str, Any] = {}

    def write_report(folder: Path) -> None:
        report.update(build_report(
            model=model, teacher=distill_from, out=out, arguments=arguments, result=result, data=train.to_json(),
            eval_data=eval_cal.to_json() if eval_cal is not None else None, seconds=time.perf_counter() - start,
            notes=notes,
        ))
        (folder / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")

    saved = io.save(loaded, target, source=source, extra=write_report, trust_remote_code=trust_remote_code)
    notes += saved.notes
    shutil.rmtree(ckpt, ignore_errors=True)
    summary = result.summary()
    first, last = summary.get("first", {}), summary.get("last", {})
    resumed = f" (resumed at step {result.resumed_from})" if result.resumed_from is not None else ""
    console.print(
        f"{model}: {result.steps} steps{resumed}, loss {_fmt(first.get('loss'))} -> {_fmt(last.get('loss'))}"
        + (f", KL {_fmt(first.get('kl'))} -> {_fmt(last.get('kl'))}" if "kl" in last else ""),
        highlight=False, markup=False, soft_wrap=True,
    )
    if result.metric is not None:
        arrow = "higher is better" if result.higher_is_better else "lower is better"
        console.print(f"{result.metric} ({arrow}): {_fmt(result.metric_before)} -> {_fmt(result.metric_after)}",
                      highlight=False, markup=False, soft_wrap=True)
    console.print(f"saved to {out} (with {REPORT_NAME})", highlight=False, markup=False, soft_wrap=True)
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    write_json(report, json_out)


def _where(name: str | None) -> str | None:
    """A model's identity for resume checks: its real path when local, else its name."""
    if name is None:
        return None
    local = local_input(name)
    return str(real_path(local)) if local is not None else name
