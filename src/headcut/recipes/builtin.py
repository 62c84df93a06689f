"""The built-in recipes: the YAML files of ``headcut/recipes/builtin/``, each read and checked like a user's
(:func:`headcut.recipes.recipe.from_dict`). A new built-in recipe is one file there, with the measurements that
chose it in its ``measured`` list; the one whose ``default_for`` names a kind of model is that kind's default."""

from __future__ import annotations

from importlib import resources

import yaml

from .recipe import Recipe, from_dict

#: the package folder of the built-in recipes' files
FOLDER = "builtin"


def builtin_recipes() -> dict[str, Recipe]:
    """Every built-in recipe by name, in the order of their file names."""
    folder = resources.files(__package__).joinpath(FOLDER)
    found: dict[str, Recipe] = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".yaml"):
            recipe = from_dict(yaml.safe_load(item.read_text(encoding="utf-8")), f"built-in recipe {item.name}")
            found[recipe.name] = recipe
    return found


def default_recipe(kind: str) -> Recipe | None:
    """The built-in recipe that is the default of a kind of model (a transformers task such as
    ``sequence-classification``), or None when no measured recipe is."""
    return next((r for r in builtin_recipes().values() if r.default_for == kind), None)
