"""How large and how deep a recipe may be: a recipe is a few dozen values, so a file or a mapping far past that is
refused before anything reads its values (a value named by reference many times over, as YAML's aliases allow,
counts each time it is named: that is how often a reader that follows it would build or print it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import HeadcutValueError

#: the deepest nesting of a recipe's values (a recipe nests four levels: schedule, case, rounds, round)
MOST_DEPTH = 32
#: the most values a recipe holds, every reference counted (the built-in ones hold a few hundred)
MOST_VALUES = 100_000


class RecipeTooLarge(HeadcutValueError):
    """A recipe past :data:`MOST_DEPTH` or :data:`MOST_VALUES` (the message says which)."""


def _children(value: Any) -> list[Any] | None:
    """The values ``value`` holds (a mapping's keys and values, a list's or tuple's items), None for a plain one."""
    if isinstance(value, Mapping):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def check_size(raw: Any, where: str, children: Any = _children) -> None:
    """Refuse ``raw`` nested deeper than :data:`MOST_DEPTH` or holding more than :data:`MOST_VALUES` values, each
    reference to a shared value counted (a structure that holds itself is refused by its depth). ``children(v)``:
    the values ``v`` holds, None for a plain value (the default reads Python's mappings, lists and tuples; the YAML
    reader passes one for YAML's nodes). Stops as soon as a limit is passed: at most MOST_VALUES steps."""
    seen = 0
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MOST_VALUES:
            raise RecipeTooLarge(
                f"{where}: more than {MOST_VALUES:,} values (with every alias counted each time it is used): "
                "a recipe holds a few dozen"
            )
        held = children(value)
        if held:
            if depth >= MOST_DEPTH:
                raise RecipeTooLarge(f"{where}: nested more than {MOST_DEPTH} levels deep")
            stack.extend((child, depth + 1) for child in held)
