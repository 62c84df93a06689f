"""Which recipe a prune runs and what it resolved to: :func:`recipe_for` (a name, a file, or the default recipe of
the model's kind), :func:`keyword_changes` (``prune``'s keywords given on top of it) and :func:`resolved_recipe`
(the run as a recipe of whole numbers: the report's ``recipe``, which replays it)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import is_dataclass
from typing import Any

from ...arguments.table import check
from ...catalog import METHODS
from ...config import PruneConfig, RecoveryConfig
from ...data import DataConfig
from ...data.tasks import max_positions
from ...errors import HeadcutError, HeadcutValueError, label
from ...model.loading import class_task, open_checkpoint
from ...options import specs
from ...pruning import get_method, make_options
from ...pruning.schedule import Round
from ...recipes import Case, Recipe, RoundPlan, Stage, builtin_recipes, default_recipe, read_recipe
from ...recipes.recipe import BUDGET_FIELDS, CUT_FIELDS, DATA_FIELDS, RECOVER_FIELDS

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


def check_recipe(recipe: Recipe) -> Recipe:
    """``recipe`` (returned as it is) once every value in it passed the checks ``prune``'s keywords of the same
    names pass (:func:`headcut.arguments.table.check`: the kind of each, integers of 64 bits; the declarations'
    choices and ranges; the method's options by the method, :func:`headcut.pruning.make_options`; the budget's
    combinations, :meth:`headcut.config.PruneConfig.validate`), so that a recipe file takes exactly the values the
    flags take: what ``headcut prune --recipe`` and ``headcut recipes`` make of a file, before anything is built.
    The refusal names the recipe and its key (the Python keyword, as the file writes it)."""
    where = f"recipe {recipe.name}" + (f" ({recipe.source})" if recipe.source else "")
    given: dict[str, Any] = {
        "method": recipe.method,
        **recipe.cut,
        **recipe.budget,
        **recipe.recover,
        "data_options": dict(recipe.data),
        "options": recipe.method_options,
    }
    if recipe.seed is not None:
        given["seed"] = recipe.seed
    try:
        check("prune", given)
        for case in recipe.schedule:
            for plan in case.rounds:
                check("prune", {**({"keep": plan.keep} if isinstance(plan.keep, int) else {}), **plan.recovery})
        method = get_method(recipe.method)
        options = make_options(method, dict(recipe.method_options))
        if recipe.budget:
            config = PruneConfig(method=recipe.method, **recipe.cut, **recipe.budget)
            config.validate()
            method.check(config, options)
    except HeadcutError as exc:
        raise HeadcutValueError(f"{where}: {exc}") from None
    return recipe


def keyword_changes(values: Mapping[str, Any]) -> dict[str, Any]:
    """:meth:`Recipe.changed`'s keywords from ``prune``'s ``values``: every recipe option given a value other than
    its declared default (a budget given replaces the recipe's; ``refit`` True adds the refit stage)."""
    prune_defaults = {s.name: s.default for s in specs(PruneConfig)}
    recovery_defaults = {s.name: s.default for s in specs(RecoveryConfig)}
    budget = {k: values[k] for k in BUDGET_FIELDS if values.get(k) is not None}
    return {
        "cut": {k: values[k] for k in CUT_FIELDS if k in values and values[k] != prune_defaults[k]},
        "recover": {k: values[k] for k in RECOVER_FIELDS if k in values and values[k] != recovery_defaults[k]},
        "refit": bool(values.get("refit")),
        "budget": budget or None,
        "seed": values["seed"] if values.get("seed") else None,
    }


def resolved_recipe(
    source: Recipe | None,
    options: Any,
    config: PruneConfig,
    recovery: RecoveryConfig,
    data_spec: Any,
    data_options: Mapping[str, Any] | None,
    rounds: Sequence[Round],
) -> Recipe:
    """The run as a recipe: the method and every one of its options, the cut's, refit and the recovery's
    options as they ran, the data options, the budget, the seed and the schedule (``source``: the recipe the run
    started from, whose name, description and schedule it keeps, which gives the same rounds for the same budget
    and its own rounds for another; ``via``'s two rounds in whole heads; None: ``method`` alone). Read back
    (:func:`headcut.recipes.read_recipe`) it replays the run: the same heads and the same weights, given the same
    model and data."""
    method_values = (
        {s.name: getattr(options, s.name) for s in specs(type(options))}
        if is_dataclass(options) and not isinstance(options, type)
        else {}
    )
    stages = [
        Stage("choose", {"method": config.method, **method_values}),
        Stage("cut", {k: getattr(config, k) for k in CUT_FIELDS}),
    ]
    if recovery.refit:
        stages.append(Stage("refit"))
    recovers = any(r.recover_steps for r in rounds) or bool(recovery.recover_steps)
    if recovers:
        stages.append(Stage("recover", {k: getattr(recovery, k) for k in RECOVER_FIELDS}))
    if isinstance(data_spec, DataConfig):
        data = {k: getattr(data_spec, k) for k in DATA_FIELDS}
    else:
        data = {k: v for k, v in (data_options or {}).items() if k in DATA_FIELDS}
    plan: tuple[Case, ...] = ()
    if source is not None and config.via is None:  # the recipe's schedule: the same rounds for the same budget
        plan = source.schedule
    elif len(rounds) > 1:  # via's two rounds
        plan = (
            Case(
                tuple(
                    RoundPlan(
                        None if i == len(rounds) - 1 else r.config.keep,
                        {k: getattr(r.recovery, k) for k in RECOVER_FIELDS} if recovers else {},
                    )
                    for i, r in enumerate(rounds)
                )
            ),
        )
    return Recipe(
        name=source.name if source is not None else config.method,
        stages=tuple(stages),
        about=source.about if source is not None else f"the method {config.method} alone, with its options",
        data=data,
        budget={k: getattr(config, k) for k in BUDGET_FIELDS if getattr(config, k) is not None},
        seed=config.seed,
        schedule=plan,
    )


def check_recipe_run(recipe: Recipe, method_options: Mapping[str, Any], data: Any) -> None:
    """A recipe's refusals before the keywords' own: the data it reads (``data``: ``prune``'s), and FLAP's bias
    compensation with a schedule of rounds (it compensates a one-round cut)."""
    entry = METHODS[recipe.method]
    if data is None and (recipe.refit or recipe.recover.get("recover_steps") or entry.data != "none"):
        what = (
            "training data with labels" if recipe.recover.get("recover_steps") or entry.data == "training" else "data"
        )
        raise HeadcutValueError(f"recipe {recipe.name} reads {what}: give it as {label('data')}")
    if recipe.rounds_vary and method_options.get("bias_compensation"):
        raise HeadcutValueError(
            f"recipe {recipe.name} cuts some budgets in rounds; bias_compensation compensates a one-round cut: "
            "give a recipe of one round"
        )
