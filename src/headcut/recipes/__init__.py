"""Recipes: a prune job's stages and the schedule of its rounds as data (:mod:`headcut.recipes.recipe`), the
built-in ones (:mod:`headcut.recipes.builtin`) and their files (:mod:`headcut.recipes.files`)."""

from .builtin import builtin_recipes, default_recipe
from .files import RECIPE_FILE, read_recipe, recipe_yaml
from .recipe import Case, Recipe, RoundPlan, Stage, from_dict

__all__ = [
    "RECIPE_FILE",
    "Case",
    "Recipe",
    "RoundPlan",
    "Stage",
    "builtin_recipes",
    "default_recipe",
    "from_dict",
    "read_recipe",
    "recipe_yaml",
]
