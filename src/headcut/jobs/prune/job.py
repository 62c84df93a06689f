"""``headcut.prune``: make the request (:func:`headcut.jobs.prune.request.prune_request`, the one check the command
line makes too), then run the rounds of its schedule (:mod:`headcut.pruning.schedule`), each through the stages its
recipe lists (:mod:`headcut.jobs.prune.stages`), report and save (``headcut prune``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass, replace
from typing import Any

from ...arguments.table import checked
from ...config import LayerwiseConfig
from ...config.run import DataSources, ModelSource, OutputSettings, RunSettings
from ...data import Calibration
from ...files.names import real_path
from ...model import compensation
from ...model.evaluation import PRIMARY
from ...model.masks import HeadMask
from ...model.surgery import model_blocks
from ...outputs.formats import check_formats
from ...outputs.reports import prune_report, weights_bytes
from ...progress import Reporter, quiet
from ...pruning.schedule import schedule as schedule_rounds
from ...recipes import Recipe
from ...training.checkpoint import clear_checkpoint_dir
from ...training.finetuning import frozen_teacher
from ...training.parallel import resolve_engine
from ..agreement import Agreement, checkpoint_found, data_settings, run_fingerprint
from ..base import ModelLike, calibration, load_model, move, plain_arguments
from ..results import Pruned
from ..saving import local_reads
from .layerwise import prune_layerwise
from .recipes import resolved_recipe
from .request import PruneRequest, prune_request
from .rounds import as_one_cut, in_input_numbering, round_record
from .speed_target import check_speed_memory, find_speed_budget
from .stages.base import PruneState, RoundRun


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
    schedule: str | Sequence[int] | None = None,
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
    budget replaces its budget, ``data_options`` go over its data options, ``via`` or ``schedule`` (``K1,K2,...``) replace its
    schedule), and the report's ``recipe`` is the run resolved (replayable). ``method`` alone is that method with
    its paper's defaults (a recipe of the stages choose and cut). ``options``: the method's own options and any
    stage's, by name (a kind registered with :func:`headcut.jobs.prune.stages.register` too). Budget: ``keep`` K heads, or ``sparsity`` S (K = floor((1 - S) heads)), or ``max_drop`` D (remove
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
    stage_keywords = dict(
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
        via=via,
        schedule=schedule,
        via_steps=via_steps,
    )
    defaults = _keyword_defaults()
    given = {k: v for k, v in stage_keywords.items() if v != defaults[k]}  # a keyword given a value of its own
    return run_request(
        lambda: prune_request(
            ModelSource(
                task=task,
                allow_pickle=allow_pickle,
                trust_remote_code=trust_remote_code,
                model=model,
                tokenizer=tokenizer,
            ),
            method=method,
            recipe=recipe,
            given={**given, **options},
            seed=seed or None,
            sources=DataSources(data=data, eval_data=eval_data, eval_split=eval_split, recover_data=recover_data),
            data_options={**(data_options or {}), "split": split},
            output=OutputSettings(out=out, force=force, formats=formats, gguf_type=gguf_type),  # type: ignore[arg-type]
            trajectory=trajectory,
            run=RunSettings(
                seed=seed,
                device=device,
                resume=resume,
                checkpoint_dir=checkpoint_dir,
                restart=restart,
                progress=progress,
            ),
            # max_memory: a size string, or bytes as an int (parse_size reads both)
            layerwise=LayerwiseConfig(layerwise=layerwise, max_memory=max_memory),  # type: ignore[arg-type]
        ),
        arguments,
    )[1]


def run_request(
    build: Callable[[], PruneRequest], arguments: dict[str, Any] | None = None
) -> tuple[PruneRequest, Pruned]:
    """Make the request (``build``: :func:`headcut.jobs.prune.request.prune_request` with what was asked; the
    command line calls it with its flags) and run it: layer-wise or in memory, then save it to its ``out``. Several
    processes (torchrun, accelerate) agree on the request and stop together with one line
    (:class:`~headcut.jobs.agreement.Agreement`). ``arguments``: the report's record of what was asked (default:
    the request's, as the Python API names them)."""
    agreement = Agreement()  # several processes: they agree before the work, or all stop with one line
    with agreement.guard():
        request = build()
        return request, _run(request, arguments, agreement)


def _run(request: PruneRequest, arguments: dict[str, Any] | None, agreement: Agreement) -> Pruned:
    if request.data_note is not None:
        request.notes.append(request.data_note)
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


def _keyword_defaults() -> dict[str, Any]:
    """The defaults of ``prune``'s keywords that are options of the recipe (budget, schedule, stages)."""
    import inspect

    parameters = inspect.signature(prune.__wrapped__).parameters  # type: ignore[attr-defined]
    return {name: p.default for name, p in parameters.items()}


