"""A prune request: one typed object (:class:`PruneRequest`) made by one function (:func:`prune_request`) from what
was asked, by the command line, the Python API or a recipe file alike, with every refusal a request can get before
a model is loaded, each rule written once here or by the owner of what it checks (a stage's :meth:`check`, the
budget's :func:`~headcut.config.prune.check_budget_rules`, a method's ``check``). Messages name keywords, which
the command line shows as flags and a recipe file as its keys.

What was asked: the model (:class:`~headcut.config.run.ModelSource`), ``method`` or ``recipe`` (a method alone is
the recipe of its stages, :func:`~headcut.jobs.prune.recipes.method_recipe`), the options ``given`` on top of it (a
budget's, a stage's or the method's, by name; the command line gives the flags given, the API the keywords given
values other than their defaults), the data (:class:`~headcut.config.run.DataSources` and the data options), what
is written (:class:`~headcut.config.run.OutputSettings`, the trajectory) and how it runs
(:class:`~headcut.config.run.RunSettings`, :class:`~headcut.config.LayerwiseConfig`). The request holds the recipe
that runs (the options given on top), the stage objects it lists, and the method's cut as the pruning layer reads
it (:class:`~headcut.config.PruneConfig`, made once from the recipe)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ...arguments.kinds import values
from ...arguments.table import check
from ...catalog import METHODS, MethodEntry, method_entry
from ...config import LayerwiseConfig, PruneConfig
from ...config.prune import ScheduleOptions, check_rounds
from ...config.run import DataSources, ModelSource, OutputSettings, RunSettings
from ...data import DataConfig
from ...errors import HeadcutError, label
from ...files.atomic import OutputDir, OutputFile
from ...files.plan import plan_outputs
from ...options import specs
from ...outputs.formats import parse_formats
from ...pruning import get_method, make_options
from ...recipes import Recipe
from ...recipes.recipe import BUDGET_FIELDS, option_owners
from ...training.checkpoint import checkpoint_dir_for, locked_output, prepare_checkpoint_dir
from ..base import check_data_spec, data_config, data_specs, pick_device, same_data
from ..saving import spec_path
from .layerwise_choice import Choice, choose, refusal
from .recipes import check_recipe, check_recipe_run, method_recipe, recipe_data, recipe_for
from .speed_target import check_speed_target
from .stages.base import PruneStage, make_stage

#: the names a request's ``given`` options may have besides the stages' and the method's: the budget's and the
#: schedule's
SCHEDULE_FIELDS = tuple(s.name for s in specs(ScheduleOptions))


@dataclass
class PruneRequest:
    """A prune request checked before any work (:func:`prune_request`): what was asked (``source``, ``recipe``: the
    recipe that runs, the options given on top; ``sources`` and ``data_options``: the data; ``output``,
    ``trajectory``; ``run``, ``layerwise``; ``schedule``: ``via``/``schedule``) and what the check settled: the
    ``stages`` (one object per stage of the recipe), ``config`` (the method's cut, :class:`PruneConfig`), the
    method's ``entry`` and ``options`` object, the data specs, the device, the formats, the checkpoint folder, the
    output target and trajectory file, the layer-wise ``path`` and the ``notes`` so far; ``recipe_given``: the
    recipe was asked for (not a method alone); ``through``: the heads each round before the last leaves, as
    ``schedule`` gives them."""

    source: ModelSource
    recipe: Recipe
    sources: DataSources
    data_options: dict[str, Any]
    output: OutputSettings
    trajectory: Any
    run: RunSettings
    layerwise: LayerwiseConfig
    schedule: ScheduleOptions
    stages: list[PruneStage]
    config: PruneConfig
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
    recipe_given: bool = False
    through: tuple[int, ...] | None = None
    data_note: str | None = field(default=None)

    @property
    def method_options(self) -> dict[str, Any]:
        """The method's options as the recipe gives them."""
        return self.recipe.method_options

    def stage(self, kind: str) -> PruneStage | None:
        return next((s for s in self.stages if s.kind == kind), None)

    def lock(self) -> Any:
        if self.target is None:
            return contextlib.nullcontext()
        return locked_output(self.target, self.dist.main, self.target.path, self.checkpoint_dir)


def _split_given(given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``given`` by owner: the budget's, the schedule's, and the stages' and the method's (the rest)."""
    budget = {k: v for k, v in given.items() if k in BUDGET_FIELDS and v is not None}
    schedule = {k: v for k, v in given.items() if k in SCHEDULE_FIELDS}
    rest = {k: v for k, v in given.items() if k not in BUDGET_FIELDS and k not in SCHEDULE_FIELDS}
    return budget, schedule, rest


def _through(text: Any) -> tuple[int, ...] | None:
    """``schedule`` as the heads each round before the last leaves: ``"48,24"`` or a sequence of whole numbers
    (None: not given)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    try:
        counts = tuple(int(p) for p in parts if not isinstance(p, bool) and str(p).strip().lstrip("-").isdigit())
    except ValueError:
        counts = ()
    if not parts or len(counts) != len(parts) or any(c < 1 for c in counts):
        raise HeadcutError(f"{label('schedule')} must be heads counts K1,K2,... (whole numbers >= 1), got {text!r}")
    if any(b >= a for a, b in zip(counts, counts[1:])):
        raise HeadcutError(f"{label('schedule')} must keep fewer heads each round, got {text!r}")
    return counts


def prune_request(
    source: ModelSource,
    *,
    method: str | None = None,
    recipe: Any = None,
    given: Mapping[str, Any] | None = None,
    seed: int | None = None,
    sources: DataSources | None = None,
    data_options: Mapping[str, Any] | None = None,
    output: OutputSettings | None = None,
    trajectory: Any = False,
    run: RunSettings | None = None,
    layerwise: LayerwiseConfig | None = None,
) -> PruneRequest:
    """The one check of a prune request (see the module's doc): every refusal it can get before a model is loaded,
    in the order they have always been given (the recipe and the values in it; the budget, method and options and
    their combinations; the stages'; device, data, formats, output paths and the run lock), and the request, typed.
    ``given``: the options given on top of the recipe, by name; ``seed``: the seed given (None: the recipe's, else
    0); ``trajectory``: True, or a .csv path to write it to."""
    L = label
    sources, output = sources or DataSources(), output or OutputSettings()
    run, layerwise = run or RunSettings(), layerwise or LayerwiseConfig()
    budget, schedule_given, options = _split_given(given or {})
    with values():  # every value refused before any work, as a HeadcutValueError
        if method is not None and recipe is not None:
            raise HeadcutError(
                f"give {L('method')} (the method alone, with its paper's defaults) or {L('recipe')}, not both"
            )
        recipe_given = method is None
        if method is not None:
            base = method_recipe(method_entry(method).name)
        else:
            base = recipe_for(
                source.model,
                recipe,
                task=source.task,
                allow_pickle=source.allow_pickle,
                trust_remote_code=source.trust_remote_code,
            )
        if recipe_given:
            check_recipe(base)  # every value of the recipe as its flag would be
        owners = option_owners()  # the stages' options given, and the method's (checked by its options class)
        staged = {k: v for k, v in options.items() if k in owners}
        own = {k: v for k, v in options.items() if k not in owners}
        check("prune", {"method": base.method, **budget, **schedule_given, **staged, "options": own})
        book = base.changed(options=options, budget=budget or None, seed=seed)
    schedule = ScheduleOptions(**schedule_given)
    data_options, data_note = recipe_data(
        book, data_options, source.model, source.task, source.allow_pickle, source.trust_remote_code
    )
    config = _cut_config(book, schedule, seed, trajectory)
    request = _checked(
        source, book, recipe_given, config, schedule, sources, data_options, output, trajectory, run, layerwise
    )
    request.data_note = data_note
    return request


def _cut_config(book: Recipe, schedule: ScheduleOptions, seed: int | None, trajectory: Any) -> PruneConfig:
    """The method's cut as the pruning layer reads it: the recipe's method, budget and cut options, ``via``, the
    seed (the recipe's where none is given) and whether a trajectory is kept. The one place they meet."""
    names = {f.name for f in fields(PruneConfig)}
    cut = {k: v for k, v in book.options_of("cut").items() if k in names}
    return PruneConfig(
        method=book.method,
        **{k: v for k, v in book.budget.items() if k in names},
        **cut,
        via=schedule.via,
        seed=book.seed if book.seed is not None else (seed or 0),
        trajectory=trajectory is not False and trajectory is not None,
    )


def _checked(
    source: ModelSource,
    book: Recipe,
    recipe_given: bool,
    config: PruneConfig,
    schedule: ScheduleOptions,
    sources: DataSources,
    data_options: dict[str, Any],
    output: OutputSettings,
    trajectory: Any,
    run: RunSettings,
    layerwise: LayerwiseConfig,
) -> PruneRequest:
    L = label
    method = config.method
    eval_data, out, recover_data = sources.eval_data, output.out, sources.recover_data
    with values():
        config.validate()
        entry = method_entry(method)
        chosen = get_method(method)
        opts = make_options(chosen, dict(book.method_options))
        chosen.check(config, opts)
        stages = [make_stage(s.name, s.options) for s in book.stages]
        for stage in stages:
            if stage.kind == "choose":
                stage.method_options = opts  # type: ignore[attr-defined]  # the method's checked options
        if config.max_drop is not None and eval_data is None:
            raise HeadcutError(f"{L('max_drop')} needs {L('eval_data')} (the metric it watches)")
        if config.trajectory and eval_data is None:
            raise HeadcutError(f"{L('trajectory')} needs {L('eval_data')} (the metric after every step)")
        if isinstance(trajectory, (str, os.PathLike)) and Path(trajectory).suffix.lower() != ".csv":
            raise HeadcutError(
                f"{L('trajectory')} must name a .csv file (a .png is written beside it), got {trajectory}"
            )
        through = _through(schedule.schedule)
        for given, what in (
            (config.via is not None, "{via} cuts in two rounds"),
            (through, "{schedule} cuts in rounds"),
        ):
            if given:
                check_rounds(entry, what)
        if config.via is not None and through:
            raise HeadcutError(f"give {L('via')} (two rounds) or {L('schedule')}, not both")
        scheduled = config.via is not None or bool(through)
        compensating = getattr(opts, "bias_compensation", False)
        if scheduled and compensating:
            what = L("via") if config.via is not None else L("schedule")
            raise HeadcutError(f"{what} and {L('bias_compensation')} do not go together: compensate a one-round cut")
        if recipe_given:  # with via or rounds, the recipe's schedule does not run
            check_recipe_run(book, not scheduled and compensating, sources.data)
        if getattr(opts, "eval_every", None) is not None and eval_data is None:
            raise HeadcutError(f"{L('eval_every')} needs {L('eval_data')}")
        stage_options = {name: value for stage in stages for name, value in stage.options().items()}
        request_view = _StageView(sources, config.method, entry.kind, config, scheduled, stage_options)
        for stage in stages:
            stage.check(request_view)
        recover = next((s for s in stages if s.kind == "recover"), None)
        recovers = recover is not None and recover.active()
        if recover_data is not None:
            if not recovers:
                raise HeadcutError(
                    f"{L('recover_data')} is read by the recovery fine-tuning: it needs {L('recover_steps')} N"
                )
            check_data_spec(recover_data, L("recover_data"))
        if schedule.via_steps is not None:
            check_fields_of(schedule, "via_steps")
            if not scheduled or not recovers:
                raise HeadcutError(
                    f"{L('via_steps')} sets the recovery steps of {L('via')}'s first round: it needs "
                    f"{L('via')} K and {L('recover_steps')} N"
                )
        if entry.data != "none" and sources.data is None:
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
        after_cut = [s for s in stages if s.kind not in ("choose", "cut") and s.active()]
        used = sources.data  # the data read: none for a method that reads none (and no stage after the cut)
        if used is not None and entry.data == "none" and not after_cut:
            notes.append(f"method {method} reads no data: the data given was not used")
            used = None
        split = data_options.get("split", "train")
        options_only = {k: v for k, v in data_options.items() if k != "split"}
        data_spec, eval_spec = data_specs(used, eval_data, split, sources.eval_split, options_only, config.seed)
        if isinstance(recover_data, DataConfig):  # the job reads it as it is (jobs.base.calibration)
            recover_data.validate()
        if recover_data is not None and eval_spec is not None:
            spec = (
                data_config(recover_data, split, options_only, config.seed)
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
        chosen_formats = parse_formats(output.formats)
        path = choose(
            source.model,
            layerwise.layerwise,
            layerwise.max_memory,
            refusal(
                source.model,
                method,
                config,
                eval_data,
                [s.switch or s.kind for s in after_cut],
                chosen_formats,
                rounds=bool(through) or (recipe_given and config.via is None and book.rounds_vary),
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
                    L("recipe"): book.source,
                },
                files={
                    L("trajectory"): traj,
                    f"{L('trajectory')} (its PNG)": traj.with_suffix(".png") if traj else None,
                },
                file_force={L("trajectory"): True, f"{L('trajectory')} (its PNG)": True},
                out=Path(out),
                force=output.force,
                checkpoint=ckpt if entry.resumable else None,
            )
            trajectory_file = files.get(L("trajectory"))
        if ckpt is not None and entry.resumable:
            prepare_checkpoint_dir(ckpt, run.resume, run.restart or (output.force and own_checkpoint))
    return PruneRequest(
        source=source,
        recipe=book,
        sources=sources,
        data_options=data_options,
        output=output,
        trajectory=trajectory,
        run=run,
        layerwise=layerwise,
        schedule=schedule,
        stages=stages,
        config=config,
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
        recipe_given=recipe_given,
        through=through,
    )


@dataclass
class _StageView:
    """What a stage's :meth:`~headcut.jobs.prune.stages.PruneStage.check` reads of a request being checked: its data,
    its method's name and kind (``score``, ``learned``, ...), its config, whether it runs in rounds, and every
    stage's options."""

    sources: DataSources
    method: str = ""
    method_kind: str = ""
    #: the request's budget and cut settings, whether it runs in rounds, and every stage's options by name
    config: Any = None
    scheduled: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def check_fields_of(obj: Any, name: str) -> None:
    """The declaration's check of one field (its message where it has always been given)."""
    from ...options import check_fields

    check_fields(obj, (name,))
