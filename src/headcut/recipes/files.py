"""Recipes read from and written to files: YAML (``.yaml``/``.yml``), JSON (``.json``), or a prune report
(``headcut-report.json``, whose ``recipe`` is the run's resolved recipe), and the built-in names."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import HeadcutValueError
from .builtin import builtin_recipes
from .recipe import Recipe, from_dict

#: the file a prune writes beside its report: the run's resolved recipe, to replay it
RECIPE_FILE = "headcut-recipe.yaml"
#: the suffixes read as YAML and as JSON
YAML_SUFFIXES = (".yaml", ".yml")


def read_recipe(source: str | os.PathLike[str] | Recipe | Mapping[str, Any]) -> Recipe:
    """A recipe from a built-in name, a file (YAML, JSON, a prune report or an output folder holding
    :data:`RECIPE_FILE`), a mapping of its YAML form, or a :class:`Recipe` (as it is)."""
    if isinstance(source, Recipe):
        return source
    if isinstance(source, Mapping):
        return from_dict(source, "recipe")
    builtin = builtin_recipes()
    if isinstance(source, str) and source in builtin:
        return builtin[source]
    path = Path(source).expanduser()
    if path.is_dir() and (path / RECIPE_FILE).is_file():
        path = path / RECIPE_FILE
    if not path.is_file():
        raise HeadcutValueError(
            f"no recipe {str(source)!r}: give a built-in recipe ({', '.join(builtin)}) or a recipe file "
            "(.yaml, .json, or a prune's headcut-report.json)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HeadcutValueError(f"cannot read the recipe {path}: {exc}") from None
    try:
        raw = yaml.safe_load(text) if path.suffix.lower() in YAML_SUFFIXES else json.loads(text)
    except (yaml.YAMLError, ValueError) as exc:
        kind = "YAML" if path.suffix.lower() in YAML_SUFFIXES else "JSON"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HeadcutValueError(f"cannot read the recipe {path}: not {kind} ({first})") from None
    if isinstance(raw, dict) and "report_format" in raw:  # a prune report: the run's resolved recipe
        if not isinstance(raw.get("recipe"), dict):
            raise HeadcutValueError(f"{path} is a report without a recipe (not a prune's, or an older headcut's)")
        raw = raw["recipe"]
    return from_dict(raw, str(path))


def recipe_yaml(recipe: Recipe) -> str:
    """The recipe as YAML (:data:`RECIPE_FILE`), its keys in the order :meth:`Recipe.to_dict` gives them."""
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True, width=100)
