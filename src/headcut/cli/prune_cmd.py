"""``headcut prune``: choose heads with a pruning method, remove them, save the slimmed model with its
report (``headcut-report.json`` inside it, written in the same atomic save).

The method's own options are not written here: :class:`MethodCommand` reads them from the method's options
dataclass (its registry entry names it, :mod:`headcut.options` reads it without importing the method), so
``--help``, completion and parsing of ``headcut prune --method NAME`` offer exactly that method's flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..catalog import METHODS, STAGES
from ..config import Budget, LayerwiseConfig, PruneConfig, RecipeChoice, ScheduleOptions, TrajectoryOptions
from ..config.run import DataSources, ModelSource, OutputSettings, RunSettings
from ..data.config import DataConfig
from ..errors import HeadcutError
from ..files.plan import plan_outputs
from ..options import specs, static_specs
from ..outputs.reports import PRUNE_REPORT
from ..recipes.files import RECIPE_FILE, recipe_path
from ..recipes.recipe import stage_options
from .app import app
from .declared import (
    click_params,
    data_values,
    report_arguments,
    spec_parameters,
    with_settings,
    with_specs,
)
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting
from .params import MethodOpt, ModelArg

#: where the parsed method options wait for the command (``ctx.meta``)
GIVEN = "headcut.method_options"

PRUNE_HELP = "\n\n".join(
    [
        "Remove attention heads of MODEL (with the default recipe of its kind, a recipe, or one method) and save the "
        f"slimmed model to --out, with {PRUNE_REPORT} inside it (the mask, heads, parameters, sizes, metric "
        "before/after).",
        "Without --method, a recipe runs: --recipe NAME|FILE, by default the default recipe of the model's kind "
        "(a classifier: encoder; a causal LM: decoder; headcut recipes lists the recipes and the measurements "
        "behind them); the flags given change its options "
        f"and --via its rounds. The recipe that ran is saved beside the report ({RECIPE_FILE}): --recipe OUT replays "
        "it.",
        f"--method M runs the paper's method alone, with its defaults. Methods: {', '.join(METHODS)}. headcut methods "
        "lists them with their papers; headcut methods NAME describes one; headcut prune --method NAME --help shows "
        "its own options.",
        "Budget: --keep K heads, or --sparsity S (K = floor((1 - S) x heads)), met exactly in whole units "
        "(layers sharing weights lose a head together; --gqa group/auto removes whole KV groups) or refused "
        "with the nearest valid budgets; or --max-drop D (score-based methods): remove heads step by step while the "
        "--eval-data metric stays within D of the unpruned model (absolute, in the metric's units), --keep/--sparsity "
        "then being a floor. --data and --eval-data must differ.",
    ]
)


def _method_help(name: str) -> str:
    entry = METHODS[name]
    data = {
        "training": "Trains on --data (labelled), resumable (--resume), under accelerate launch / torchrun too.",
        "calibration": "Scores on --data (calibration data).",
        "none": "Reads no data.",
    }[entry.data]
    return "\n\n".join(
        [
            f"Prune MODEL with {name}: {entry.summary}. The slimmed model goes to --out with {PRUNE_REPORT} inside it.",
            f"{data} headcut methods {name} cites its paper; headcut prune --help lists every method.",
        ]
    )


def _peek(args: list[str]) -> str | None:
    """The ``--method`` value on a command line (before it is parsed)."""
    for i, arg in enumerate(args):
        if arg == "--method" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--method="):
            return arg.partition("=")[2]
    return None


class MethodCommand(TidyCommand):
    """``headcut prune``: its common options; the options of every kind of stage (:data:`headcut.catalog.STAGES`,
    a kind registered at run time too); the options of the method ``--method`` names (parsed, shown in ``--help``
    and completed), plus every other method's options hidden, so that one given to the wrong method reaches the
    library's refusal ("--lambda does not apply to gnorm (its options: ...)"); and with ``--method``, the options
    declared for another kind of method (``methods="score"``) hidden from its ``--help`` (still parsed: the
    library refuses them with the reason)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        name = _peek(args)
        ctx.meta["headcut.method"] = name if name in METHODS else None
        if name in METHODS:
            self.help = _method_help(name)
            entry = METHODS[name]
            data = {"none": "", "calibration": " --data cal.csv", "training": " --data train.csv"}[entry.data]
            budget = " --keep 16" if entry.budget == "required" else ""
            self.epilog = examples(
                f"headcut prune model/ --method {name}{budget}{data} --eval-data dev.csv --out slim/"
            )
        return super().parse_args(ctx, args)

    def _method_params(self, ctx: Any) -> list[Any]:
        cached = ctx.meta.get("headcut.method_params")
        if cached is not None:
            return cached
        common = {p.name for p in super().get_params(ctx)}
        chosen = ctx.meta.get("headcut.method")
        staged = [spec for kind in STAGES if kind != "choose" for spec in stage_options(kind)]
        stage_params = spec_parameters(staged, skip=tuple(common))
        names = {p.name for p in stage_params} | common
        shown = spec_parameters(static_specs(METHODS[chosen].options), skip=tuple(names)) if chosen else []
        names |= {p.name for p in shown}
        hidden: list[Any] = []
        for entry in () if ctx.resilient_parsing else METHODS.values():  # completion needs none of them
            for p in spec_parameters(static_specs(entry.options), hidden=True, skip=tuple(names)):
                hidden.append(p)
                names.add(p.name)
        params = click_params(stage_params) + click_params(shown) + click_params(hidden)
        ctx.meta["headcut.method_params"] = params
        return params

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx) + self._method_params(ctx)
        chosen = ctx.meta.get("headcut.method")
        if chosen is not None:  # the options of another kind of method: parsed, not listed
            scope = _method_scope()
            kind = METHODS[chosen].kind
            # and --recipe, which --method replaces
            params = [_hidden(p) if scope.get(p.name) not in (None, kind) or p.name == "recipe" else p for p in params]
            if ctx.meta.get("headcut.help"):  # the flags every command shares: listed by name (format_help)
                shared = _shared_names()
                ctx.meta["headcut.shared"] = [p.opts[0] for p in params if p.name in shared and not p.hidden]
                params = [_hidden(p) if p.name in shared else p for p in params]
        at = next((i for i, p in enumerate(params) if p.name == "help"), len(params))
        return params[:at] + params[at + 1 :] + params[at : at + 1]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        ctx.meta["headcut.help"] = True
        self.get_params(ctx)  # which flags are listed by name only (ctx.meta)
        shared = ctx.meta.get("headcut.shared")
        if shared:
            self.epilog = (
                f"Also the options every command shares (headcut prune --help): {', '.join(shared)}."
                + "\n\n"
                + (self.epilog or "")
            )
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Any) -> Any:
        names = [p.name for p in self._method_params(ctx)]
        ctx.meta[GIVEN] = {n: ctx.params.pop(n) for n in names if n in ctx.params and ctx.params[n] is not None}
        for n in names:
            ctx.params.pop(n, None)
        return super().invoke(ctx)


