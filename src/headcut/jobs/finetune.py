"""``headcut.finetune``: recovery training, optionally distilled from a teacher (``headcut finetune``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from ..arguments.kinds import values
from ..arguments.table import checked
from ..config import FinetuneConfig
from ..errors import HeadcutError, label
from ..files.names import real_path
from ..files.plan import plan_outputs
from ..model.checks import check_checkpoint
from ..model.evaluation import PRIMARY
from ..outputs.formats import check_formats, parse_formats
from ..outputs.reports import FINETUNE_REPORT, finetune_report
from ..progress import Reporter, quiet
from ..training import finetuning  # finetuning.finetune looked up when called (tests stand in for it)
from ..training.checkpoint import checkpoint_dir_for, clear_checkpoint_dir, locked_output, prepare_checkpoint_dir
from ..training.parallel import engine_note, resolve_engine
from .agreement import Agreement, checkpoint_found, data_settings, run_fingerprint
from .bars import Bars
from .base import ModelLike, calibration, data_specs, load_model, move, pick_device, plain_arguments
from .results import Written
from .saving import local_reads, spec_path


@dataclass(kw_only=True)
class Finetuned(Written):
    """What :func:`finetune` produced: ``model`` (trained in place, heads kept), ``result``
    (:class:`headcut.training.finetuning.FinetuneResult`: history, metric before/after) and ``report`` (what
    ``headcut-finetune.json`` and ``--json`` hold); ``save(out)`` writes the model with its report."""

    REPORT: ClassVar[str] = FINETUNE_REPORT

    result: Any


@checked("finetune")
def finetune(
    model: ModelLike,
    data: Any,
    *,
    eval_data: Any = None,
    teacher: ModelLike | None = None,
    epochs: int | None = None,
    max_steps: int | None = None,
    lr: float = 5e-5,
    grad_accum: int = 1,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    eval_every: int | None = None,
    checkpoint_every: int | None = 100,
    alpha: float = 0.5,
    temperature: float = 2.0,
    hidden_weight: float = 0.0,
    mixup: float = 0.0,
    patience: int | None = None,
    engine: str = "auto",
    seed: int = 0,
    tokenizer: Any = None,
    task: str | None = None,
    labels: Sequence[str] | None = None,
    split: str = "train",
    eval_split: str = "validation",
    data_options: Mapping[str, Any] | None = None,
    device: str | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    restart: bool = False,
    progress: Reporter | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    formats: str | Sequence[str] | None = None,
    gguf_type: str = "f16",
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
    arguments: dict[str, Any] | None = None,
) -> Finetuned:
    """Recovery training of ``model`` on ``data`` (``headcut finetune``): its heads are kept; with a
    ``teacher`` the loss is ``alpha * T^2 * KL(teacher/T || model/T) + (1 - alpha) * task loss`` over the
    labelled positions. Neither ``epochs`` nor ``max_steps``: 3 epochs. ``labels``: the classes of a new
    classification head (with ``task="sequence-classification"`` on a checkpoint without one: train a
    classifier from a base encoder). ``patience`` N: early stopping, after N evaluations (every ``eval_every``
    steps on ``eval_data``) without a better metric, keeping the best weights (such a run keeps no resume
    checkpoints). ``engine``: several processes' engine (``ddp``, ``fsdp``; ``auto``: see
    :mod:`headcut.training.parallel`). ``checkpoint_dir``/``resume``/``restart``: the resume checkpoint (see :func:`prune`).
    ``formats``/``gguf_type``: what ``save`` writes (see :mod:`headcut.outputs.formats`). ``out``/``force``: save the
    result there, the paths checked and locked before any work (see :func:`prune`; ``headcut finetune --out``)."""

    agreement = Agreement()  # several processes: they agree before training, or all stop with one line
    with agreement.guard():
        start = time.perf_counter()
        arguments = (
            arguments
            if arguments is not None
            else plain_arguments(
                dict(
                    model=model,
                    data=data,
                    eval_data=eval_data,
                    teacher=teacher,
                    epochs=epochs,
                    max_steps=max_steps,
                    lr=lr,
                    grad_accum=grad_accum,
                    warmup_steps=warmup_steps,
                    weight_decay=weight_decay,
                    eval_every=eval_every,
                    checkpoint_every=checkpoint_every,
                    alpha=alpha,
                    temperature=temperature,
                    hidden_weight=hidden_weight,
                    mixup=mixup,
                    patience=patience,
                    engine=engine,
                    seed=seed,
                    task=task,
                    labels=",".join(labels) if labels else None,
                    split=split,
                    eval_split=eval_split,
                    data_options=data_options,
                    device=device,
                )
            )
        )
        progress = progress or quiet()
        with values():  # every value refused before any work, as a HeadcutValueError
            if teacher is None and (alpha != 0.5 or temperature != 2.0 or hidden_weight or mixup):
                raise HeadcutError(
                    f"{label('alpha')}, {label('temperature')}, {label('hidden_weight')} and {label('mixup')} need "
                    f"{label('teacher')}"
                )
            if eval_every is not None and eval_data is None:
                raise HeadcutError(f"{label('eval_every')} needs {label('eval_data')}")
            config = FinetuneConfig(
                epochs=epochs,
                max_steps=max_steps,
                lr=lr,
                grad_accum=grad_accum,
                warmup_steps=warmup_steps,
                weight_decay=weight_decay,
                eval_every=eval_every,
                checkpoint_every=checkpoint_every,
                seed=seed,
                alpha=alpha,
                temperature=temperature,
                hidden_weight=hidden_weight,
                mixup=mixup,
                patience=patience,
                engine=engine,
            )
            config.validate()
            if patience is not None and eval_data is None:
                raise HeadcutError(
                    f"{label('patience')} needs {label('eval_data')} (the metric it watches) and {label('eval_every')}"
                )
            if patience is not None:
                if resume:
                    raise HeadcutError(
                        f"{label('resume')} does not apply with {label('patience')}: an early-stopped run keeps no checkpoints"
                    )
                checkpoint_dir = None  # the best weights live in memory; nothing to resume from
            data_spec, eval_spec = data_specs(data, eval_data, split, eval_split, data_options, seed)
        if isinstance(teacher, (str, os.PathLike)):
            check_checkpoint(teacher, allow_pickle)
        with values():
            target = None
            own_checkpoint = out is not None and checkpoint_dir is None and patience is None
            if own_checkpoint and out is not None:
                checkpoint_dir = checkpoint_dir_for(out)
            if out is not None:
                target, _ = plan_outputs(
                    reads={
                        label("model"): model if isinstance(model, (str, os.PathLike)) else None,
                        label("data"): spec_path(data),
                        label("eval_data"): spec_path(eval_data),
                        label("teacher"): teacher if isinstance(teacher, (str, os.PathLike)) else None,
                    },
                    out=Path(out),
                    force=force,
                    checkpoint=checkpoint_dir_for(out),
                )
                restart = restart or force
            if checkpoint_dir is not None:
                prepare_checkpoint_dir(checkpoint_dir, resume, restart)
            elif resume:
                raise HeadcutError("resume needs a checkpoint folder")
            dist, torch_device = pick_device(device)
            notes: list[str] = []

            notes += engine_note(engine, dist)
            if labels is not None and isinstance(model, nn.Module):
                raise HeadcutError(
                    "labels= applies to a model loaded from a checkpoint (set the head's labels yourself)"
                )
            extra = {"labels": list(labels)} if labels is not None else {}
            chosen = parse_formats(formats)
        lock = (
            locked_output(target, dist.main, target.path, checkpoint_dir)
            if target is not None
            else contextlib.nullcontext()
        )
        with lock:
            loaded = load_model(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed, **extra)
            check_formats(loaded.module, chosen, gguf_type)
            teacher_model = None
            teacher_name = None
            if teacher is not None:
                t = load_model(teacher, task, allow_pickle, trust_remote_code, [], progress)
                teacher_model, teacher_name = t.module, t.name
            cal = calibration(
                data_spec, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data"
            )
            eval_cal = calibration(
                eval_spec, loaded, tokenizer, eval_split, data_options, seed, trust_remote_code, progress, "eval data"
            )
            assert cal is not None
            for c, what in ((cal, "data"), (eval_cal, "eval data")):
                if c is not None:
                    notes += [f"{what}: {n}" for n in c.notes]
            if checkpoint_dir is not None and dist.main and not resume:
                clear_checkpoint_dir(checkpoint_dir)

            # every process's data, model and settings, before the first collective: the same everywhere, or every
            # process stops with one line naming the difference (or the error of a process whose setup failed)
            agreement.agree(
                dist,
                lambda: run_fingerprint(
                    {
                        **asdict(config),
                        "engine": resolve_engine(config.engine, dist),
                        "task": task,
                        "labels": labels,
                        "resume": resume,
                        "eval_split": eval_split if eval_spec is not None else None,
                        **data_settings(data_spec, split, data_options, seed),
                    },
                    {"model": loaded.module, "teacher": teacher_model},
                    {"data": cal, "eval_data": eval_cal},
                    found=checkpoint_found(checkpoint_dir) if resume else None,
                ),
            )

            # FSDP: the model stays whole in CPU memory; only its shards go to the device
            sharded = resolve_engine(config.engine, dist) == "fsdp"
            if not sharded:
                move(loaded.module, torch_device)
            if teacher_model is not None:
                move(teacher_model, torch_device)

            metric = PRIMARY[eval_cal.task][0] if eval_cal is not None else None
            bars = Bars(progress, "finetune", metric, train="fine-tuning")
            identity = {
                "model": str(real_path(loaded.folder)) if loaded.folder is not None else loaded.name,
                "teacher": teacher_name
                if teacher_name is None or not Path(teacher_name).exists()
                else str(real_path(teacher_name)),
            }
            try:
                result = finetuning.finetune(
                    loaded.module,
                    cal,
                    config,
                    teacher=teacher_model,
                    eval_calibration=eval_cal,
                    checkpoint_dir=checkpoint_dir,
                    resume=resume,
                    progress=lambda d, t: bars("train", d, t),
                    on_step=bars.on_step,
                    dist=dist,
                    eval_progress=lambda d, t: bars("eval", d, t),
                    identity=identity,
                    device=torch_device,
                )
            finally:
                bars.close()
            loaded.module.to("cpu")
            report = finetune_report(
                model=loaded.name,
                teacher=teacher_name,
                arguments=arguments,
                result=result,
                data=cal.to_json(),
                eval_data=eval_cal.to_json() if eval_cal is not None else None,
                seconds=time.perf_counter() - start,
                notes=notes,
            )
            reads = local_reads(
                **{
                    "MODEL": loaded.folder,
                    "--data": data_spec,
                    "--eval-data": eval_spec,
                    "--distill-from": teacher if isinstance(teacher, (str, os.PathLike)) else None,
                }
            )
            tuned = Finetuned(
                model=loaded.module,
                result=result,
                report=report,
                source=loaded.folder,
                notes=notes,
                reads=reads,
                trust_remote_code=trust_remote_code,
                formats=chosen,
                gguf_type=gguf_type,
            )
            if target is not None and dist.main:
                tuned.save(target)
                if own_checkpoint and checkpoint_dir is not None:
                    import shutil

                    shutil.rmtree(checkpoint_dir, ignore_errors=True)
        return tuned
