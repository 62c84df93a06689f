"""A prune request as typed parts (:class:`PruneRequest`) and its one check (:func:`prune_request`): every
refusal a request can get before a model is loaded. ``prune`` and ``headcut prune`` make this one check; its
messages name keywords, which the command line shows as flags."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...arguments.kinds import values
from ...catalog import METHODS, MethodEntry, method_entry
from ...config import LayerwiseConfig, PruneConfig, RecoveryConfig
from ...data import DataConfig
from ...errors import HeadcutError, label
from ...files.atomic import OutputDir, OutputFile
from ...files.plan import plan_outputs
from ...options import check_fields
from ...outputs.formats import parse_formats
from ...progress import Reporter
from ...pruning import get_method, make_options
from ...recipes import Recipe
from ...training.checkpoint import checkpoint_dir_for, locked_output, prepare_checkpoint_dir
from ..base import check_data_spec, data_config, data_specs, pick_device, same_data
from ..saving import spec_path
from .layerwise_choice import Choice, choose, refusal
from .recipes import check_recipe_run
from .speed_target import check_speed_target


@dataclass
class Source:
    """The model to prune and how to read it (``prune``'s keywords of the same names)."""

    model: Any
    task: str | None = None
    tokenizer: Any = None
    allow_pickle: bool = False
    trust_remote_code: bool = False


@dataclass
class DataRequest:
    """The data a prune request reads: ``data`` (calibration or training), ``eval_data`` (held out), their splits
    and ``data_options`` (:class:`headcut.data.DataConfig`'s fields)."""

    data: Any = None
    eval_data: Any = None
    split: str = "train"
    eval_split: str = "validation"
    data_options: Mapping[str, Any] | None = None


@dataclass
class RunSettings:
    """Where the job runs and what it writes: ``device``, the resume checkpoint (``checkpoint_dir``, ``resume``,
    ``restart``), ``out`` (``force``), the output ``formats``, the ``trajectory`` (True, or a .csv path), the
    layer-wise choice and the progress reporter."""

    device: str | None = None
    checkpoint_dir: str | os.PathLike[str] | None = None
    resume: bool = False
    restart: bool = False
    progress: Reporter | None = None
    formats: str | Sequence[str] | None = None
    gguf_type: str = "f16"
    out: str | os.PathLike[str] | None = None
    force: bool = False
    trajectory: Any = False
    layerwise: LayerwiseConfig = field(default_factory=LayerwiseConfig)


@dataclass
class PruneRequest:
    """A prune request checked before any work (:func:`prune_request`): what was asked (``source``, ``config``,
    ``method_options`` as given, ``data``, ``recovery``, ``run``) and what the check settled (the method's
    ``entry`` and ``options`` object, the data specs, the device, the formats, the checkpoint folder, the
    output target and trajectory file, the layer-wise ``path``, and the ``notes`` so far); ``recipe``: the recipe
    it came from (its schedule gives the rounds), None for a method alone."""

    source: Source
    config: PruneConfig
    method_options: dict[str, Any]
    data: DataRequest
    recovery: RecoveryConfig
    run: RunSettings
    entry: MethodEntry
    options: Any
    notes: list[str]
    data_spec: Any
    eval_spec: Any
    dist: Any
    device: Any
    formats: tuple[str, ...]
    checkpoint_dir: Path | None
    own_checkpoint: bool
    target: OutputDir | None
    trajectory_file: OutputFile | None
    path: Choice
    recipe: Recipe | None = None

    def lock(self) -> Any:

        if self.target is None:
            return contextlib.nullcontext()
        return locked_output(self.target, self.dist.main, self.target.path, self.checkpoint_dir)


def prune_request(
    source: Source,
    config: PruneConfig,
    method_options: dict[str, Any],
    data: DataRequest,
    recovery: RecoveryConfig,
    run: RunSettings,
    recipe: Recipe | None = None,
) -> PruneRequest:
    """Every refusal a prune request can get before a model is loaded: budget, method and options and their
    combinations, device, data, formats, output paths and the run lock, in that order (``config`` is built from
    the keywords but not yet validated: this check does it first). ``recipe``: the recipe the keywords came from
    (:func:`headcut.jobs.prune.recipes.recipe_for`), whose schedule the run follows unless ``via`` is given."""

    L = label
    method, rec = config.method, recovery
    recover_steps, recover_data = rec.recover_steps, rec.recover_data
    eval_data, trajectory, out = data.eval_data, run.trajectory, run.out
    with values():  # every value refused before any work, as a HeadcutValueError
        config.validate()
        entry = method_entry(method)
        chosen = get_method(method)
        opts = make_options(chosen, method_options)
        chosen.check(config, opts)
        if config.max_drop is not None and eval_data is None:
            raise HeadcutError(f"{L('max_drop')} needs {L('eval_data')} (the metric it watches)")
        if config.trajectory and eval_data is None:
            raise HeadcutError(f"{L('trajectory')} needs {L('eval_data')} (the metric after every step)")
        if isinstance(trajectory, (str, os.PathLike)) and Path(trajectory).suffix.lower() != ".csv":
            raise HeadcutError(
                f"{L('trajectory')} must name a .csv file (a .png is written beside it), got {trajectory}"
            )
        if config.via is not None and entry.kind != "score":
            scored = ", ".join(m.name for m in METHODS.values() if m.kind == "score")
            raise HeadcutError(
                f"{L('via')} cuts in two rounds, each scored on the model the one before left: it "
                f"applies to the score-based methods ({scored}), not to {method}"
            )
        if config.via is not None and getattr(opts, "bias_compensation", False):
            raise HeadcutError(
                f"{L('via')} and {L('bias_compensation')} do not go together: compensate a one-round cut"
            )
        if recipe is not None:  # with via, the recipe's schedule does not run
            compensated = config.via is None and getattr(opts, "bias_compensation", False)
            check_recipe_run(recipe, {"bias_compensation": compensated}, data.data)
        if getattr(opts, "eval_every", None) is not None and eval_data is None:
            raise HeadcutError(f"{L('eval_every')} needs {L('eval_data')}")
        _check_recovery(rec, data.data, config.via)
        if entry.data != "none" and data.data is None:
            free = [m.name for m in METHODS.values() if m.data == "none"]
            what = "training data with labels" if entry.data == "training" else "calibration data"
            raise HeadcutError(f"method {method} needs {L('data')} ({what}); {', '.join(free)} do not")
        if run.resume and not entry.resumable:
            learned = ", ".join(m.name for m in METHODS.values() if m.resumable)
            raise HeadcutError(
                f"{L('resume')} applies to the methods that keep checkpoints ({learned}), not to {method}"
            )
        if run.device is not None and entry.data != "training" and config.target_speedup is None:
            trains = ", ".join(m.name for m in METHODS.values() if m.data == "training")
            raise HeadcutError(
                f"{L('device')} applies to the methods that train ({trains}) and to {L('target_speedup')} (timed "
                f"there), not to {method}"
            )
        notes: list[str] = []
        used = data.data  # the data read: none for a method that reads none (and no recovery or refit)
        if used is not None and entry.data == "none" and not recover_steps and not rec.refit:
            notes.append(f"method {method} reads no data: the data given was not used")
            used = None
        data_spec, eval_spec = data_specs(used, eval_data, data.split, data.eval_split, data.data_options, config.seed)
        if isinstance(recover_data, DataConfig):  # the job reads it as it is (jobs.base.calibration)
            recover_data.validate()
        if recover_data is not None and eval_spec is not None:
            spec = (
                data_config(recover_data, data.split, data.data_options, config.seed)
                if isinstance(recover_data, (str, os.PathLike))
                else recover_data
            )
            why = same_data(spec, eval_spec)
            if why:
                raise HeadcutError(
                    f"{L('recover_data')} and {L('eval_data')} are the same data ({why}): the model "
                    f"would be trained on the rows it is judged on; hold out other rows for "
                    f"{L('eval_data')}"
                )
        dist, torch_device = pick_device(run.device)
        from ...training.parallel import engine_note  # torch: after the checks that need none

        notes += engine_note(getattr(opts, "engine", "auto"), dist)
        chosen_formats = parse_formats(run.formats)
        path = choose(
            source.model,
            run.layerwise.layerwise,
            run.layerwise.max_memory,
            refusal(
                source.model,
                method,
                config,
                eval_data,
                rec.refit,
                recover_steps,
                chosen_formats,
                rounds=recipe is not None and config.via is None and recipe.rounds_vary,
            ),
        )
        check_speed_target(config, opts, path.layerwise)
        if path.layerwise and dist.world > 1:
            raise HeadcutError(f"{L('layerwise')} runs in one process; launch it without torchrun or accelerate")
        own_checkpoint = run.checkpoint_dir is None and out is not None and entry.resumable
        ckpt = (
            Path(run.checkpoint_dir)
            if run.checkpoint_dir is not None
            else (checkpoint_dir_for(out) if own_checkpoint and out is not None else None)
        )
        target, trajectory_file = None, None
        if out is not None:
            traj = Path(trajectory) if isinstance(trajectory, (str, os.PathLike)) else None
            model = source.model
            target, files = plan_outputs(
                reads={
                    L("model"): model if isinstance(model, (str, os.PathLike)) else None,
                    L("data"): spec_path(used),
                    L("eval_data"): spec_path(eval_data),
                    L("recover_data"): spec_path(recover_data),
                    L("recipe"): recipe.source if recipe is not None else None,
                },
                files={
                    L("trajectory"): traj,
                    f"{L('trajectory')} (its PNG)": traj.with_suffix(".png") if traj else None,
                },
                file_force={L("trajectory"): True, f"{L('trajectory')} (its PNG)": True},
                out=Path(out),
                force=run.force,
                checkpoint=ckpt if entry.resumable else None,
            )
            trajectory_file = files.get(L("trajectory"))
        if ckpt is not None and entry.resumable:
            prepare_checkpoint_dir(ckpt, run.resume, run.restart or (run.force and own_checkpoint))
    return PruneRequest(
        source=source,
        config=config,
        method_options=method_options,
        data=data,
        recovery=rec,
        run=run,
        entry=entry,
        options=opts,
        notes=notes,
        data_spec=data_spec,
        eval_spec=eval_spec,
        dist=dist,
        device=torch_device,
        formats=chosen_formats,
        checkpoint_dir=ckpt if entry.resumable else None,
        own_checkpoint=own_checkpoint,
        target=target,
        trajectory_file=trajectory_file,
        path=path,
        recipe=recipe,
    )


def _check_recovery(rec: RecoveryConfig, data: Any, via: int | None) -> None:
    """The refusals of the recovery keywords, in the order they have always been given."""
    L = label
    recover_steps, recover_data = rec.recover_steps, rec.recover_data
    check_fields(rec, ("recover_steps",))  # each range: the declaration's, checked where its message has always been
    if recover_steps and data is None:
        raise HeadcutError(
            f"{L('recover_steps')} trains the pruned model: it needs {L('data')} (training data with labels)"
        )
    if recover_data is not None:
        if not recover_steps:
            raise HeadcutError(
                f"{L('recover_data')} is read by the recovery fine-tuning: it needs {L('recover_steps')} N"
            )
        check_data_spec(recover_data, L("recover_data"))
    check_fields(rec, ("recover_hidden_weight",))
    if rec.recover_hidden_weight and not recover_steps:
        raise HeadcutError(
            f"{L('recover_hidden_weight')} weighs a term of the recovery fine-tuning: it needs {L('recover_steps')} N"
        )
    check_fields(rec, ("recover_average",))
    if rec.recover_average and not recover_steps:
        raise HeadcutError(
            f"{L('recover_average')} averages the weights of the recovery fine-tuning: it needs {L('recover_steps')} N"
        )
    check_fields(rec, ("via_steps",))
    if rec.via_steps is not None:
        if via is None or not recover_steps:
            raise HeadcutError(
                f"{L('via_steps')} sets the recovery steps of {L('via')}'s first round: it needs "
                f"{L('via')} K and {L('recover_steps')} N"
            )
    if rec.refit and data is None:
        raise HeadcutError(
            f"{L('refit')} fits the kept heads' output projections to the unpruned model's outputs "
            f"on data: it needs {L('data')}"
        )
