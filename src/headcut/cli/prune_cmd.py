"""``headcut prune``: choose heads with a pruning method, remove them, save the slimmed model with its
report (``headcut-report.json`` inside it, written in the same atomic save).

The method's own options are not written here: :class:`MethodCommand` reads them from the method's options
dataclass (its registry entry names it, :mod:`headcut.options` reads it without importing the method), so
``--help``, completion and parsing of ``headcut prune --method NAME`` offer exactly that method's flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..catalog import METHODS
from ..config import LayerwiseConfig, PruneConfig, RecipeChoice, RecoveryConfig, TrajectoryOptions
from ..config.run import DataSources, ModelSource, OutputSettings, RunSettings
from ..data.config import DataConfig
from ..errors import HeadcutError
from ..files.plan import plan_outputs
from ..options import specs, static_specs
from ..outputs.reports import PRUNE_REPORT
from ..recipes.files import RECIPE_FILE
from ..recipes.recipe import BUDGET_FIELDS, CUT_FIELDS, RECOVER_FIELDS
from .app import app
from .declared import (
    click_params,
    data_options_for_api,
    data_spec,
    data_values,
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
        "training": "Trains on --data (labelled training data), keeps a resume checkpoint in OUT.headcut-checkpoint/ "
        "(--resume continues an interrupted run) and runs under accelerate launch / torchrun.",
        "calibration": "Scores on --data (calibration data).",
        "none": "Reads no data.",
    }[entry.data]
    return "\n\n".join(
        [
            f"Prune MODEL with {name}: {entry.summary} [{entry.citation}]. The slimmed model goes to --out with "
            f"{PRUNE_REPORT} inside it.",
            f"{data} headcut methods {name} describes it; headcut prune --help lists every method.",
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
    """``headcut prune``: its common options, plus the options of the method ``--method`` names (parsed,
    shown in ``--help`` and completed), plus every other method's options hidden, so that one given to the
    wrong method reaches the library's refusal ("--lambda does not apply to gnorm (its options: ...)")."""

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
        shown = spec_parameters(static_specs(METHODS[chosen].options), skip=tuple(common)) if chosen else []
        names = {p.name for p in shown} | common
        hidden: list[Any] = []
        for entry in () if ctx.resilient_parsing else METHODS.values():  # completion needs none of them
            for p in spec_parameters(static_specs(entry.options), hidden=True, skip=tuple(names)):
                hidden.append(p)
                names.add(p.name)
        params = click_params(shown) + click_params(hidden)
        ctx.meta["headcut.method_params"] = params
        return params

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        at = len(params) - 1 if params and params[-1].name == "help" else len(params)
        return params[:at] + self._method_params(ctx) + params[at:]

    def invoke(self, ctx: Any) -> Any:
        names = [p.name for p in self._method_params(ctx)]
        ctx.meta[GIVEN] = {n: ctx.params.pop(n) for n in names if n in ctx.params and ctx.params[n] is not None}
        for n in names:
            ctx.params.pop(n, None)
        return super().invoke(ctx)


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
@with_specs(PruneConfig, "budget")
@with_specs(RecipeChoice, "recipe_choice")
@with_specs(LayerwiseConfig, "layerwise_options")
@with_specs(RecoveryConfig, "recovery")
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
    recovery: dict | None = None,
    layerwise_options: dict | None = None,
    budget: dict | None = None,
    data_options: dict | None = None,
) -> None:
    """Prune heads (see PRUNE_HELP)."""
    log = Out(reporting.json_out, reporting.quiet)  # first: the log's 30 s clock starts with the command
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api

    options: dict[str, Any] = dict(ctx.meta.get(GIVEN, {}))
    budget, recovery, layerwise_options = budget or {}, recovery or {}, layerwise_options or {}
    data_options = data_options or {}
    trajectory = TrajectoryOptions(**(traced or {})).trajectory
    data, eval_data, eval_split = sources.data, sources.eval_data, sources.eval_split
    out = Path(output.out) if output.out is not None else None
    force, seed, json_out = output.force, run.seed, reporting.json_out
    given = {  # the report's arguments, in the order it has always listed them
        "model": model,
        "method": method,
        "recipe": (recipe_choice or {}).get("recipe"),
        "data": data,
        "eval_data": eval_data,
        "eval_split": eval_split,
        "out": out,
        "formats": output.formats,
        "gguf_type": output.gguf_type,
        "trajectory": trajectory,
        "force": force,
        "seed": seed,
        "resume": run.resume,
        "device": run.device,
        "json_out": json_out,
        "task": source.task,
        "quiet": reporting.quiet,
        "allow_pickle": source.allow_pickle,
        "trust_remote_code": source.trust_remote_code,
        **data_values(data_options),
    }
    arguments = _arguments(
        {
            **_after_out(given, _declared(RecoveryConfig, recovery), _declared(LayerwiseConfig, layerwise_options)),
            **budget,
            **options,
        }
    )
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the pruned model in")
    recipe = (recipe_choice or {}).get("recipe")
    book = None
    if method is None or recipe is not None:
        if method is not None:
            raise HeadcutError("give --method (the method alone, with its paper's defaults) or --recipe, not both")
        book = api.recipe_for(
            model,
            recipe,
            task=source.task,
            allow_pickle=source.allow_pickle,
            trust_remote_code=source.trust_remote_code,
        )
        seed_given = ctx.params.get("seed") is not None  # a declared flag not given is None
        book, budget, recovery = _on_recipe(book, budget, recovery, options, seed if seed_given else None)
        from ..jobs.prune import recipe_data

        data_options = recipe_data(
            book, data_options, model, source.task, source.allow_pickle, source.trust_remote_code
        )[0]
        options, seed = {}, book.seed if book.seed is not None else seed
    entry = METHODS.get(book.method if book is not None else str(method))
    use_data = data is not None and (entry is None or entry.data != "none")
    data_cfg = data_spec(data, data_options, seed) if use_data else data
    eval_cfg = data_spec(eval_data, data_options, seed, split=eval_split) if eval_data is not None else None
    try:
        reads = {  # every input: --json never writes over one, --out never holds one
            "MODEL": model,
            "--data": data,
            "--eval-data": eval_data,
            "--recover-data": recovery.get("recover_data"),
            "--recipe": book.source if book is not None else None,
        }
        plan_outputs(reads=reads, files={"--json": json_out}, out=out, force=force)  # --json vs --out
        pruned = api.prune(
            model,
            method,
            recipe=book,
            data=data_cfg,
            eval_data=eval_cfg,
            seed=seed,
            trajectory=trajectory or False,
            task=source.task,
            split=data_values(data_options)["split"],
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
            **recovery,
            **layerwise_options,
            **budget,
            **options,
        )
    finally:
        log.close()
    if not pruned.report.get("out"):
        return  # a data-parallel run's other processes save nothing
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .render.prune import prune_summary

    for item in prune_summary(pruned.report, pruned.result, PRUNE_REPORT):
        log.show(item)
    if book is not None:
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


