"""The checks of the arguments that are fields of a configuration, derived from the fields' declarations: an
argument of the Python API that names a field of a configuration the function builds (``prune(keep=...)``:
:class:`~headcut.config.PruneConfig`'s ``keep``), a method's option (``prune(..., max_steps=5)``), a bench setting
or a ``data_options`` entry takes the kind its :func:`~headcut.options.option` declaration states (int, float,
bool or str, and None where it allows it; :func:`headcut.options.specs`); a field not declared yet, by its
annotation the same way. Each kind's rule is :mod:`headcut.arguments.kinds`' (a wrong kind is a
``HeadcutTypeError``; NaN or an integer past 64 bits a ``HeadcutValueError``). The declared choices and ranges are
the configuration's own check (its ``validate``, :func:`headcut.options.check_fields`), made once, after the
checks that combine fields, where the request is checked."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..config import BenchConfig
from ..data.config import DataConfig
from ..options import OptionSpec, specs
from .kinds import Rule, boolean, integer, mapping, number, optional, text, wrong

#: the rule of each kind a declaration (:attr:`headcut.options.OptionSpec.kind`) or an annotation states
_BY_KIND: dict[str, Rule] = {"bool": boolean, "int": integer, "float": number, "str": text}
_KIND_OF = {bool: "bool", int: "int", float: "float", str: "str"}


def _annotated(annotation: Any) -> tuple[str, bool] | None:
    """(kind, None allowed) of an annotation ``int``, ``float``, ``bool``, ``str`` or one of them ``| None``; None
    for any other (not checked here)."""
    if annotation in _KIND_OF:
        return _KIND_OF[annotation], False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1 and members[0] in _KIND_OF and len(typing.get_args(annotation)) == 2:
            return _KIND_OF[members[0]], True
    return None


@functools.cache
def field_rules(cls: type) -> dict[str, Rule]:
    """Field name -> rule of the dataclass ``cls``: from the field's declaration, else from its annotation (see the
    module's doc); fields of other kinds have none."""
    declared = {spec.name: (spec.kind, spec.optional) for spec in specs(cls)}
    hints = typing.get_type_hints(cls)
    rules: dict[str, Rule] = {}
    for f in dataclasses.fields(cls):
        kind = declared.get(f.name) or _annotated(hints.get(f.name))
        if kind is not None:
            rules[f.name] = optional(_BY_KIND[kind[0]]) if kind[1] else _BY_KIND[kind[0]]
    return rules


def spec_rules(declared: list[OptionSpec]) -> dict[str, Rule]:
    """Option name -> rule of declared options given as specs (a stage kind's, read from its source)."""
    return {s.name: optional(_BY_KIND[s.kind]) if s.optional else _BY_KIND[s.kind] for s in declared}


def check_given(cls: type, given: Mapping[str, Any], label: Callable[[str], str]) -> None:
    """Check the values ``given`` for fields of ``cls`` (names that are not its fields are left to the caller's
    message, which lists them); ``label(name)``: how the message names one."""
    rules = field_rules(cls)
    for key, value in given.items():
        rule = rules.get(key)
        if rule is not None:
            rule(label(key), value)


def data_options(name: str, value: Any) -> None:
    """A dict of :class:`~headcut.data.DataConfig` fields (unknown names are refused by the API with the list)."""

    mapping(name, value)
    check_given(DataConfig, value, lambda key: f"{name}[{key!r}]")


def bench_config(name: str, value: Any) -> None:
    """A :class:`~headcut.config.BenchConfig` whose fields have their kinds (``config.runs``)."""

    if not isinstance(value, BenchConfig):
        raise wrong(name, "a headcut.BenchConfig", value)
    check_given(BenchConfig, dataclasses.asdict(value), lambda key: f"{name}.{key}")
