"""Options declared once: a field of an options dataclass carries its default, help text, command-line flag,
allowed values and range (as peft's config classes do), and everything else is derived from it.

    @dataclass
    class LAGOptions(GateOptions):
        sparsity_warmup: int = option(0, low=0, metavar="N", help="lag: raise the target sparsity ...")

* :func:`check_fields` validates an options object against its fields (type, choices, range) and raises an
  :class:`OptionError` that names the option by its Python keyword (``sparsity_warmup``); the command line
  renders the same error with its flag (``--sparsity-warmup``, see :meth:`OptionError.render`).
* :func:`specs` lists the options of a class at run time (the Python API); :func:`static_specs` reads the
  same list from the module's source without importing it, so ``--help`` and shell completion of
  ``headcut prune --method NAME`` never import torch. A test checks both agree for every method.
  A declaration's arguments are literals, names of module-level literals (also imported ones), f-strings and
  ``+`` of them, and ``", ".join(NAMES)`` of a literal tuple or dict (its keys).
* A subclass may re-declare a field with a plain default (``lr: float = 2e-6``): it keeps the help of the
  field it overrides. ``HIDDEN`` (a class attribute, a tuple of field names) lists inherited fields the
  class does not offer (set by the run, or unused by the method).

This module imports only the standard library.
"""

from __future__ import annotations

import ast
import functools
import numbers
import string
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import LONGEST_SHOWN_INT, HeadcutValueError, Shown, is_finite, label

#: the metadata key of an option field
KEY = "headcut"
#: the help panels of ``--help``
METHOD_PANEL = "Method options"
TRAINING_PANEL = "Training options"


@dataclass(frozen=True)
class Option:
    """What a field declares besides its default: ``help``; ``flag`` (None: ``--field-name``); ``metavar``;
    ``choices``; the range ``low``/``high`` (inclusive unless ``low_open``/``high_open``); ``panel``: the
    ``--help`` section; ``cli``: False for a field only the Python API sets; ``short``: a one-letter flag beside
    ``flag`` (``-q``); ``complete``: what the shell completes besides ``choices``: ``"folders"``, or a tuple of
    suggested values (``("cpu", "cuda")``: a value outside them is still taken); ``recipe``: a recipe holds it (a
    data option that says how data is read, not where it is); ``methods``: the kind of method it applies to
    (``"score"``: the score-based ones; None: every method), so that a method's ``--help`` lists only what it
    takes."""

    help: str
    flag: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    panel: str = METHOD_PANEL
    cli: bool = True
    short: str | None = None
    complete: str | tuple[str, ...] | None = None
    recipe: bool = False
    methods: str | None = None

    def __post_init__(self) -> None:
        # a list, or a dict's keys (read from the source too), as a tuple: the same Option either way
        for name in ("choices", "complete"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple, dict)):
                object.__setattr__(self, name, tuple(value))


def option(
    default: Any = MISSING,
    *,
    help: str,
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    panel: str = METHOD_PANEL,
    cli: bool = True,
    short: str | None = None,
    complete: str | tuple[str, ...] | dict[str, Any] | None = None,
    recipe: bool = False,
    methods: str | None = None,
) -> Any:
    """A dataclass field declaring an option (see the module's doc). Its arguments must be literals, or names
    of module-level literals, so that :func:`static_specs` can read them without importing the module."""
    meta = Option(
        help=help,
        flag=flag,
        metavar=metavar,
        choices=choices,
        low=low,
        high=high,
        low_open=low_open,
        high_open=high_open,
        panel=panel,
        cli=cli,
        short=short,
        complete=tuple(complete) if isinstance(complete, dict) else complete,
        recipe=recipe,
        methods=methods,
    )
    return field(default=default, metadata={KEY: meta})


@dataclass(frozen=True)
class OptionSpec:
    """One option as the command line, ``--help``, completion and the docs see it. ``kind``: ``int``,
    ``float``, ``str`` or ``bool``; ``optional``: None is a valid value (the method's own default)."""

    name: str
    kind: str
    optional: bool
    default: Any
    meta: Option

    @property
    def flag(self) -> str:
        return self.meta.flag or "--" + self.name.replace("_", "-")

    @property
    def help(self) -> str:
        return self.meta.help

    @property
    def metavar(self) -> str:
        if self.meta.metavar:
            return self.meta.metavar
        if self.meta.choices:
            return "|".join(self.meta.choices)
        return {"int": "N", "float": "X", "str": "TEXT", "bool": ""}[self.kind]

    def default_text(self) -> str | None:
        """The default as ``--help`` shows it (None when the help text says it)."""
        if self.default is None or self.default is MISSING or self.kind == "bool":
            return None
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


# ---- errors that name an option ----------------------------------------------------------------------------


