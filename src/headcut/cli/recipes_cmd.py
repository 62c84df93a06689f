"""``headcut recipes [NAME|FILE]``: the built-in recipes (which kind of model each is the default of, what it runs,
the measurements behind it), or one recipe in full: a built-in one, a recipe file, or the recipe a prune saved."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..catalog import STAGES
from ..files.plan import plan_outputs
from ..formatting import visible
from ..recipes import builtin_recipes, read_recipe, recipe_yaml
from ..recipes.files import recipe_path
from ..recipes.recipe import BUDGET, Recipe, recipe_options
from .app import app
from .declared import with_settings
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting


def _complete_recipes(incomplete: str) -> list[str]:
    return [name for name in builtin_recipes() if name.startswith(incomplete)]


def _text(value: Any) -> Any:
    """A value of a recipe as a table cell: its text as it is (no rich markup read in it, every control character
    visible; :func:`headcut.formatting.visible`)."""
    from rich.text import Text

    return Text(visible(str(value)))


def _rounds(recipe: Recipe) -> list[str]:
    """The schedule in words: one line per case."""
    lines = []
    for case in recipe.schedule:
        when = f"a budget under {case.below} of the heads" if case.below is not None else "every budget"
        steps = []
        for r in case.rounds:
            keep = BUDGET if r.keep is None else str(r.keep)
            own = ", ".join(f"{k}={v}" for k, v in r.options.items())
            steps.append(keep + (f" ({own})" if own else ""))
        lines.append(f"{when}: {len(case.rounds)} rounds, to " + " -> ".join(steps))
    return lines or ["one round, to the budget"]


def _measured(recipe: Recipe) -> Any:
    from rich import box
    from rich.table import Table

    keys: list[str] = []
    for row in recipe.measured:
        keys += [k for k in row if k not in keys]
    table = Table(box=box.SIMPLE_HEAD, title=_text(f"measured with {recipe.name}"))
    for key in keys:
        table.add_column(_text(key), overflow="fold")
    for row in recipe.measured:
        table.add_row(*(_text("" if row.get(k) is None else row.get(k)) for k in keys))
    return table


def _stage_kinds() -> Any:
    """The kinds of stage a recipe may list (:data:`headcut.catalog.STAGES`, a kind registered at run time too),
    each with what it runs after and its options (a recipe's keys, headcut prune's flags) with their defaults."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, title="stage kinds (a recipe lists them in order; options: prune's flags)")
    for column in ("stage", "runs after", "options (default)", "what it does"):
        table.add_column(column, overflow="fold")
    for kind, entry in STAGES.items():
        if kind == "choose":
            options = "method, and the method's options (headcut methods NAME)"
        else:
            options = ", ".join(f"{s.name}={s.default}" for s in recipe_options(kind)) or "-"
        table.add_row(_text(kind), _text(", ".join(entry.after) or "-"), _text(options), _text(entry.summary))
    return table


@app.command(
    cls=TidyCommand,
    name="recipes",
    epilog=examples(
        "headcut recipes",
        "headcut recipes encoder",
        "headcut recipes slim/   # the recipe a prune saved (headcut-recipe.yaml)",
        "headcut recipes my-recipe.yaml --json -",
    ),
)
@handle_errors
@with_settings(Reporting, "reporting", skip=("quiet",))
def recipes_cmd(
    name: Annotated[
        str | None,
        typer.Argument(
            help="A recipe to show in full: a built-in name, a recipe .yaml/.json, a pruned folder or its report.",
            metavar="RECIPE",
            autocompletion=_complete_recipes,
        ),
    ] = None,
    reporting: Reporting = Reporting(),
) -> None:
    """List the built-in recipes (the models each is the default of, what it runs, the measurements behind it)
    and the kinds of stage a recipe may list with their options, or show one recipe in full (checked as headcut prune --recipe reads it): its stages with their options, data
    options, schedule of rounds and measurements, then the recipe as YAML."""
    from rich import box
    from rich.table import Table

    log = Out(reporting.json_out)
    # the recipe file is an input: --json never writes over it (nor into the folder it is read from)
    read = recipe_path(name) if name is not None else None
    plan_outputs(reads={"RECIPE": read}, files={"--json": reporting.json_out})
    if name is None:
        found = builtin_recipes()
        table = Table(box=box.SIMPLE_HEAD, title="recipes (headcut recipes NAME for one)")
        for column in ("recipe", "default for", "stages", "rounds", "measured"):
            table.add_column(column, overflow="fold")
        for recipe in found.values():
            stages = ", ".join(s.name if s.name != "choose" else f"choose ({recipe.method})" for s in recipe.stages)
            table.add_row(
                _text(recipe.name),
                recipe.default_for or "-",
                _text(stages),
                _text("; ".join(_rounds(recipe))),
                f"{len(recipe.measured)} run{'s' if len(recipe.measured) != 1 else ''}" if recipe.measured else "-",
            )
        log.show(table)
        log.show(_stage_kinds())
        log.json([r.to_dict() for r in found.values()])
        return
    recipe = read_recipe(name)
    from ..jobs.prune import check_recipe  # torch: only once a recipe is read

    check_recipe(recipe)  # every value checked as headcut prune --recipe checks it
    log.show(visible(f"{recipe.name}: {recipe.about}" if recipe.about else recipe.name))
    if recipe.default_for:
        log.show(f"the default recipe of {recipe.default_for} models (headcut prune MODEL without --method)")
    table = Table(box=box.SIMPLE_HEAD, title="stages, in order (each option: headcut prune's keyword)")
    for column in ("stage", "options"):
        table.add_column(column, overflow="fold")
    for stage in recipe.stages:
        table.add_row(stage.name, _text(", ".join(f"{k}={v}" for k, v in stage.options.items()) or "-"))
    log.show(table)
    for what, values in (("data", recipe.data), ("budget", recipe.budget)):
        if values:
            log.show(visible(f"{what}: " + ", ".join(f"{k}={v}" for k, v in values.items())))
    if recipe.seed is not None:
        log.show(f"seed: {recipe.seed}")
    for line in _rounds(recipe):
        log.show(visible(f"rounds: {line}"))
    if recipe.measured:
        log.show(_measured(recipe))
    log.show(recipe_yaml(recipe).rstrip())
    log.json(recipe.to_dict())
