"""``headcut.prune``: check the request (:func:`headcut.jobs.prune.request.prune_request`, the one check the command
line makes too), then run the rounds of its schedule (:mod:`headcut.pruning.schedule`), each through the stages of
:mod:`headcut.jobs.prune.stages` (choose, cut, refit, recover), report and save (``headcut prune``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass, replace
from typing import Any

from ...arguments.kinds import values
from ...arguments.table import checked
from ...config import LayerwiseConfig, PruneConfig, RecoveryConfig
from ...data import Calibration
from ...errors import HeadcutError, label
from ...files.names import real_path
from ...model import compensation
from ...model.evaluation import PRIMARY
from ...model.masks import HeadMask
from ...model.surgery import model_blocks
from ...outputs.formats import check_formats
from ...outputs.reports import prune_report, weights_bytes
from ...progress import Reporter, quiet
from ...pruning.schedule import schedule
from ...recipes import Recipe
from ...training.checkpoint import clear_checkpoint_dir
from ...training.finetuning import frozen_teacher
from ...training.parallel import resolve_engine
from ..agreement import Agreement, checkpoint_found, data_settings, run_fingerprint
from ..base import ModelLike, calibration, load_model, move, plain_arguments
from ..results import Pruned
from ..saving import local_reads
from .layerwise import prune_layerwise
from .recipes import keyword_changes, recipe_data, recipe_for, resolved_recipe
from .request import DataRequest, PruneRequest, RunSettings, Source, prune_request
from .speed_target import check_speed_memory, find_speed_budget
from .stages import STAGES, PruneState, RoundRun, as_one_cut, in_input_numbering, round_record


@checked("prune")
def prune(
    model: ModelLike,
    method: str | None = None,
    *,
    recipe: str | os.PathLike[str] | Recipe | Mapping[str, Any] | None = None,
    keep: int | None = None,
    sparsity: float | None = None,
    max_drop: float | None = None,
    kv_budget: float | None = None,
    context: int | None = None,
    target_speedup: float | None = None,
    allocation: str = "cost",
    data: Any = None,
    eval_data: Any = None,
    uniform: bool = False,
    min_heads_per_block: int = 0,
    gqa: str = "auto",
    via: int | None = None,
    seed: int = 0,
    trajectory: bool = False,
    tokenizer: Any = None,
    task: str | None = None,
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
    recover_steps: int = 0,
    refit: bool = False,
    recover_data: Any = None,
    recover_hidden_weight: float = 0.0,
    recover_average: float = 0.0,
    via_steps: int | None = None,
    layerwise: bool = False,
    max_memory: str | int | None = None,
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
    arguments: dict[str, Any] | None = None,
    **options: Any,
) -> Pruned:
    """Choose heads with ``method`` and remove them (``headcut prune``); see the module's doc for models and
    data. Without ``method``, run a recipe (:mod:`headcut.recipes`): ``recipe`` (a built-in name such as
    ``encoder``, a YAML or JSON file, a prune's ``headcut-report.json`` to replay it, a mapping or a
    :class:`~headcut.recipes.Recipe`), by default the default recipe of the model's kind (``headcut recipes``
    lists them); the keywords below given a value other than their default change the recipe's options (a
    budget replaces its budget, ``data_options`` go over its data options, ``via`` replaces its schedule), and
    the report's ``recipe`` is the run resolved (replayable). ``method`` alone is that method with its paper's
    defaults (a recipe of one stage). Budget: ``keep`` K heads, or ``sparsity`` S (K = floor((1 - S) heads)), or ``max_drop`` D (remove
    while the eval metric stays within D; score-based methods), met exactly in whole units or refused
    with the nearest valid budgets before any data is read; or ``kv_budget`` F, the fraction of the KV-cache bytes
    of one sequence of ``context`` tokens kept (default: the model's maximum length; decoders, score-based
    methods), the heads placed by ``allocation`` (``cost``: by score per byte saved, refined by calibration loss;
    ``count``: by score alone; :mod:`headcut.pruning.costs`), the report's ``kv_budget`` saying what was reached;
    or ``target_speedup`` X, the least such cut whose greedy decoding at ``context`` tokens is X times faster than the
    unpruned model's, timed on ``device`` (:mod:`headcut.jobs.prune.speed_target`; one-shot score-based methods; the
    report's ``speed_target`` has every budget timed). ``options``: the method's own options (e.g.
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
    agreement = Agreement()  # several processes: they agree before the work, or all stop with one line
    with agreement.guard():
        book, data_note = None, None
        if method is None or recipe is not None:
            given = dict(
                keep=keep,
                sparsity=sparsity,
                max_drop=max_drop,
                kv_budget=kv_budget,
                context=context,
                target_speedup=target_speedup,
                allocation=allocation,
                uniform=uniform,
                gqa=gqa,
                min_heads_per_block=min_heads_per_block,
                refit=refit,
                recover_steps=recover_steps,
                recover_hidden_weight=recover_hidden_weight,
                recover_average=recover_average,
                seed=seed,
            )
            book = _recipe(model, method, recipe, given, options, task, allow_pickle, trust_remote_code)
            method, options = book.method, book.method_options
            budget, cut, recover = book.budget, book.cut, book.recover
            keep, sparsity, max_drop = (budget.get(k) for k in ("keep", "sparsity", "max_drop"))
            kv_budget, context = budget.get("kv_budget"), budget.get("context")
            target_speedup = budget.get("target_speedup")
            uniform = cut.get("uniform", uniform)
            allocation = cut.get("allocation", allocation)
            gqa = cut.get("gqa", gqa)
            min_heads_per_block = cut.get("min_heads_per_block", min_heads_per_block)
            refit = book.refit
            ran = RecoveryConfig(**recover)  # the recipe's recovery options, the declared defaults for the others
            recover_steps, recover_hidden_weight = ran.recover_steps, ran.recover_hidden_weight
            recover_average = ran.recover_average
            data_options, data_note = recipe_data(book, data_options, model, task, allow_pickle, trust_remote_code)
            seed = book.seed if book.seed is not None else seed
        request = prune_request(
            Source(
                model, task=task, tokenizer=tokenizer, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code
            ),
            PruneConfig(
                method=method,
                keep=keep,
                sparsity=sparsity,
                max_drop=max_drop,
                kv_budget=kv_budget,
                context=context,
                target_speedup=target_speedup,
                allocation=allocation,
                uniform=uniform,
                min_heads_per_block=min_heads_per_block,
                gqa=gqa,
                via=via,
                seed=seed,
                trajectory=trajectory is not False and trajectory is not None,
            ),
            options,
            DataRequest(data=data, eval_data=eval_data, split=split, eval_split=eval_split, data_options=data_options),
            RecoveryConfig(
                recover_steps=recover_steps,
                refit=refit,
                recover_data=recover_data,
                recover_hidden_weight=recover_hidden_weight,
                recover_average=recover_average,
                via_steps=via_steps,
            ),
            RunSettings(
                device=device,
                checkpoint_dir=checkpoint_dir,
                resume=resume,
                restart=restart,
                progress=progress,
                formats=formats,
                gguf_type=gguf_type,
                out=out,
                force=force,
                trajectory=trajectory,
                # max_memory: a size string, or bytes as an int (parse_size reads both)
                layerwise=LayerwiseConfig(layerwise=layerwise, max_memory=max_memory),  # type: ignore[arg-type]
            ),
            book,
        )
        if data_note is not None:
            request.notes.append(data_note)
        with request.lock():
            if request.path.layerwise:  # one process only
                pruned: Pruned = prune_layerwise(request, arguments, request.path)
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


def _recipe(
    model: Any,
    method: str | None,
    recipe: Any,
    given: Mapping[str, Any],
    options: Mapping[str, Any],
    task: str | None,
    allow_pickle: bool,
    trust_remote_code: bool,
) -> Recipe:
    """The recipe a prune without ``method`` (or with ``recipe``) runs, with the keywords ``given`` on top."""
    with values():
        if method is not None:
            raise HeadcutError(
                f"give {label('method')} (the method alone, with its paper's defaults) or {label('recipe')}, not both"
            )
        book = recipe_for(model, recipe, task=task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    return book.changed(method_options=options, **keyword_changes(given))


#: fewer labelled examples than this: the recovery suggests ``--recover-data`` (issue 33: on 900 rows it closed
#: most of the gap to the unpruned classifier, nothing trained on the rows alone did)
SMALL_DATA = 2000


def _prune(request: PruneRequest, arguments: dict[str, Any] | None, agreement: Agreement) -> Pruned:
    """The work of :func:`prune` on a checked request: load and read, the rounds' stages, the report.
    ``agreement``: that of the run's processes, reached once the model and the data are read
    (:class:`headcut.jobs.agreement.Agreement`)."""
    src, config, data, rec, run = request.source, request.config, request.data, request.recovery, request.run
    method, seed, opts, notes = config.method, config.seed, request.options, request.notes
    dist, torch_device, checkpoint_dir = request.dist, request.device, request.checkpoint_dir
    split, data_options = data.split, data.data_options
    training = request.entry.resumable

    start = time.perf_counter()
    arguments = (
        arguments
        if arguments is not None
        else plain_arguments(
            dict(
                model=src.model,
                method=method,
                keep=config.keep,
                sparsity=config.sparsity,
                max_drop=config.max_drop,
                kv_budget=config.kv_budget,
                context=config.context,
                target_speedup=config.target_speedup,
                allocation=config.allocation,
                data=data.data,
                eval_data=data.eval_data,
                uniform=config.uniform,
                min_heads_per_block=config.min_heads_per_block,
                gqa=config.gqa,
                via=config.via,
                seed=seed,
                trajectory=run.trajectory,
                task=src.task,
                split=split,
                eval_split=data.eval_split,
                data_options=data_options,
                device=run.device,
                **request.method_options,
            )
        )
    )
    progress = run.progress or quiet()
    loaded = load_model(src.model, src.task, src.allow_pickle, src.trust_remote_code, notes, progress, seed=seed)
    check_formats(loaded.module, request.formats, run.gguf_type, cut="uniform" if config.uniform else "any")
    # every round's budget, refused before reading data
    plan = request.recipe.schedule if request.recipe is not None else ()
    rounds = schedule(loaded.module, config, opts, rec, plan, checked=True)
    if getattr(opts, "bias_compensation", False):
        compensation.bias_field(loaded.module, model_blocks(loaded.module))  # refused before any work
    if config.target_speedup is not None:  # its timing's caches fit the device, before any data is read
        check_speed_memory(loaded.module, config, torch_device)
    cal = calibration(
        request.data_spec, loaded, src.tokenizer, split, data_options, seed, src.trust_remote_code, progress, "data"
    )
    eval_cal = calibration(
        request.eval_spec,
        loaded,
        src.tokenizer,
        data.eval_split,
        data_options,
        seed,
        src.trust_remote_code,
        progress,
        "eval data",
    )
    # every row of the unlabelled inputs (--max-examples caps --data and --eval-data)
    extra = calibration(
        rec.recover_data,
        loaded,
        src.tokenizer,
        split,
        dict(data_options or {}, max_examples=None),
        seed,
        src.trust_remote_code,
        progress,
        "recover data",
        unlabelled=True,
    )
    for c, what in ((cal, "data"), (eval_cal, "eval data"), (extra, "recover data")):
        if c is not None:
            notes += [f"{what}: {n}" for n in c.notes]
    if (
        rec.recover_steps
        and extra is None
        and cal is not None
        and cal.task == "classification"
        and (cal.examples < SMALL_DATA)
    ):
        notes.append(
            f"data: {cal.examples} labelled examples; with under {SMALL_DATA:,} the recovery gained most "
            f"from unlabelled text of the same kind given with --recover-data (docs/benchmarks.md, small "
            "data)"
        )
    if checkpoint_dir is not None and training and dist.main and not run.resume:
        clear_checkpoint_dir(checkpoint_dir)

    engine = resolve_engine(getattr(opts, "engine", "auto"), dist)
    # every process's data, model and settings, before the first collective: the same everywhere, or every process
    # stops with one line naming the difference (or the error of a process whose setup failed)
    agreement.agree(
        dist,
        lambda: run_fingerprint(
            {
                **asdict(config),
                **(asdict(opts) if is_dataclass(opts) and not isinstance(opts, type) else {}),
                "engine": engine,
                "recover_steps": rec.recover_steps,
                "refit": rec.refit,
                "recover_hidden_weight": float(rec.recover_hidden_weight),
                "recover_average": float(rec.recover_average),
                "via_steps": rec.via_steps,
                "task": src.task,
                "resume": run.resume,
                "eval_split": data.eval_split if request.eval_spec is not None else None,
                **data_settings(request.data_spec, split, data_options, seed),
            },
            {"model": loaded.module},
            {"data": cal, "eval_data": eval_cal, "recover_data": extra},
            found=checkpoint_found(checkpoint_dir) if run.resume else None,
        ),
    )

    # the learned gates under FSDP: the model stays whole in CPU memory, its shards train on the device
    sharded = request.entry.kind == "learned" and engine == "fsdp"
    if not sharded:
        move(loaded.module, torch_device)
    speed = None
    if config.target_speedup is not None:  # the budget in bytes whose cut is measured to be fast enough
        with progress.task(f"timing cuts for {config.target_speedup:g}x decoding", None, "budgets") as task:
            speed = find_speed_budget(loaded.module, config, opts, cal, torch_device, task.update)
        config = replace(config, kv_budget=speed.chosen, target_speedup=None)
        rounds = [replace(rounds[-1], config=config)]
        notes.append(
            f"--target-speedup {speed.target:g}: --kv-budget {speed.chosen:g} was the least cut measured at least "
            f"that fast ({len(speed.tried)} budgets timed at {speed.context:,} tokens on {speed.device})"
        )
    identity = {"model": str(real_path(loaded.folder)) if loaded.folder is not None else loaded.name}
    state = PruneState(
        model=loaded.module,
        config=config,
        options=opts,
        recovery=rec,
        cal=cal,
        eval_cal=eval_cal,
        extra=extra,
        progress=progress,
        metric=PRIMARY[eval_cal.task][0] if eval_cal is not None else None,
        device=torch_device,
        dist=dist,
        unpruned=frozen_teacher(loaded.module) if rec.refit or any(r.recover_steps for r in rounds) else None,
        notes=notes,
        training=dict(
            checkpoint_dir=checkpoint_dir if training else None,
            resume=run.resume,
            identity=identity,
            device=torch_device if sharded else None,
        ),
        train_label={"agent": f"fine-tuning ({method})", "rewind": f"training ({method})"}.get(request.entry.kind),
    )
    runs: list[RoundRun] = []
    records: list[dict[str, Any]] = []  # the rounds before the last, for the report
    mask: HeadMask | None = None  # the rounds' cut so far, in the input model's numbering
    for i, planned in enumerate(rounds):
        step = RoundRun(planned, i, len(rounds))
        for stage in STAGES:
            stage(state, step)
        runs.append(step)
        mask = in_input_numbering(mask, step.result.mask)
        if not step.last:
            records.append(round_record(step, mask))
    assert mask is not None
    state.unpruned = None
    last = runs[-1]
    result, slimmed = as_one_cut(runs, mask, config)
    pruned_metric = result.metric_after
    result.metric_after = (
        last.recovered.metric_after
        if last.recovered is not None
        else last.refit_metric
        if last.refitted is not None
        else result.metric_after
    )
    notes += _majority_note(eval_cal, result.metric_before, result.metric_after)
    report = prune_report(
        model=loaded.name,
        arguments=arguments,
        result=result,
        slimmed=slimmed,
        size_before=weights_bytes(loaded.folder),
        data=cal.to_json() if cal is not None else None,
        eval_data=eval_cal.to_json() if eval_cal is not None else None,
        seconds=time.perf_counter() - start,
        notes=notes,
    )
    _add_rounds(report, last, records, pruned_metric, extra, loaded.module)
    if speed is not None:
        report["speed_target"] = speed.to_json()
    report["recipe"] = resolved_recipe(
        request.recipe, opts, config, rec, request.data_spec, data_options, rounds
    ).to_dict()
    reads = local_reads(
        **{
            "MODEL": loaded.folder,
            "--data": request.data_spec,
            "--eval-data": request.eval_spec,
            "--recover-data": rec.recover_data,
        }
    )
    return Pruned(
        model=loaded.module,
        mask=result.mask,
        report=report,
        result=result,
        source=loaded.folder,
        notes=notes,
        reads=reads,
        trust_remote_code=src.trust_remote_code,
        formats=request.formats,
        gguf_type=run.gguf_type,
    )


def _add_rounds(
    report: dict[str, Any],
    last: RoundRun,
    records: list[dict[str, Any]],
    pruned_metric: float | None,
    extra: Calibration | None,
    model: Any,
) -> None:
    """The report's entries of the stages: ``uniform_budgets``, ``bias_compensation``, ``refit``, ``rounds`` (the
    rounds before the last) and ``recovery`` (the last round's), and the metric after each stage."""
    if last.near_uniform and len({(b.heads, b.kv_heads) for b in model_blocks(model)}) > 1:
        report["uniform_budgets"] = last.near_uniform
    if last.compensated is not None:
        report["bias_compensation"] = last.compensated
    if last.refitted is not None:
        report["refit"] = last.refitted.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = pruned_metric
            report["metric"]["after_refit"] = last.refit_metric
    if records:
        report["rounds"] = records
    recovery = last.recovered
    if recovery is not None:
        report["recovery"] = {
            "steps": recovery.steps,
            "distilled_from": "the unpruned model",
            "config": recovery.config.to_json(),
            "seconds": recovery.seconds,
            "history_summary": recovery.summary(),
            "curve": recovery.history,
        }
        if extra is not None:
            report["recovery"]["recover_data"] = extra.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = pruned_metric


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
    return [
        f"eval data: the pruned model's accuracy ({after:.4f}) is no better than always answering "
        f"{name!r} ({share:.4f} of --eval-data; the input model's: {before:.4f}): it has lost the task; keep "
        "more heads, or try another method or recovery (docs/commands.md, recovery)"
    ]