class OptionError(HeadcutValueError):
    """A refusal naming options: ``template`` holds ``{field}`` placeholders (and ``values`` the other
    ``{...}``), each option :func:`headcut.errors.label`-led, so ``str(error)`` names the Python keyword
    (``keep``) and the command line its flag (``--keep``)."""

    def __init__(self, template: str, **values: Any) -> None:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name and name not in values]
        # a value too long to print (an integer of more than 4300 digits) by its length
        safe = {
            k: Shown(v) if isinstance(v, int) and v.bit_length() > LONGEST_SHOWN_INT else v for k, v in values.items()
        }
        super().__init__(template.format(**{n: label(n) for n in names}, **safe))


def cli_name(name: str) -> str:
    """The flag of a field that declares no other (``max_steps`` -> ``--max-steps``)."""
    return "--" + name.replace("_", "-")


# ---- run-time specs and checks ------------------------------------------------------------------------------


def _kind(annotation: Any) -> tuple[str, bool]:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = [p.strip() for p in text.replace("Optional[", "").replace("]", "").split("|")]
    optional = "None" in parts or text.startswith("Optional[")
    kinds = [p for p in parts if p != "None"]
    if len(kinds) != 1 or kinds[0] not in ("int", "float", "str", "bool"):
        raise TypeError(f"an option field is int, float, str or bool (or one of them | None), not {text!r}")
    return kinds[0], optional


def _meta(cls: type, name: str) -> Option | None:
    """The nearest declaration of field ``name`` along ``cls``'s bases."""
    for klass in cls.__mro__:
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and KEY in f.metadata:
            return f.metadata[KEY]
    return None


def specs(cls: type) -> list[OptionSpec]:
    """The options of dataclass ``cls`` (fields with an :func:`option` declaration, ``HIDDEN`` left out), in
    field order."""
    hidden = set(getattr(cls, "HIDDEN", ()))
    out = []
    for f in fields(cls):
        meta = _meta(cls, f.name)
        if meta is None or f.name in hidden or not f.init:
            continue
        kind, optional = _kind(f.type)
        out.append(OptionSpec(f.name, kind, optional, f.default, meta))
    return out


def check_value(spec: OptionSpec, value: Any) -> None:
    """Refuse ``value`` for the option ``spec`` declares (type, None, choices, range): an :class:`OptionError`
    naming the option (its keyword; its flag on the command line)."""
    meta, name = spec.meta, spec.name
    if value is None:
        if spec.optional:
            return
        raise OptionError("{%s} must be given (got None)" % name)
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise OptionError("{%s} must be True or False (got {v!r})" % name, v=value)
        return
    if spec.kind == "str":
        if not isinstance(value, str):
            raise OptionError("{%s} must be a string (got {v!r})" % name, v=value)
        if meta.choices is not None and value not in meta.choices:
            raise OptionError("unknown {%s} {v!r}; choose one of {c}" % name, v=value, c=", ".join(meta.choices))
        return
    if spec.kind == "int":
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and is_finite(value)
    low, high = meta.low, meta.high
    if ok and low is not None:
        ok = value > low if meta.low_open else value >= low
    if ok and high is not None:
        ok = value < high if meta.high_open else value <= high
    if ok:
        return
    raise OptionError("{%s} must be %s (got {v!r})" % (name, _rule(spec)), v=value)


def _rule(spec: OptionSpec) -> str:
    """What a number option must be, in words: ``an integer >= 1``, ``in [0, 1]``, ``positive and finite``."""
    meta = spec.meta
    low, high = meta.low, meta.high
    if spec.kind == "int":
        parts = [f"{'>' if meta.low_open else '>='} {low:g}"] if low is not None else []
        parts += [f"{'<' if meta.high_open else '<='} {high:g}"] if high is not None else []
        return "an integer" + (" " + " and ".join(parts) if parts else "")
    if low is not None and high is not None:
        return f"in {'(' if meta.low_open else '['}{low:g}, {high:g}{')' if meta.high_open else ']'}"
    if low is not None:
        return (
            "positive" if low == 0 and meta.low_open else f"{'>' if meta.low_open else '>='} {low:g}"
        ) + " and finite"
    if high is not None:
        return f"{'<' if meta.high_open else '<='} {high:g} and finite"
    return "a finite number"


def check_fields(obj: Any, names: tuple[str, ...] | None = None, by: type | list[OptionSpec] | None = None) -> None:
    """Refuse a field value of ``obj`` its declaration rules out (type, None, choices, range): an
    :class:`OptionError` naming the field. ``names``: only these fields. ``by``: the declarations of another class
    (or a list of specs, e.g. :func:`static_specs`'s), checked against ``obj``'s attributes of the same names."""
    if by is not None:
        declared = by if isinstance(by, list) else specs(by)
        for spec in declared:
            if (names is None or spec.name in names) and hasattr(obj, spec.name):
                check_value(spec, getattr(obj, spec.name))
        return
    cls = type(obj)
    for f in fields(cls):
        if names is not None and f.name not in names:
            continue
        meta = _meta(cls, f.name)
        if meta is None:
            continue
        kind, optional = _kind(f.type)
        check_value(OptionSpec(f.name, kind, optional, f.default, meta), getattr(obj, f.name))


