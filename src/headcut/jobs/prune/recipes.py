"""Which recipe a prune runs and what it resolved to: :func:`recipe_for` (a name, a file, or the default recipe of
the model's kind), :func:`method_recipe` (a method alone: its stages choose and cut), :func:`check_recipe` (every
value in it checked as its flag is) and :func:`resolved_recipe` (the run as a recipe of whole numbers: the report's
``recipe``, which replays it)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ...arguments.table import check
from ...catalog import METHODS, STAGES
from ...config import PruneConfig
from ...config.prune import Budget, check_budget_rules
from ...data import DataConfig
from ...data.tasks import max_positions
from ...errors import HeadcutError, HeadcutValueError, label
from ...model.loading import class_task, open_checkpoint
from ...options import specs
from ...pruning import get_method, make_options
from ...pruning.schedule import Round
from ...recipes import Case, Recipe, RoundPlan, Stage, builtin_recipes, default_recipe, read_recipe
from ...recipes.recipe import BUDGET_FIELDS, DATA_FIELDS
from .stages.base import PruneStage

#: the recipe name that means the default recipe of the model's kind
DEFAULT = "default"


def _opened(model: Any, task: str | None, allow_pickle: bool, trust_remote_code: bool) -> tuple[Any, type]:
    """The config and the class of ``model`` (a checkpoint: its config read, no weights; or a loaded module)."""
    if isinstance(model, (str, os.PathLike)):
        found = open_checkpoint(os.fspath(model), task, allow_pickle, trust_remote_code)
        return found[2], found[3]
    return getattr(model, "config", None), type(model)


def model_task(
    model: Any, task: str | None = None, allow_pickle: bool = False, trust_remote_code: bool = False
) -> str | None:
    """The transformers task of ``model`` (a checkpoint or a loaded module) as ``prune`` would load it:
    ``task`` when given, else its class's (:func:`headcut.model.loading.class_task`; the checkpoint's config is
    read, no weights)."""
    if task is not None:
        return task
    return class_task(_opened(model, task, allow_pickle, trust_remote_code)[1])


def recipe_data(
    recipe: Recipe,
    given: Mapping[str, Any] | None,
    model: Any,
    task: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> tuple[dict[str, Any], str | None]:
    """The data options a run of ``recipe`` reads: the recipe's, with those ``given`` on top; a recipe's
    ``seq_len`` (not one given) longer than the model reads is read at the model's positions, with a note saying
    so (a recipe measured with long blocks runs on a model of a shorter context)."""
    data = {**recipe.data, **(given or {})}
    wanted = recipe.data.get("seq_len")
    if wanted is None:
        return data, None
    limit = max_positions(_opened(model, task, allow_pickle, trust_remote_code)[0])
    if limit is None or wanted <= limit:
        return data, None
    if "seq_len" not in (given or {}):
        data["seq_len"] = limit
    if data["seq_len"] > limit:
        return data, None  # given longer than the model reads: the data check refuses it
    return data, (
        f"recipe {recipe.name} reads blocks of {wanted} tokens, more than this model's {limit} positions: "
        f"read in blocks of {data['seq_len']}"
    )


def recipe_for(
    model: Any,
    recipe: str | os.PathLike[str] | Recipe | Mapping[str, Any] | None = None,
    *,
    task: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> Recipe:
    """The recipe a prune of ``model`` runs: ``recipe`` (a built-in name, a file, a mapping or a
    :class:`~headcut.recipes.Recipe`), or, with None or ``"default"``, the default recipe of the model's kind
    (refused, with what to do instead, for a kind no measured recipe covers)."""
    if recipe is not None and recipe != DEFAULT:
        return check_recipe(read_recipe(recipe))
    kind = model_task(model, task, allow_pickle, trust_remote_code)
    found = default_recipe(kind) if kind is not None else None
    if found is not None:
        return check_recipe(found)
    covered = ", ".join(f"{r.default_for} ({r.name})" for r in builtin_recipes().values() if r.default_for)
    raise HeadcutValueError(
        f"no default recipe for a {kind or 'base'} model: no recipe has been measured on such models. Give the "
        f"method to run (method, e.g. fluctuation) or a recipe (recipe NAME or FILE); the default recipes: "
        f"{covered or 'none'}"
    )


def method_recipe(method: str) -> Recipe:
    """``method`` alone, with its paper's defaults: a recipe of the stages choose and cut (a flag or keyword of
    another stage adds that stage)."""
    return Recipe(
        name=method,
        stages=(Stage("choose", {"method": method}), Stage("cut", {})),
        about=f"the method {method} alone, with its options",
    )


def check_recipe(recipe: Recipe) -> Recipe:
    """``recipe`` (returned as it is) once every value in it passed the checks ``prune``'s keywords of the same
    names pass (:func:`headcut.arguments.table.check`: the kind of each, integers of 64 bits; the declarations'
    choices and ranges; the method's options by the method, :func:`headcut.pruning.make_options`; the budget's
    combinations, :func:`headcut.config.prune.check_budget_rules`, and the method's own), so that a recipe file
    takes exactly the values the flags take: what ``headcut prune --recipe`` and ``headcut recipes`` make of a
    file, before anything is built. The refusal names the recipe and its key (the Python keyword, as the file
    writes it)."""
    where = f"recipe {recipe.name}" + (f" ({recipe.source})" if recipe.source else "")
    stage_values = {k: v for s in recipe.stages if s.name != "choose" for k, v in s.options.items()}
    given: dict[str, Any] = {
        "method": recipe.method,
        **stage_values,
        **recipe.budget,
        "data_options": dict(recipe.data),
        "options": recipe.method_options,
    }
    if recipe.seed is not None:
        given["seed"] = recipe.seed
    try:
        check("prune", given)
        for case in recipe.schedule:
            for plan in case.rounds:
                check("prune", {**({"keep": plan.keep} if isinstance(plan.keep, int) else {}), **plan.options})
        method = get_method(recipe.method)
        options = make_options(method, dict(recipe.method_options))
        if recipe.budget:
            budget = Budget(**recipe.budget)
            check_budget_rules(budget, METHODS[recipe.method])
            config = PruneConfig(method=recipe.method, **recipe.options_of("cut"), **recipe.budget)
            config.validate()
            method.check(config, options)
    except HeadcutError as exc:
        raise HeadcutValueError(f"{where}: {exc}") from None
    return recipe


def resolved_recipe(
    source: Recipe,
    stages: Sequence[PruneStage],
    config: PruneConfig,
    data_spec: Any,
    data_options: Mapping[str, Any] | None,
    rounds: Sequence[Round],
    scheduled: bool = False,
) -> Recipe:
    """The run as a recipe: each stage that ran with every one of its options (the method's too), the data
    options, the budget, the seed and the schedule (``source``: the recipe the run started from, whose name,
    description and schedule it keeps, which gives the same rounds for the same budget and its own rounds for
    another; ``scheduled``: ``via``'s or ``rounds``' rounds instead, in whole heads, each with the options of the
    stages after the cut).
    Read back (:func:`headcut.recipes.read_recipe`) it replays the run: the same heads and the same weights, given
    the same model and data."""
    ran = [s for s in stages if any(s.in_round(r.options).active() for r in rounds)]
    if isinstance(data_spec, DataConfig):
        data = {k: getattr(data_spec, k) for k in DATA_FIELDS}
    else:  # no data read: the options a run would read it with (the declared defaults where none is given)
        defaults = {s.name: s.default for s in specs(DataConfig) if s.meta.recipe and s.meta.cli}
        data = {k: v for k, v in {**defaults, **(data_options or {})}.items() if k in DATA_FIELDS and v is not None}
    plan: tuple[Case, ...] = ()
    if scheduled and len(rounds) > 1:  # via's or the schedule flag's rounds
        after_cut = [s for s in ran if "cut" in STAGES[s.kind].after and s.kind != "cut"]
        plan = (
            Case(
                tuple(
                    RoundPlan(
                        None if i == len(rounds) - 1 else r.config.keep,
                        {k: v for s in after_cut for k, v in s.in_round(r.options).options().items()},
                    )
                    for i, r in enumerate(rounds)
                )
            ),
        )
    elif not scheduled:  # the recipe's schedule: the same rounds for the same budget
        plan = source.schedule
    return Recipe(
        name=source.name,
        stages=tuple(Stage(s.kind, s.options()) for s in ran),
        about=source.about,
        data=data,
        budget={k: getattr(config, k) for k in BUDGET_FIELDS if getattr(config, k) is not None},
        seed=config.seed,
        schedule=plan,
    )


def check_recipe_run(recipe: Recipe, compensated: bool, data: Any) -> None:
    """A recipe's refusals before the keywords' own: the data it reads (``data``: ``prune``'s; a recipe reads data
    when its method does, or a stage after the cut runs), and FLAP's bias compensation with a schedule of rounds
    (it compensates a one-round cut)."""
    entry = METHODS[recipe.method]
    recovers = bool(recipe.options_of("recover").get("recover_steps"))
    if data is None and (recipe.stage("refit") is not None or recovers or entry.data != "none"):
        what = "training data with labels" if recovers or entry.data == "training" else "data"
        raise HeadcutValueError(f"recipe {recipe.name} reads {what}: give it as {label('data')}")
    if recipe.rounds_vary and compensated:
        raise HeadcutValueError(
            f"recipe {recipe.name} cuts some budgets in rounds; bias_compensation compensates a one-round cut: "
            "give a recipe of one round"
        )