def _method_scope() -> dict[str, str]:
    """Option name -> the kind of method it applies to, for the options that say (``methods``)."""
    names = ("Budget", "ScheduleOptions", "LayerwiseConfig")
    declared = [spec for name in names for spec in static_specs(f"headcut.config.prune:{name}")]
    declared += [spec for kind in STAGES if kind != "choose" for spec in stage_options(kind)]
    return {spec.name: spec.meta.methods for spec in declared if spec.meta.methods}


def _shared_names() -> set[str]:
    """The options of reading data and the model, writing and reporting, shared by every command: a method's
    ``--help`` lists them by name only (its options described in full)."""
    shared = [*specs(DataConfig), *specs(ModelSource), *specs(Reporting), *specs(OutputSettings)]
    shared += [s for s in specs(DataSources) if s.name == "eval_split"]
    shared += [s for s in specs(RunSettings) if s.name == "seed"]
    return {s.name for s in shared} - {"out"}


def _hidden(param: Any) -> Any:
    """``param`` not listed in ``--help`` (a copy: the command's own stays as it is)."""
    import copy

    hidden = copy.copy(param)
    hidden.hidden = True
    return hidden


@app.command(
    cls=MethodCommand,
    name="prune",
    help=PRUNE_HELP,
    epilog=examples(
        "headcut prune model/ --keep 16 --data train.csv --eval-data dev.csv --out slim/   # the default recipe",
        "headcut prune model/ --keep 16 --data train.csv --out slim2/ --recipe slim/   # replay slim/'s recipe",
        "headcut prune llm/ --keep 180 --data corpus.txt --out slim-llm/   # a causal LM: the decoder recipe",
        "headcut prune model/ --method pass --keep 16 --data train.csv --eval-data dev.csv --out slim/",
        "headcut prune model/ --method greedy-gnorm --keep 48 --data cal.csv --eval-data dev.csv --out slim/",
        "headcut prune model/ --method michel --max-drop 0.01 --data cal.csv --eval-data dev.csv --out slim/ "
        "--trajectory curve.csv",
        "headcut prune model/ --method auber --data train.csv --eval-data dev.csv --out slim/   # small data",
        "headcut prune model/ --method pass --help   # pass's own options",
    ),
)
@handle_errors
@with_specs(DataConfig, "data_options")
@with_specs(Budget, "budget")
@with_specs(ScheduleOptions, "schedule")
@with_specs(RecipeChoice, "recipe_choice")
@with_specs(LayerwiseConfig, "layerwise_options")
@with_specs(TrajectoryOptions, "traced")
@with_settings(DataSources, "sources")
@with_settings(OutputSettings, "output")
@with_settings(RunSettings, "run")
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def prune_cmd(
    ctx: typer.Context,
    model: ModelArg,
    method: MethodOpt = None,
    recipe_choice: dict | None = None,
    sources: DataSources = DataSources(),
    output: OutputSettings = OutputSettings(),
    traced: dict | None = None,
    run: RunSettings = RunSettings(),
    reporting: Reporting = Reporting(),
    source: ModelSource = ModelSource(),
    layerwise_options: dict | None = None,
    budget: dict | None = None,
    schedule: dict | None = None,
    data_options: dict | None = None,
) -> None:
    """Prune heads (see PRUNE_HELP): the request made of the flags given (every one changes its option, also to
    its default), run, and its summary."""
    log = Out(reporting.json_out, reporting.quiet)  # first: the log's 30 s clock starts with the command
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from ..jobs.prune.job import run_request
    from ..jobs.prune.request import prune_request

    options: dict[str, Any] = dict(ctx.meta.get(GIVEN, {}))  # the stages' and the method's options given
    budget, schedule, layerwise_options = budget or {}, schedule or {}, layerwise_options or {}
    trajectory = TrajectoryOptions(**(traced or {})).trajectory
    data, eval_data, eval_split = sources.data, sources.eval_data, sources.eval_split
    out = Path(output.out) if output.out is not None else None
    force, json_out = output.force, reporting.json_out
    recipe = (recipe_choice or {}).get("recipe")
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the pruned model in")
    reads = {  # every input: --json never writes over one, --out never holds one
        "MODEL": model,
        "--data": data,
        "--eval-data": eval_data,
        "--recover-data": sources.recover_data,
        "--recipe": recipe_path(recipe) if recipe is not None else None,
    }
    seed_given = ctx.params.get("seed") is not None  # a declared flag not given is None
    try:
        plan_outputs(reads=reads, files={"--json": json_out}, out=out, force=force)  # --json vs --out
        given_flags = {**options, **schedule, "recover_data": sources.recover_data}
        recovery = {n: default if given_flags.get(n) is None else given_flags[n] for n, default in RECOVERY_ARGUMENTS}
        flags = {
            "model": model,
            "method": method,
            "recipe": recipe,
            "data": data,
            "eval_data": eval_data,
            "eval_split": eval_split,
            "out": out,
            **recovery,
            "layerwise": layerwise_options.get("layerwise", False),
            "max_memory": layerwise_options.get("max_memory"),
            "formats": output.formats,
            "gguf_type": output.gguf_type,
            "trajectory": trajectory,
            "force": force,
            "seed": run.seed,
            "resume": run.resume,
            "device": run.device,
            "json_out": json_out,
            "task": source.task,
            "quiet": reporting.quiet,
            "allow_pickle": source.allow_pickle,
            "trust_remote_code": source.trust_remote_code,
            **data_values(data_options or {}),
        }
        tail = {k: v for k, v in {**budget, **schedule, **options}.items() if k not in dict(RECOVERY_ARGUMENTS)}
        request, pruned = run_request(
            lambda: prune_request(
                ModelSource(
                    task=source.task,
                    allow_pickle=source.allow_pickle,
                    trust_remote_code=source.trust_remote_code,
                    model=model,
                ),
                method=method,
                recipe=recipe,
                given={**budget, **schedule, **options},
                seed=run.seed if seed_given else None,
                sources=sources,
                data_options={"split": data_values(data_options or {})["split"], **(data_options or {})},
                output=output,
                trajectory=trajectory or False,
                run=RunSettings(
                    seed=run.seed, device=run.device, resume=run.resume, restart=force, progress=log.progress
                ),
                layerwise=LayerwiseConfig(**layerwise_options),
            ),
            _arguments(flags, tail),
        )
    finally:
        log.close()
    if not pruned.report.get("out"):
        return  # a data-parallel run's other processes save nothing
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .render.prune import prune_summary

    for item in prune_summary(pruned.report, pruned.result, PRUNE_REPORT):
        log.show(item)
    if request.recipe_given:
        book = request.recipe
        log.show(f"recipe {book.name}: {_recipe_line(book)}; the run's own: {Path(out) / RECIPE_FILE}")
    if pruned.written:
        log.log.print(
            f"trajectory written to {' and '.join(map(str, pruned.written))}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        if len(pruned.written) == 1:
            log.note("no trajectory PNG: matplotlib is not installed (pip install 'headcut[plots]')")
    log.notes(pruned.report["notes"])
    log.json(pruned.report)


#: the report's ``arguments`` of the recovery, in the order (and with the defaults) reports have always listed them
RECOVERY_ARGUMENTS = (
    ("recover_steps", 0),
    ("refit", False),
    ("recover_data", None),
    ("recover_hidden_weight", 0.0),
    ("recover_average", 0.0),
    ("via_steps", None),
)


def _arguments(flags: dict[str, Any], tail: dict[str, Any]) -> dict[str, Any]:
    """The command's arguments as the report records them (flag names as parameters), in the order reports have
    always listed them: ``flags`` (the command's own; the recovery's and the layer-wise options after ``out``),
    then ``tail``: the budget, cut and schedule flags given in the order of the cut's fields (:class:`PruneConfig`),
    then the method's options given."""
    from dataclasses import fields

    order = [f.name for f in fields(PruneConfig)]
    ranked = sorted(tail, key=lambda k: order.index(k) if k in order else len(order))
    return report_arguments({**flags, **{k: tail[k] for k in ranked}})


def _recipe_line(book: Any) -> str:
    """One line of what a recipe ran (after the summary)."""
    parts = [book.method + "".join(f" {k}={v}" for k, v in book.method_options.items())]
    for kind in ("protect", "allocate"):
        if book.stage(kind) is not None:
            parts.append(" ".join([kind, *(f"{k}={v}" for k, v in book.options_of(kind).items())]))
    parts += [f"{k}={v}" for k, v in book.options_of("cut").items()]
    parts += ["refit"] if book.stage("refit") is not None else []
    for kind in ("merge", "distill"):
        if book.stage(kind) is not None:
            parts.append(", ".join(f"{k}={v}" for k, v in book.options_of(kind).items()))
    recover = book.options_of("recover")
    if recover.get("recover_steps"):
        parts.append("recovery " + ", ".join(f"{k.removeprefix('recover_')}={v}" for k, v in recover.items()))
    if book.data:
        parts.append(", ".join(f"{k}={v}" for k, v in book.data.items()))
    if book.schedule:
        parts.append(f"{len(book.schedule)} schedule case(s) (headcut recipes {book.name})")
    return "; ".join(parts)