# ---- the same specs, read from the source -----------------------------------------------------------------


class StaticError(Exception):
    """An option declaration :func:`static_specs` cannot read (it must be a literal)."""


_ROOT = Path(__file__).resolve().parent


def _module_path(module: str) -> Path:
    parts = module.split(".")
    if parts[0] != "headcut":
        raise StaticError(f"options are read from headcut's own modules, not {module}")
    base = _ROOT.joinpath(*parts[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _absolute(module: str, level: int, name: str | None, is_package: bool) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    parts = parts if is_package else parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


@functools.cache
def _parsed(module: str) -> tuple[ast.Module, dict[str, ast.AST], dict[str, tuple[str, str]]]:
    """The module's tree, its top-level definitions (classes and assignments) and its imported names."""
    path = _module_path(module)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    defs: dict[str, ast.AST] = {}
    imports: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            defs[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defs[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            defs[node.target.id] = node.value
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node.level, node.module, path.name == "__init__.py")
            for alias in node.names:
                imports[alias.asname or alias.name] = (source, alias.name)
    return tree, defs, imports


def _lookup(module: str, name: str) -> tuple[str, ast.AST]:
    _, defs, imports = _parsed(module)
    if name in defs:
        return module, defs[name]
    if name in imports:
        source, original = imports[name]
        try:
            return _lookup(source, original)
        except (StaticError, FileNotFoundError):
            sub = f"{source}.{original}"  # ``from . import module``
            raise StaticError(f"{module}: cannot read {name} (from {sub}) without importing it") from None
    raise StaticError(f"{module}: {name} is not a module-level literal")


def _value(module: str, node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(module, e) for e in node.elts)
    if isinstance(node, ast.Name):
        where, value = _lookup(module, node.id)
        return _value(where, value)
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                value = _value(module, part.value)
                value = {115: str, 114: repr, 97: ascii}.get(part.conversion, lambda v: v)(value)
                spec = _value(module, part.format_spec) if part.format_spec is not None else ""
                out.append(format(value, spec))
            else:
                out.append(_value(module, part))
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult, ast.Sub, ast.Div)):
        left, right = _value(module, node.left), _value(module, node.right)
        return {
            ast.Add: lambda: left + right,
            ast.Mult: lambda: left * right,
            ast.Sub: lambda: left - right,
            ast.Div: lambda: left / right,
        }[type(node.op)]()
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(module, node.operand)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_value(module, k): _value(module, v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if (  # ``", ".join(NAMES)``: a list of literal names in a help text
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
        and len(node.args) == 1
        and not node.keywords
    ):
        return node.func.value.value.join(map(str, _value(module, node.args[0])))
    raise StaticError(
        f"{module}, line {getattr(node, 'lineno', '?')}: an option declaration must be a literal "
        f"(not {ast.unparse(node)})"
    )


def _class_fields(module: str, name: str) -> tuple[dict[str, tuple[str, Any, Option | None]], tuple[str, ...]]:
    """Field name -> (annotation, default, declaration) of class ``name`` in ``module`` (bases first), and its
    ``HIDDEN``."""
    where, node = _lookup(module, name)
    if not isinstance(node, ast.ClassDef):
        raise StaticError(f"{where}: {name} is not a class")
    out: dict[str, tuple[str, Any, Option | None]] = {}
    hidden: tuple[str, ...] = ()
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id != "object":
            base_fields, base_hidden = _class_fields(where, base.id)
            out.update(base_fields)
            hidden = base_hidden
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HIDDEN" for t in stmt.targets):
            hidden = _value(where, stmt.value)
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = ast.unparse(stmt.annotation)
        if annotation.startswith("ClassVar"):
            continue
        field_name = stmt.target.id
        inherited = out.get(field_name, (annotation, MISSING, None))[2]
        value = stmt.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "option":
            default = _value(where, value.args[0]) if value.args else MISSING
            meta = Option(**{k.arg: _value(where, k.value) for k in value.keywords if k.arg})
            out[field_name] = (annotation, default, meta)
        else:
            out[field_name] = (annotation, _value(where, value) if value is not None else MISSING, inherited)
    return out, tuple(hidden)


def static_specs(target: str) -> list[OptionSpec]:
    """:func:`specs` of the class ``target`` (``module:Class``), read from its module's source without importing
    it (see the module's doc)."""
    module, _, name = target.partition(":")
    found, hidden = _class_fields(module, name)
    out = []
    for field_name, (annotation, default, meta) in found.items():
        if meta is None or field_name in hidden:
            continue
        kind, optional = _kind(annotation)
        out.append(OptionSpec(field_name, kind, optional, default, meta))
    return out
