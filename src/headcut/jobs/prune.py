"""``headcut.prune``: check the request (:func:`prune_request`, the one check the command line makes too),
choose heads with a method, remove them, optionally recover and save (``headcut prune``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any

from torch import nn

from ..arguments import checked, values
from ..catalog import METHODS, method_entry
from ..config import FinetuneConfig, PruneConfig
from ..data import Calibration
from ..errors import HeadcutError, label
from ..outputs.formats import check_formats, parse_formats
from ..model.masks import HeadMask
from ..model.surgery import model_blocks
from ..files.atomic import OutputDir, OutputFile
from ..files.names import real_path
from ..files.special import special_kind
from ..progress import Reporter, quiet
from ..outputs.reports import prune_report, weights_bytes, write_trajectory_csv, write_trajectory_png
from .base import (
    Agreement,
    Bars,
    ModelLike,
    Written,
    calibration,
    check_data_spec,
    data_config,
    data_specs,
    load_model,
    local_reads,
    move,
    plain_arguments,
    checkpoint_found,
    data_settings,
    run_fingerprint,
    same_data,
    spec_path,
    pick_device,
)


@dataclass(kw_only=True)
class Pruned(Written):
    """What :func:`prune` produced: ``model`` (slimmed), ``mask`` (kept heads, the input model's
    numbering: ``export --mask`` replays it), ``report`` (what ``headcut-report.json`` and ``--json`` hold)
    and ``result`` (:class:`headcut.pruning.PruneResult`: trajectory, training run, ...). ``save(out)``
    writes the model with its report; ``write_trajectory(csv)`` the metric after every step."""

    mask: HeadMask
    result: Any
    #: the trajectory files :func:`prune` wrote (with ``out`` and a ``trajectory`` path)
    written: list[Path] = field(default_factory=list)

    @checked("Pruned.write_trajectory")
    def write_trajectory(self, csv_path: str | os.PathLike[str] | OutputFile, png: bool = True,
                         force: bool = False) -> list[Path]:
        """Write the trajectory (one row per step) to a ``.csv`` file, and its plot beside it as ``.png``
        when matplotlib is installed and imports (and ``png``); returns the files written."""
        from ..extras import usable

        csv_file = csv_path if isinstance(csv_path, OutputFile) else OutputFile(csv_path, "--trajectory", force=force)
        if csv_file.path.suffix.lower() != ".csv":
            raise HeadcutError(f"{label('trajectory')} must name a .csv file (a .png is written beside it), got {csv_file.path}")
        png_file = OutputFile(csv_file.path.with_suffix(".png"), "--trajectory (its PNG)", force=csv_file.force)
        if not isinstance(csv_path, OutputFile):
            csv_file.check()
        png = png and usable("matplotlib")
        if png:
            png_file.check()
        temps: list[Path] = []
        try:
            temps.append(csv_file.temp())
            write_trajectory_csv(temps[0], self.result)
            if png:
                temps.append(png_file.temp())
                name = Path(self.report["model"]).name
                write_trajectory_png(temps[1], self.result, f"{name}: {self.result.method}")
            for temp, final in zip(temps, (csv_file, png_file)):
                final.commit(temp)
            temps = []
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)
        if not png and special_kind(png_file.path) is None:
            png_file.path.unlink(missing_ok=True)  # a stale PNG of an earlier run (never a pipe or a device)
        return [csv_file.path] + ([png_file.path] if png else [])


@checked("prune")
def prune(
    model: ModelLike, method: str, *, keep: int | None = None, sparsity: float | None = None,
    max_drop: float | None = None, data: Any = None, eval_data: Any = None, uniform: bool = False,
    min_heads_per_block: int = 0, gqa: str = "auto", via: int | None = None, seed: int = 0, trajectory: bool = False,
    tokenizer: Any = None, task: str | None = None, split: str = "train", eval_split: str = "validation",
    data_options: Mapping[str, Any] | None = None, device: str | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None, resume: bool = False, restart: bool = False,
    progress: Reporter | None = None, allow_pickle: bool = False, trust_remote_code: bool = False,
    formats: str | Sequence[str] | None = None, gguf_type: str = "f16", recover_steps: int = 0, refit: bool = False,
    recover_data: Any = None, recover_hidden_weight: float = 0.0, recover_average: float = 0.0,
    via_steps: int | None = None, layerwise: bool = False,
    max_memory: str | int | None = None, out: str | os.PathLike[str] | None = None, force: bool = False,
    arguments: dict[str, Any] | None = None, **options: Any,
) -> Pruned:
    """Choose heads with ``method`` and remove them (``headcut prune``); see the module's doc for models and
    data. Budget: ``keep`` K heads, or ``sparsity`` S (K = floor((1 - S) heads)), or ``max_drop`` D (remove
    while the eval metric stays within D; score-based methods), met exactly in whole units or refused
    with the nearest valid budgets before any data is read. ``options``: the method's own options (e.g.
    ``max_steps=500`` for a learned method, ``step=4`` for michel; :func:`headcut.pruning.make_options`
    refuses the others). ``checkpoint_dir``/``resume``/``restart``: a learned method's resume checkpoint
    (``restart`` discards a stale one). ``device``: where to score or train (auto: CUDA when available).
    ``formats``/``gguf_type``: what ``save`` writes (see :mod:`headcut.outputs.formats`), checked before the work.
    ``recover_steps`` N > 0: after the cut, N steps of recovery fine-tuning on ``data``, distilled from the
    unpruned model (``finetune``'s loss and defaults: lr 5e-5, alpha 0.5, temperature 2); the report's
    ``recovery`` has its curve, and ``metric.after`` is the recovered model's (``after_pruning``: before
    the recovery). ``recover_data``: unlabelled in-domain inputs for the recovery (a path, ``datasets`` name or
    rows like ``data``; a classifier's rows need only their text column; every row is read): the recovery then
    learns from the unpruned model alone (alpha 1) over ``data``'s rows and these, and its labels are not read
    (the report's ``recovery.recover_data``). ``recover_hidden_weight`` W > 0: the recovery also matches the
    unpruned model's hidden states (``finetune``'s ``hidden_weight``). ``recover_average`` F in (0, 1]: each
    recovery runs at a constant learning rate and ends with the mean of its weights over its last F x N steps
    (stochastic weight averaging; ``finetune``'s ``average_last``; 0: linear decay, the last step's weights).
    ``via_steps`` M: ``via``'s first round recovers for M steps instead of N (0: no recovery there), so that a
    deep cut can spend more of its steps on the heads it keeps in the end.
    ``refit``: after the cut (before any
    recovery), refit each kept block's output projection by
    least squares to the unpruned model's output on ``data`` (:mod:`headcut.pruning.refit`); the report's ``refit``
    has the fit errors, and ``metric.after_refit`` the refitted model's metric. ``layerwise``: read the checkpoint
    one layer at a time (:mod:`headcut.model.streamed`: a one-shot method of a forward-only scorer on a local
    safetensors folder; memory flat in depth); also chosen automatically when the checkpoint would not fit
    ``max_memory`` (``12GB``, ``12GiB``, bytes; default: the machine's available memory); the report's
    ``layerwise`` says which path ran and its peak memory, and the result's model is then on the meta device
    (its weights are written by ``save``). ``trajectory``: True, or a ``.csv`` path to write it to (with its plot beside it). ``out``:
    save the result there (atomically; ``force`` replaces only a folder headcut wrote): the output paths are
    checked and locked before any work, and a learned method's resume checkpoint is ``OUT.headcut-checkpoint``
    unless ``checkpoint_dir`` says otherwise (``headcut prune --out``)."""
    given = {k: v for k, v in locals().items() if k not in ("options", "arguments")}
    agreement = Agreement()  # several processes: they agree before the work, or all stop with one line
    with agreement.guard():
        request = prune_request(**given, options=options)
        with request.lock():
            if request.layerwise is not None and request.layerwise.layerwise:  # one process only
                from .layerwise import prune_layerwise

                pruned = prune_layerwise(request, arguments, request.layerwise)
            else:
                pruned = _prune(request, arguments, agreement)
            if request.target is not None and request.dist.main:
                pruned.save(request.target)
                if request.checkpoint_dir is not None and request.own_checkpoint:
                    import shutil

                    shutil.rmtree(request.checkpoint_dir, ignore_errors=True)
                if request.trajectory_file is not None:
                    pruned.written = pruned.write_trajectory(request.trajectory_file)
    return pruned


@dataclass
class Recovery:
    """How each round's recovery fine-tuning runs (``prune``'s ``recover_steps``, ``recover_hidden_weight``,
    ``recover_average``)."""

    steps: int
    hidden_weight: float = 0.0
    #: > 0: a constant learning rate, and the weights at the end the mean over this fraction of the last steps
    average: float = 0.0

    def config(self, seed: int) -> FinetuneConfig:
        """The recovery's :class:`FinetuneConfig`: ``finetune``'s defaults (lr 5e-5, alpha 0.5, temperature 2) with
        these settings; no resume checkpoints."""
        averaged = {"average_last": self.average, "schedule": "constant"} if self.average else {}
        return FinetuneConfig(max_steps=self.steps, seed=seed, checkpoint_every=None,
                              hidden_weight=self.hidden_weight, **averaged)


@dataclass
class PruneRequest:
    """A prune request checked before any work (:func:`prune_request`)."""

    given: dict[str, Any]
    config: PruneConfig
    entry: Any
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
    #: the layer-wise choice (:class:`headcut.jobs.layerwise.Choice`)
    layerwise: Any = None

    def lock(self) -> Any:
        from ..training.checkpoint import locked_output

        if self.target is None:
            return contextlib.nullcontext()
        return locked_output(self.target, self.dist.main, self.target.path, self.checkpoint_dir)


def prune_request(*, model: Any, method: str, keep: Any, sparsity: Any, max_drop: Any, data: Any, eval_data: Any,
                   uniform: bool, min_heads_per_block: int, gqa: str, via: Any, seed: int, trajectory: Any,
                   tokenizer: Any,
                   task: Any, split: str, eval_split: str, data_options: Any, device: Any, checkpoint_dir: Any,
                   resume: bool, restart: bool, progress: Any, allow_pickle: bool, trust_remote_code: bool,
                   formats: Any, gguf_type: str, recover_steps: int, refit: bool, recover_data: Any,
                   recover_hidden_weight: float, recover_average: float, via_steps: int | None, layerwise: bool,
                   max_memory: Any, out: Any,
                   force: bool, options: dict[str, Any]) -> PruneRequest:
    """Every refusal a prune request can get before a model is loaded: budget, method and options and their
    combinations, device, data, formats, output paths and the run lock (``prune`` and ``headcut prune`` call
    this one check; its messages name keywords, which the command line shows as flags)."""
    from ..training.checkpoint import checkpoint_dir_for
    from ..files.plan import plan_outputs
    from ..pruning import get_method, make_options

    given = dict(model=model, method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, data=data,
                 eval_data=eval_data, uniform=uniform, min_heads_per_block=min_heads_per_block, gqa=gqa, via=via,
                 seed=seed,
                 trajectory=trajectory, tokenizer=tokenizer, task=task, split=split, eval_split=eval_split,
                 data_options=data_options, device=device, checkpoint_dir=checkpoint_dir, resume=resume,
                 restart=restart, progress=progress, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                 gguf_type=gguf_type, recover_steps=recover_steps, refit=refit, recover_data=recover_data,
                 recover_hidden_weight=recover_hidden_weight, recover_average=recover_average, via_steps=via_steps,
                 layerwise=layerwise, max_memory=max_memory, options=options)
    L = label
    with values():  # every value refused before any work, as a HeadcutValueError
        config = PruneConfig(method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, uniform=uniform,
                             min_heads_per_block=min_heads_per_block, gqa=gqa, via=via, seed=seed,
                             trajectory=trajectory is not False and trajectory is not None)
        config.validate()
        entry = method_entry(method)
        chosen = get_method(method)
        opts = make_options(chosen, options)
        chosen.check(config, opts)
        if max_drop is not None and eval_data is None:
            raise HeadcutError(f"{L('max_drop')} needs {L('eval_data')} (the metric it watches)")
        if config.trajectory and eval_data is None:
            raise HeadcutError(f"{L('trajectory')} needs {L('eval_data')} (the metric after every step)")
        if isinstance(trajectory, (str, os.PathLike)) and Path(trajectory).suffix.lower() != ".csv":
            raise HeadcutError(f"{L('trajectory')} must name a .csv file (a .png is written beside it), got "
                               f"{trajectory}")
        if via is not None and entry.kind != "score":
            scored = ", ".join(m.name for m in METHODS.values() if m.kind == "score")
            raise HeadcutError(f"{L('via')} cuts in two rounds, each scored on the model the one before left: it "
                               f"applies to the score-based methods ({scored}), not to {method}")
        if via is not None and getattr(opts, "bias_compensation", False):
            raise HeadcutError(f"{L('via')} and {L('bias_compensation')} do not go together: compensate a one-round "
                               "cut")
        if getattr(opts, "eval_every", None) is not None and eval_data is None:
            raise HeadcutError(f"{L('eval_every')} needs {L('eval_data')}")
        if not (isinstance(recover_steps, int) and recover_steps >= 0):
            raise HeadcutError(f"{L('recover_steps')} must be a whole number >= 0 (got {recover_steps})")
        if recover_steps and data is None:
            raise HeadcutError(f"{L('recover_steps')} trains the pruned model: it needs {L('data')} (training data "
                               "with labels)")
        if recover_data is not None:
            if not recover_steps:
                raise HeadcutError(f"{L('recover_data')} is read by the recovery fine-tuning: it needs "
                                   f"{L('recover_steps')} N")
            check_data_spec(recover_data, L("recover_data"))
        if recover_hidden_weight < 0:
            raise HeadcutError(f"{L('recover_hidden_weight')} must be a number >= 0 (got {recover_hidden_weight!r})")
        if recover_hidden_weight and not recover_steps:
            raise HeadcutError(f"{L('recover_hidden_weight')} weighs a term of the recovery fine-tuning: it needs "
                               f"{L('recover_steps')} N")
        if not (isinstance(recover_average, (int, float)) and 0 <= recover_average <= 1):
            raise HeadcutError(f"{L('recover_average')} must be a fraction of the recovery's steps, in [0, 1] (got "
                               f"{recover_average!r})")
        if recover_average and not recover_steps:
            raise HeadcutError(f"{L('recover_average')} averages the weights of the recovery fine-tuning: it needs "
                               f"{L('recover_steps')} N")
        if via_steps is not None:
            if via_steps < 0:  # its type: RULES['prune'] (optional integer)
                raise HeadcutError(f"{L('via_steps')} must be a whole number >= 0 (got {via_steps!r})")
            if via is None or not recover_steps:
                raise HeadcutError(f"{L('via_steps')} sets the recovery steps of {L('via')}'s first round: it needs "
                                   f"{L('via')} K and {L('recover_steps')} N")
        if refit and data is None:
            raise HeadcutError(f"{L('refit')} fits the kept heads' output projections to the unpruned model's outputs "
                               f"on data: it needs {L('data')}")
        if entry.data != "none" and data is None:
            free = [m.name for m in METHODS.values() if m.data == "none"]
            what = "training data with labels" if entry.data == "training" else "calibration data"
            raise HeadcutError(f"method {method} needs {L('data')} ({what}); {', '.join(free)} do not")
        if resume and not entry.resumable:
            learned = ", ".join(m.name for m in METHODS.values() if m.resumable)
            raise HeadcutError(f"{L('resume')} applies to the methods that keep checkpoints ({learned}), not to "
                               f"{method}")
        if device is not None and entry.data != "training":
            trains = ", ".join(m.name for m in METHODS.values() if m.data == "training")
            raise HeadcutError(f"{L('device')} applies to the methods that train ({trains}), not to {method}")
        notes: list[str] = []
        if data is not None and entry.data == "none" and not recover_steps and not refit:
            notes.append(f"method {method} reads no data: the data given was not used")
            data = None
        data_spec, eval_spec = data_specs(data, eval_data, split, eval_split, data_options, seed)
        if recover_data is not None and eval_spec is not None:
            spec = data_config(recover_data, split, data_options, seed) if isinstance(
                recover_data, (str, os.PathLike)) else recover_data
            why = same_data(spec, eval_spec)
            if why:
                raise HeadcutError(f"{L('recover_data')} and {L('eval_data')} are the same data ({why}): the model "
                                   f"would be trained on the rows it is judged on; hold out other rows for "
                                   f"{L('eval_data')}")
        dist, torch_device = pick_device(device)
        from ..training.parallel import engine_note

        notes += engine_note(getattr(opts, "engine", "auto"), dist)
        chosen_formats = parse_formats(formats)
        from .layerwise import choose, refusal

        path = choose(model, layerwise, max_memory,
                      refusal(model, method, config, eval_data, refit, recover_steps, chosen_formats))
        if path.layerwise and dist.world > 1:
            raise HeadcutError(f"{L('layerwise')} runs in one process; launch it without torchrun or accelerate")
        own_checkpoint = checkpoint_dir is None and out is not None and entry.resumable
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else (
            checkpoint_dir_for(out) if own_checkpoint else None)
        target, trajectory_file = None, None
        if out is not None:
            traj = Path(trajectory) if isinstance(trajectory, (str, os.PathLike)) else None
            target, files = plan_outputs(
                reads={L("model"): model if isinstance(model, (str, os.PathLike)) else None,
                       L("data"): spec_path(data), L("eval_data"): spec_path(eval_data),
                       L("recover_data"): spec_path(recover_data)},
                files={L("trajectory"): traj, f"{L('trajectory')} (its PNG)": traj.with_suffix(".png") if traj else None},
                file_force={L("trajectory"): True, f"{L('trajectory')} (its PNG)": True},
                out=Path(out), force=force, checkpoint=ckpt if entry.resumable else None,
            )
            trajectory_file = files.get(L("trajectory"))
        if ckpt is not None and entry.resumable:
            from ..training.checkpoint import prepare_checkpoint_dir

            prepare_checkpoint_dir(ckpt, resume, restart or (force and own_checkpoint))
    return PruneRequest(given=given, config=config, entry=entry, options=opts, notes=notes, data_spec=data_spec,
                         eval_spec=eval_spec, dist=dist, device=torch_device, formats=chosen_formats,
                         checkpoint_dir=ckpt if entry.resumable else None, own_checkpoint=own_checkpoint,
                         target=target, trajectory_file=trajectory_file, layerwise=path)


def _prune(request: PruneRequest, arguments: dict[str, Any] | None, agreement: Agreement) -> Pruned:
    """The work of :func:`prune` on a checked request; ``agreement``: that of the run's processes, reached
    once the model and the data are read (:class:`headcut.jobs.base.Agreement`)."""
    from ..pruning import check_budget, plan_prune
    from ..model.surgery import slim

    g = request.given
    model, method, data, eval_data = g["model"], g["method"], g["data"], g["eval_data"]
    keep, sparsity, max_drop, uniform = g["keep"], g["sparsity"], g["max_drop"], g["uniform"]
    min_heads_per_block, gqa, seed, trajectory = g["min_heads_per_block"], g["gqa"], g["seed"], g["trajectory"]
    via = g["via"]
    tokenizer, task, split, eval_split = g["tokenizer"], g["task"], g["split"], g["eval_split"]
    data_options, device, resume = g["data_options"], g["device"], g["resume"]
    progress, allow_pickle, trust_remote_code = g["progress"], g["allow_pickle"], g["trust_remote_code"]
    gguf_type, recover_steps, refit, options = g["gguf_type"], g["recover_steps"], g["refit"], g["options"]
    recover_data = g["recover_data"]
    plan = Recovery(steps=recover_steps, hidden_weight=float(g["recover_hidden_weight"]),
                    average=float(g["recover_average"]))
    first_plan = plan if g["via_steps"] is None else replace(plan, steps=g["via_steps"])
    config, entry, opts, notes = request.config, request.entry, request.options, request.notes
    data_spec, eval_spec, dist, torch_device = request.data_spec, request.eval_spec, request.dist, request.device
    chosen, checkpoint_dir = request.formats, request.checkpoint_dir
    training = entry.resumable

    start = time.perf_counter()
    arguments = arguments if arguments is not None else plain_arguments(dict(
        model=model, method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, data=data, eval_data=eval_data,
        uniform=uniform, min_heads_per_block=min_heads_per_block, gqa=gqa, via=via, seed=seed, trajectory=trajectory,
        task=task, split=split, eval_split=eval_split, data_options=data_options, device=device, **options))
    progress = progress or quiet()
    loaded = load_model(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    check_formats(loaded.module, chosen, gguf_type, cut="uniform" if config.uniform else "any")
    _, budget, _, _ = check_budget(loaded.module, config, opts)  # refuse an unreachable budget before reading data
    rounds = [config]
    if via is not None:  # the first round's budget, refused the same way
        if not budget.target < via < budget.total:
            raise HeadcutError(f"{label('via')} {via} must lie between the heads kept in the end ({budget.target}) "
                               f"and the model's {budget.total}")
        first = replace(config, keep=via, sparsity=None, via=None)
        check_budget(loaded.module, first, opts)
        rounds = [first, replace(config, keep=budget.target, sparsity=None, via=None)]
    compensate = bool(getattr(opts, "bias_compensation", False))
    if compensate:
        from ..model import compensation

        bias_field = compensation.bias_field(loaded.module, model_blocks(loaded.module))  # refused before any work
    cal = calibration(data_spec, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
    eval_cal = calibration(eval_spec, loaded, tokenizer, eval_split, data_options, seed, trust_remote_code, progress,
                            "eval data")
    # every row of the unlabelled inputs (--max-examples caps --data and --eval-data)
    extra = calibration(recover_data, loaded, tokenizer, split, dict(data_options or {}, max_examples=None), seed,
                        trust_remote_code, progress, "recover data", unlabelled=True)
    for c, what in ((cal, "data"), (eval_cal, "eval data"), (extra, "recover data")):
        if c is not None:
            notes += [f"{what}: {n}" for n in c.notes]
    if recover_steps and extra is None and cal is not None and cal.task == "classification" and (
            cal.examples < SMALL_DATA):
        notes.append(f"data: {cal.examples} labelled examples; with under {SMALL_DATA:,} the recovery gained most "
                     f"from unlabelled text of the same kind given with --recover-data (docs/benchmarks.md, small "
                     "data)")
    if checkpoint_dir is not None and training and dist.main and not resume:
        from ..training.checkpoint import clear_checkpoint_dir

        clear_checkpoint_dir(checkpoint_dir)
    from ..training.parallel import resolve_engine

    # every process's data, model and settings, before the first collective: the same everywhere, or every process
    # stops with one line naming the difference (or the error of a process whose setup failed)
    agreement.agree(dist, lambda: run_fingerprint(
        {**asdict(config), **(asdict(opts) if is_dataclass(opts) else {}),
         "engine": resolve_engine(getattr(opts, "engine", "auto"), dist), "recover_steps": recover_steps,
         "refit": refit, "recover_hidden_weight": plan.hidden_weight, "recover_average": plan.average,
         "via_steps": g["via_steps"], "task": task, "resume": resume,
         "eval_split": eval_split if eval_spec is not None else None,
         **data_settings(data_spec, split, data_options, seed)},
        {"model": loaded.module}, {"data": cal, "eval_data": eval_cal, "recover_data": extra},
        found=checkpoint_found(checkpoint_dir) if resume else None))

    from ..model.evaluation import PRIMARY

    metric = PRIMARY[eval_cal.task][0] if eval_cal is not None else None
    train_label = {"agent": f"fine-tuning ({method})", "rewind": f"training ({method})"}.get(entry.kind)
    bars = Bars(progress, method, metric, train=train_label)

    # the learned gates under FSDP: the model stays whole in CPU memory, its shards train on the device
    sharded = entry.kind == "learned" and resolve_engine(getattr(opts, "engine", "auto"), dist) == "fsdp"
    if not sharded:
        move(loaded.module, torch_device)
    identity = {"model": str(real_path(loaded.folder)) if loaded.folder is not None else loaded.name}
    from ..training.finetuning import frozen_teacher

    unpruned = frozen_teacher(loaded.module) if recover_steps or refit else None
    earlier: list[dict[str, Any]] = []  # --via: the first round's record
    if len(rounds) > 1:
        bars.close()
        first_result, first_slim, record = _first_round(
            loaded.module, rounds[0], opts, cal, eval_cal, unpruned, Bars(progress, f"{method}, round 1", metric),
            refit, first_plan, seed, progress, metric, torch_device, extra, dist, gqa)
        earlier.append(record)
        notes += first_slim.notes
        bars = Bars(progress, f"{method}, round 2", metric, train=train_label)
        move(loaded.module, torch_device)
    # the refit fits the outputs of the model this round cuts
    refit_teacher = frozen_teacher(loaded.module) if refit and earlier else unpruned
    try:
        result = plan_prune(loaded.module, cal, rounds[-1], opts, eval_calibration=eval_cal, progress=bars,
                            on_step=bars.on_step, checkpoint_dir=checkpoint_dir if training else None, resume=resume,
                            dist=dist, identity=identity, device=torch_device if sharded else None)
    finally:
        bars.close()
    loaded.module.to("cpu")
    run = result.training
    if run is not None:
        last_open = run.history[-1].get("open") if run.history else None
        if run.moved is None and last_open is not None and last_open != result.target:
            notes.append(f"training ended with {last_open:g} heads open, not {result.target}: the gates had not "
                         "converged, so keeping the top heads changed the trained model; more steps (--epochs, "
                         "--max-steps) let them settle")
        if run.moved is not None:
            notes.append(f"{method} kept {run.own_kept:g} heads by its own rule (gate > 0.5); the adjustment to "
                         f"--keep {result.target} moved {run.moved} head(s)")
    near_uniform = None if earlier else _uniform_alternatives(loaded.module, config, result.target)
    if compensate:
        added = _compensation(loaded.module, result.mask, cal, progress, torch_device)
    slimmed = slim(loaded.module, result.mask, gqa=gqa)
    result.slim = slimmed
    notes += slimmed.notes
    if earlier:  # the two rounds as one cut of the input model
        result.mask = HeadMask({b: [first_result.mask.keep[b][i] for i in kept]
                                for b, kept in result.mask.keep.items()})
        result.heads_before, result.metric_before = first_result.heads_before, first_result.metric_before
        result.config = config
        result.scorings += first_result.scorings
        result.seconds += first_result.seconds
        slimmed = result.slim = replace(slimmed, heads_before=first_slim.heads_before,
                                        params_before=first_slim.params_before)
    if compensate:
        compensation.apply(loaded.module, model_blocks(loaded.module), added, bias_field)
        compensation.check_names(loaded.module, bias_field)
        notes.append(_compensation_note(len(added), bias_field))
        compensated = {"blocks": sorted(added), "field": bias_field, "metric_uncompensated": result.metric_after}
        if eval_cal is not None:
            from ..pruning import eval_metric

            move(loaded.module, torch_device)
            result.metric_after = eval_metric(loaded.module, eval_cal).measure(
                HeadMask.full(model_blocks(loaded.module)))
            loaded.module.to("cpu")
    pruned_metric = result.metric_after
    refitted, refit_metric, recovery = _refit_and_recover(
        loaded.module, refit_teacher if refit else None, unpruned if recover_steps else None, cal, eval_cal,
        plan, seed, progress, metric, torch_device, extra, dist)
    result.metric_after = (recovery.metric_after if recovery is not None
                           else refit_metric if refitted is not None else result.metric_after)
    del refit_teacher, unpruned
    notes += _majority_note(eval_cal, result.metric_before, result.metric_after)
    report = prune_report(
        model=loaded.name, arguments=arguments, result=result, slimmed=slimmed,
        size_before=weights_bytes(loaded.folder), data=cal.to_json() if cal is not None else None,
        eval_data=eval_cal.to_json() if eval_cal is not None else None, seconds=time.perf_counter() - start,
        notes=notes,
    )
    if near_uniform and len({(b.heads, b.kv_heads) for b in model_blocks(loaded.module)}) > 1:
        report["uniform_budgets"] = near_uniform
    if compensate:
        report["bias_compensation"] = compensated
    if refitted is not None:
        report["refit"] = refitted.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = pruned_metric
            report["metric"]["after_refit"] = refit_metric
    if earlier:
        report["rounds"] = earlier
    if recovery is not None:
        report["recovery"] = {"steps": recovery.steps, "distilled_from": "the unpruned model",
                              "config": recovery.config.to_json(), "seconds": recovery.seconds,
                              "history_summary": recovery.summary(), "curve": recovery.history}
        if extra is not None:
            report["recovery"]["recover_data"] = extra.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = pruned_metric
    reads = local_reads(**{"MODEL": loaded.folder, "--data": data_spec, "--eval-data": eval_spec,
                           "--recover-data": recover_data})
    return Pruned(model=loaded.module, mask=result.mask, report=report, result=result, source=loaded.folder,
                  notes=notes, reads=reads, trust_remote_code=trust_remote_code, formats=chosen, gguf_type=gguf_type)


#: fewer labelled examples than this: the recovery suggests ``--recover-data`` (issue 33: on 900 rows it closed
#: most of the gap to the unpruned classifier, nothing trained on the rows alone did)
SMALL_DATA = 2000


def _uniform_alternatives(model: nn.Module, config: PruneConfig, target: int) -> list[int]:
    """The ``--uniform`` budgets nearest ``target`` for a run without ``--uniform`` on a family whose stock config
    could hold a uniform cut (an empty list otherwise): what the summary offers for a stock checkpoint."""
    from ..adapters import adapter_for
    from ..pruning.search import uniform_budgets
    from ..pruning.units import block_sets, nearest

    if config.uniform or adapter_for(model).stock_spec(str(model.config.model_type)) is None:
        return []
    sets = block_sets(model_blocks(model), config.gqa)
    total = sum(s.heads * s.width for s in sets)  # the uncut model: not a cut to offer
    valid = [k for k in uniform_budgets(sets, config.min_heads_per_block) if 0 < k < total]
    return [target] if target in valid else nearest(valid, target)


def _compensation(model: nn.Module, mask: HeadMask, cal: Calibration | None, progress: Reporter, device: Any) -> Any:
    """FLAP's bias compensation for ``mask`` (:mod:`headcut.model.compensation`): the output projections' mean
    inputs over ``cal`` on the unpruned ``model`` (one more forward pass), and each block's bias increment."""
    from ..model import compensation
    from ..scoring.fluctuation import input_moments

    if cal is None:
        raise HeadcutError(f"{label('bias_compensation')} needs calibration data ({label('data')})")
    blocks = model_blocks(model)
    bars = Bars(progress, "bias compensation", None)
    move(model, device)
    try:
        moments, _ = input_moments(model, blocks, cal.batches, "bias compensation",
                                   lambda d, t: bars("score", d, t))
    finally:
        bars.close()
    model.to("cpu")
    return compensation.deltas(model, blocks, mask.keep, {name: m.mean() for name, m in moments.items()})


def _compensation_note(blocks: int, field: str | None) -> str:
    turned = f"; {field} turned on (zero biases on the other projections)" if field else ""
    return (f"bias compensation (FLAP §3.4): the removed heads' mean output folded into the output projection's "
            f"bias of {blocks} block{'s' if blocks != 1 else ''}{turned}")


def _refit(model: nn.Module, teacher: nn.Module, cal: Calibration | None, eval_cal: Calibration | None,
           progress: Reporter, metric: str | None, device: Any) -> tuple[Any, float | None]:
    """:func:`headcut.pruning.refit.refit_outputs` of the slimmed ``model`` on ``cal`` against ``teacher`` (the
    unpruned model), and the refitted model's metric on ``eval_cal`` (None without)."""
    from ..pruning.refit import refit_outputs
    from ..pruning import eval_metric

    if cal is None:
        raise HeadcutError(f"{label('refit')} needs data ({label('data')})")
    bars = Bars(progress, "refit", metric)
    move(model, device)
    move(teacher, device)
    try:
        refitted = refit_outputs(model, teacher, cal, progress=lambda d, t: bars("refit", d, t))
        after = eval_metric(model, eval_cal, bars).measure(HeadMask.full(model_blocks(model))) if eval_cal else None
    finally:
        bars.close()
        teacher.to("cpu")
    model.to("cpu")
    return refitted, after


def _refit_and_recover(model: nn.Module, refit_teacher: nn.Module | None, teacher: nn.Module | None,
                       cal: Calibration | None, eval_cal: Calibration | None, recovery: Recovery, seed: int,
                       progress: Reporter, metric: str | None, device: Any, extra: Calibration | None,
                       dist: Any) -> tuple[Any, Any, Any]:
    """What follows a cut: the refit to ``refit_teacher``'s outputs (None: no refit), then ``recovery`` distilled
    from ``teacher`` (None: none); returns the refit, its metric and the recovery (None where not run)."""
    refitted, refit_metric, recovered = None, None, None
    if refit_teacher is not None:
        refitted, refit_metric = _refit(model, refit_teacher, cal, eval_cal, progress, metric, device)
    if teacher is not None:
        recovered = _recover(model, teacher, cal, eval_cal, recovery, seed, progress, metric, device, extra, dist)
    return refitted, refit_metric, recovered


def _majority_note(eval_cal: Calibration | None, before: float | None, after: float | None) -> list[str]:
    """A note when the pruned model's accuracy on the eval data is no better than always answering its most
    frequent label while the input model's was (the cut, or a recovery that never left that state, lost the
    task: seen at 4 of 72 heads on a 3-class task)."""
    majority = eval_cal.majority() if eval_cal is not None else None
    if majority is None or before is None or after is None:
        return []
    name, share = majority
    if after > share + 1e-9 or before <= share + 1e-9:
        return []
    return [f"eval data: the pruned model's accuracy ({after:.4f}) is no better than always answering "
            f"{name!r} ({share:.4f} of --eval-data; the input model's: {before:.4f}): it has lost the task; keep "
            "more heads, or try another method or recovery (docs/commands.md, recovery)"]


def _first_round(model: nn.Module, config: PruneConfig, opts: Any, cal: Calibration | None,
                 eval_cal: Calibration | None, unpruned: nn.Module | None, bars: Bars, refit: bool, recovery: Recovery,
                 seed: int, progress: Reporter, metric: str | None, device: Any, extra: Calibration | None, dist: Any,
                 gqa: str) -> tuple[Any, Any, dict[str, Any]]:
    """``--via``'s first round: ``config``'s cut of ``model`` (in place), then the refit and the recovery against
    the unpruned model as in a one-round run; returns the cut's result, the slimming and the round's record for
    the report (its mask in the input model's numbering, its metric after each step)."""
    from ..model.surgery import slim
    from ..pruning import plan_prune

    try:
        result = plan_prune(model, cal, config, opts, eval_calibration=eval_cal, progress=bars, on_step=bars.on_step,
                            dist=dist)
    finally:
        bars.close()
    model.to("cpu")
    slimmed = slim(model, result.mask, gqa=gqa)
    record: dict[str, Any] = {"keep": config.keep, "mask": result.mask.to_json(),
                              "metric": {"after_pruning": result.metric_after}}
    refitted, refit_metric, recovered = _refit_and_recover(
        model, unpruned if refit else None, unpruned if recovery.steps else None, cal, eval_cal, recovery, seed,
        progress, metric, device, extra, dist)
    if refitted is not None:
        record["metric"]["after_refit"] = refit_metric
        record["refit"] = refitted.to_json()
    if recovered is not None:
        record["metric"]["after"] = recovered.metric_after
        record["recovery"] = {"steps": recovered.steps, "seconds": recovered.seconds,
                              "history_summary": recovered.summary()}
    return result, slimmed, record


def _recover(model: nn.Module, teacher: nn.Module, cal: Calibration | None, eval_cal: Calibration | None,
             recovery: Recovery, seed: int, progress: Reporter, metric: str | None, device: Any,
             extra: Calibration | None = None, dist: Any = None) -> Any:
    """``recovery.steps`` of recovery fine-tuning of the slimmed ``model``, distilled from ``teacher`` (the unpruned
    model): :func:`headcut.training.finetuning.finetune` with its defaults and ``recovery``'s settings
    (:meth:`Recovery.config`); with ``extra`` (unlabelled inputs)
    on ``cal``'s batches and ``extra``'s, from the teacher alone (alpha 1). ``dist``: data-parallel over the
    processes of the run (engine ``auto``: FSDP under ``accelerate launch --use_fsdp``, else DDP)."""
    import dataclasses

    from ..training.finetuning import finetune as run_finetune

    if cal is None:
        raise HeadcutError(f"{label('recover_steps')} needs training data with labels ({label('data')})")
    config = recovery.config(seed)
    if extra is not None:
        cal = dataclasses.replace(cal, batches=cal.batches + extra.batches, examples=cal.examples + extra.examples)
        config = dataclasses.replace(config, alpha=1.0)
    bars = Bars(progress, "recovery", metric, train=f"recovery fine-tuning (distilled, {recovery.steps} steps)")
    move(model, device)
    move(teacher, device)
    try:
        recovered = run_finetune(model, cal, config,
                                 teacher=teacher, eval_calibration=eval_cal, progress=lambda d, t: bars("train", d, t),
                                 eval_progress=lambda d, t: bars("eval", d, t),
                                 on_step=bars.on_step, dist=dist)
    finally:
        bars.close()
    model.to("cpu")
    return recovered