def _on_recipe(
    book: Any,
    budget: dict[str, Any],
    recovery: dict[str, Any],
    options: dict[str, Any],
    seed: int | None,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The recipe with the flags given on top (each flag given changes its option, also to the flag's default),
    and what is left for ``prune``'s keywords: the flags no recipe holds (``--via``, ``--via-steps``,
    ``--recover-data``); ``seed``: ``--seed`` if given."""
    book = book.changed(
        method_options=options,
        cut={k: v for k, v in budget.items() if k in CUT_FIELDS},
        refit=bool(recovery.get("refit")),
        recover={k: v for k, v in recovery.items() if k in RECOVER_FIELDS},
        budget={k: v for k, v in budget.items() if k in BUDGET_FIELDS} or None,
        seed=seed,
    )
    left_budget = {k: v for k, v in budget.items() if k not in CUT_FIELDS + BUDGET_FIELDS}
    left_recovery = {k: v for k, v in recovery.items() if k not in RECOVER_FIELDS and k != "refit"}
    return book, left_budget, left_recovery


def _recipe_line(book: Any) -> str:
    """One line of what a recipe ran (after the summary)."""
    parts = [book.method + "".join(f" {k}={v}" for k, v in book.method_options.items())]
    parts += [f"{k}={v}" for k, v in book.cut.items()]
    parts += ["refit"] if book.refit else []
    recover = book.recover
    if recover.get("recover_steps"):
        parts.append("recovery " + ", ".join(f"{k.removeprefix('recover_')}={v}" for k, v in recover.items()))
    if book.data:
        parts.append(", ".join(f"{k}={v}" for k, v in book.data.items()))
    if book.schedule:
        parts.append(f"{len(book.schedule)} schedule case(s) (headcut recipes {book.name})")
    return "; ".join(parts)


def _declared(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """Every declared option of ``cls`` (:func:`headcut.options.specs`): the value given, else its default."""

    return {spec.name: given.get(spec.name, spec.default) for spec in specs(cls)}


def _after_out(values: dict[str, Any], *groups: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``groups`` after its ``out``: where the report's arguments have always listed them."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        out[key] = value
        if key == "out":
            for group in groups:
                out.update(group)
    return out


def _arguments(values: dict[str, Any]) -> dict[str, Any]:
    """The command's arguments as the report records them (flag names as parameters)."""
    out: dict[str, Any] = {}
    renamed = {"teacher": "distill_from", "formats": "output_format"}  # the names reports have always used
    for key, value in ((renamed.get(k, k), v) for k, v in values.items()):
        if isinstance(value, Path):
            out[key] = str(value)
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
    return out