#: fewer labelled examples than this: the recovery suggests ``--recover-data`` (issue 33: on 900 rows it closed
#: most of the gap to the unpruned classifier, nothing trained on the rows alone did)
SMALL_DATA = 2000


def _prune(request: PruneRequest, arguments: dict[str, Any] | None, agreement: Agreement) -> Pruned:
    """The work of :func:`prune` on a checked request: load and read, the rounds' stages, the report.
    ``agreement``: that of the run's processes, reached once the model and the data are read
    (:class:`headcut.jobs.agreement.Agreement`)."""
    src, config, sources, run = request.source, request.config, request.sources, request.run
    method, seed, opts, notes = config.method, config.seed, request.options, request.notes
    dist, torch_device, checkpoint_dir = request.dist, request.device, request.checkpoint_dir
    split = request.data_options.get("split", "train")
    data_options = {k: v for k, v in request.data_options.items() if k != "split"}
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
                data=sources.data,
                eval_data=sources.eval_data,
                uniform=config.uniform,
                min_heads_per_block=config.min_heads_per_block,
                gqa=config.gqa,
                via=config.via,
                seed=seed,
                trajectory=request.trajectory,
                task=src.task,
                split=split,
                eval_split=sources.eval_split,
                data_options=data_options if request.recipe_given else data_options or None,
                device=run.device,
                **request.method_options,
            )
        )
    )
    progress = run.progress or quiet()
    loaded = load_model(src.model, src.task, src.allow_pickle, src.trust_remote_code, notes, progress, seed=seed)
    check_formats(loaded.module, request.formats, request.output.gguf_type, cut="uniform" if config.uniform else "any")
    # every round's budget, refused before reading data
    plan = () if request.through else request.recipe.schedule
    rounds = schedule_rounds(
        loaded.module, config, opts, plan, rounds=request.through, via_steps=request.schedule.via_steps, checked=True
    )
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
        sources.eval_split,
        data_options,
        seed,
        src.trust_remote_code,
        progress,
        "eval data",
    )
    # every row of the unlabelled inputs (--max-examples caps --data and --eval-data)
    extra = calibration(
        sources.recover_data,
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
    recover = request.stage("recover")
    if (
        recover is not None
        and recover.active()
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
                "stages": [
                    (s.kind, sorted(s.options().items(), key=str)) for s in request.stages if s.kind != "choose"
                ],
                "schedule": (config.via, request.through, request.schedule.via_steps),
                "task": src.task,
                "resume": run.resume,
                "eval_split": sources.eval_split if request.eval_spec is not None else None,
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
    stages = request.stages
    state = PruneState(
        model=loaded.module,
        config=config,
        options=opts,
        cal=cal,
        eval_cal=eval_cal,
        extra=extra,
        progress=progress,
        metric=PRIMARY[eval_cal.task][0] if eval_cal is not None else None,
        device=torch_device,
        dist=dist,
        unpruned=frozen_teacher(loaded.module) if any(s.keeps_unpruned(rounds) for s in stages) else None,
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
        running = [s for s in (stage.in_round(planned.options) for stage in stages) if s.active()]
        for stage in running:
            stage.prepare(state, step)
        for stage in running:
            stage.run(state, step)
        runs.append(step)
        mask = in_input_numbering(mask, step.result.mask)
        if not step.last:
            records.append(round_record(step, mask, running))
    assert mask is not None
    state.unpruned = None
    last = runs[-1]
    result, slimmed = as_one_cut(runs, mask, config)
    result.metric_after = last.metric
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
    for stage in running:  # the last round's stages
        stage.report(state, last, report)
    if records:  # the rounds before the last, before the entries of the stages that trained
        report = _before(report, "recovery", "rounds", records)
    if speed is not None:
        report["speed_target"] = speed.to_json()
    report["recipe"] = resolved_recipe(
        request.recipe, stages, config, request.data_spec, data_options, rounds, scheduled=_scheduled(request)
    ).to_dict()
    reads = local_reads(
        **{
            "MODEL": loaded.folder,
            "--data": request.data_spec,
            "--eval-data": request.eval_spec,
            "--recover-data": sources.recover_data,
            "--recipe": request.recipe.source,
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
        gguf_type=request.output.gguf_type,
    )


def _scheduled(request: PruneRequest) -> bool:
    """Whether the request's rounds are ``via``'s or ``schedule``'s (not its recipe's schedule)."""
    return request.config.via is not None or bool(request.through)


def _before(report: dict[str, Any], key: str, new: str, value: Any) -> dict[str, Any]:
    """``report`` with ``new``: ``value`` placed before ``key`` (at the end where there is none)."""
    if key not in report:
        report[new] = value
        return report
    out: dict[str, Any] = {}
    for k, v in report.items():
        if k == key:
            out[new] = value
        out[k] = v
    return out


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
