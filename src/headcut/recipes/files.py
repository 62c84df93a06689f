"""Recipes read from and written to files: YAML (``.yaml``/``.yml``), JSON (``.json``), or a prune report
(``headcut-report.json``, whose ``recipe`` is the run's resolved recipe), and the built-in names.

A recipe file is an input like any other, and read with limits before anything is built from it: at most
:data:`MOST_YAML_BYTES` of YAML or :data:`MOST_JSON_BYTES` of JSON (a report is larger than a recipe), nested at most
:data:`MOST_DEPTH` levels deep, and at most :data:`MOST_VALUES` values once YAML's aliases are expanded (an alias
names a value written elsewhere: a few of them nested can name billions of values, which a reader that follows
them would build or print). Nothing of a file that passes none of them is shown or built; the message says which
limit and the file's own line where YAML gives one."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import HeadcutTypeError, HeadcutValueError
from .builtin import builtin_recipes
from .limits import MOST_DEPTH, RecipeTooLarge, check_size
from .recipe import Recipe, from_dict

#: the file a prune writes beside its report: the run's resolved recipe, to replay it
RECIPE_FILE = "headcut-recipe.yaml"
#: the suffixes read as YAML and as JSON
YAML_SUFFIXES = (".yaml", ".yml")
#: the largest recipe file read as YAML (a recipe is a few kilobytes; YAML is read in Python, about 1 MB/s)
MOST_YAML_BYTES = 1024**2
#: the largest JSON file read (a prune report holds its recipe beside every score and step of the run)
MOST_JSON_BYTES = 64 * 1024**2


def _yaml_children(node: Any) -> list[Any] | None:
    """The nodes a composed YAML node holds (an alias is the node it names, so it counts each time)."""
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return None


class _Loader(yaml.SafeLoader):
    """YAML's safe loader (plain values only: no tag that builds an object) that stops at :data:`MOST_DEPTH`
    levels of nesting while it composes the document, before Python's recursion limit would, and counts the
    composed document's values, every alias each time it is used, before it builds any (:func:`check_size`):
    aliases nested a few times over (also through merge keys, ``<<: *name``) would build billions."""

    def __init__(self, stream: str, where: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._where = where

    def construct_document(self, node: Any) -> Any:
        check_size(node, self._where, _yaml_children)
        return super().construct_document(node)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MOST_DEPTH:
                mark = self.peek_event().start_mark
                raise RecipeTooLarge(f"{self._where}: nested more than {MOST_DEPTH} levels deep (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _parse(text: str, as_yaml: bool, where: str) -> Any:
    """The plain values of ``text`` (YAML or JSON), or RecipeTooLarge / ValueError / yaml.YAMLError."""
    if as_yaml:
        loader = _Loader(text, where)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    try:
        return json.loads(text)
    except RecursionError:
        raise RecipeTooLarge(f"{where}: nested more than {MOST_DEPTH} levels deep") from None


def recipe_path(source: str | os.PathLike[str]) -> Path | None:
    """The file a recipe given as ``source`` is read from (a folder's :data:`RECIPE_FILE`), None for a built-in
    name or a path that is no file."""
    if isinstance(source, str) and source in builtin_recipes():
        return None
    path = Path(source).expanduser()
    if path.is_dir() and (path / RECIPE_FILE).is_file():
        path = path / RECIPE_FILE
    return path if path.is_file() else None


def read_recipe(source: str | os.PathLike[str] | Recipe | Mapping[str, Any]) -> Recipe:
    """A recipe from a built-in name, a file (YAML, JSON, a prune report or an output folder holding
    :data:`RECIPE_FILE`; read with the module's limits), a mapping of its YAML form, or a :class:`Recipe` (as it
    is). A recipe read from a file has its path as :attr:`Recipe.source` (an input the run never writes)."""
    if isinstance(source, Recipe):
        return source
    if isinstance(source, Mapping):
        return from_dict(source, "recipe")
    if not isinstance(source, (str, os.PathLike)):
        raise HeadcutTypeError(
            "a recipe is a built-in name, a recipe file's path, a mapping of its YAML form or a headcut.recipes."
            f"Recipe, got {'None' if source is None else type(source).__name__}"
        )
    builtin = builtin_recipes()
    if isinstance(source, str) and source in builtin:
        return builtin[source]
    path = recipe_path(source)
    if path is None:
        raise HeadcutValueError(
            f"no recipe {str(source)!r}: give a built-in recipe ({', '.join(builtin)}) or a recipe file "
            "(.yaml, .json, or a prune's headcut-report.json)"
        )
    as_yaml = path.suffix.lower() in YAML_SUFFIXES
    most = MOST_YAML_BYTES if as_yaml else MOST_JSON_BYTES
    try:
        with path.open("rb") as handle:
            data = handle.read(most + 1)
        if len(data) > most:
            raise HeadcutValueError(
                f"cannot read the recipe {path}: more than {most // 1024**2} MiB of {'YAML' if as_yaml else 'JSON'} "
                "(a recipe is a few kilobytes)"
            )
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HeadcutValueError(f"cannot read the recipe {path}: {exc}") from None
    try:
        raw = _parse(text, as_yaml, f"cannot read the recipe {path}")
    except RecipeTooLarge as exc:
        raise HeadcutValueError(str(exc)) from None
    except (yaml.YAMLError, ValueError) as exc:
        kind = "YAML" if as_yaml else "JSON"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HeadcutValueError(f"cannot read the recipe {path}: not {kind} ({first})") from None
    if isinstance(raw, dict) and "report_format" in raw:  # a prune report: the run's resolved recipe
        if not isinstance(raw.get("recipe"), dict):
            raise HeadcutValueError(f"{path} is a report without a recipe (not a prune's, or an older headcut's)")
        raw = raw["recipe"]
    return replace(from_dict(raw, str(path)), source=str(path))


def recipe_yaml(recipe: Recipe) -> str:
    """The recipe as YAML (:data:`RECIPE_FILE`), its keys in the order :meth:`Recipe.to_dict` gives them."""
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True, width=100)
