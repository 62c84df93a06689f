"""The Python API's argument checks, in one table: every public argument of :func:`headcut.prune`,
``score``, ``finetune``, ``evaluate``, ``export``, ``bench``, ``info``, ``load`` and ``save`` (and of the
results' ``save`` / ``write_trajectory``) has a rule here, applied by :func:`checked` before the function
does anything (reads, loads or writes).

A rule refuses with :class:`~headcut.errors.HeadcutTypeError` (the wrong kind of value: a string for a
number, a list for a mask, a module that is not a transformers model) or
:class:`~headcut.errors.HeadcutValueError` (a value that cannot work: NaN, an unknown task, a checkpoint
folder inside a file), whose message names the keyword the caller passed (``sparsity``, not
``--sparsity``). The ranges of the options the command line shares (``--keep``, ``--lr``, ``--gqa``, ...)
are checked further in by the configurations (:mod:`headcut.config`), which speak in flags;
:func:`values` turns their refusals into ``HeadcutValueError``s for Python callers.

The fields of a method's options (``prune(..., max_steps=5)``), of :class:`~headcut.config.BenchConfig`
(``bench(..., runs=3)``) and of ``data_options`` are checked against their dataclass's annotations
(int, float, bool, str, or None where the annotation allows it); ``evaluate``'s options against the
declarations of :class:`~headcut.config.EvalOptions`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import numbers
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .errors import HeadcutError, HeadcutTypeError, HeadcutValueError, is_finite, label, shown
from .files.space import file_error

F = TypeVar("F", bound=Callable[..., Any])

#: a rule: refuse ``value`` of the argument ``name`` (a HeadcutTypeError or HeadcutValueError), else None
Rule = Callable[[str, Any], None]


# ---- how a value is shown --------------------------------------------------------------------------------


def _got(value: Any) -> str:
    """``value`` as the end of a message: its type, and its value when that is short."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float, str, bytes)) or isinstance(value, os.PathLike):
        return f"{type(value).__name__} {shown(value if not isinstance(value, os.PathLike) else os.fspath(value))}"
    return f"a {type(value).__name__}"


def _named(name: str) -> str:
    """An argument named in a message: a keyword the command line may have given as a flag, labelled
    (:func:`~headcut.errors.label`: ``--seed`` there), an item of one (``models[0]``) as it is."""
    return label(name) if name.isidentifier() else name


def _wrong(name: str, what: str, value: Any) -> HeadcutTypeError:
    return HeadcutTypeError(f"{name} must be {what}, got {_got(value)}")


# ---- rules ---------------------------------------------------------------------------------------------


def optional(rule: Rule) -> Rule:
    """``rule``, or None."""

    def check(name: str, value: Any) -> None:
        if value is not None:
            rule(name, value)

    return check


def anything(name: str, value: Any) -> None:
    """No check here (the value is checked further in, e.g. a method's options by the method)."""


def integer(name: str, value: Any) -> None:
    """An integer (a Python or numpy int, not a bool) of at most 64 bits (torch's and C's largest; no count,
    length or step is larger)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise _wrong(name, "an integer", value)
    if not -(2**63) <= value < 2**64:
        raise HeadcutValueError(f"{_named(name)} {shown(value)} is out of range: integers here fit in 64 bits")


def number(name: str, value: Any) -> None:
    """A finite real number (an int or a float, not a bool)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise _wrong(name, "a number", value)
    if not is_finite(value):
        raise HeadcutValueError(f"{name} must be a finite number, got {shown(value)}")


def instance_of(kind: type, what: str) -> Rule:
    """A rule: the value is a ``kind`` (``what`` says so in the message)."""

    def check(name: str, value: Any) -> None:
        if not isinstance(value, kind):
            raise _wrong(name, what, value)

    return check


boolean = instance_of(bool, "True or False")


def text(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _wrong(name, "a string", value)
    if not value.strip():
        raise HeadcutValueError(f"{name} is empty")


def choice(valid: Callable[[], Any]) -> Rule:
    """A string among ``valid()`` (read when checked, so the catalog is imported only then)."""

    def check(name: str, value: Any) -> None:
        text(name, value)
        names = list(valid())
        if value not in names:
            raise HeadcutValueError(f"unknown {name} {value!r}; choose one of {', '.join(names)}")

    return check


def registered(entry: Callable[[str], Any]) -> Rule:
    """A string that the registry lookup ``entry`` knows (a method or scorer name; its own message)."""

    def check(name: str, value: Any) -> None:
        text(name, value)
        with values():
            entry(value)

    return check


def path(name: str, value: Any) -> None:
    """A str or os.PathLike that is not empty."""
    if not isinstance(value, (str, os.PathLike)):
        raise _wrong(name, "a path (str or os.PathLike)", value)
    if not str(os.fspath(value)).strip():
        raise HeadcutValueError(f"{name} is empty: pass a path")


def checkpoint(name: str, value: Any) -> None:
    """A checkpoint folder or Hub id (what :func:`headcut.load` reads)."""
    if not isinstance(value, (str, os.PathLike)):
        raise _wrong(name, "a checkpoint folder or a Hub id (str or os.PathLike)", value)
    path(name, value)


def _transformers_model(value: Any) -> bool:
    import transformers

    return isinstance(value, transformers.PreTrainedModel)


def transformers_model(name: str, value: Any) -> None:
    """A loaded transformers model (``PreTrainedModel``)."""
    if not _transformers_model(value):
        from torch import nn

        kind = "a torch module that is not a transformers model" if isinstance(value, nn.Module) else "not a model"
        raise HeadcutTypeError(f"{name} must be a transformers model (a PreTrainedModel), got {_got(value)} ({kind})")


def model(name: str, value: Any) -> None:
    """A checkpoint folder or Hub id, or a loaded transformers model."""
    if isinstance(value, (str, os.PathLike)):
        path(name, value)
        return
    from torch import nn

    if isinstance(value, nn.Module) and _transformers_model(value):
        return
    kind = " (a torch module that is not a transformers model)" if isinstance(value, nn.Module) else ""
    raise HeadcutTypeError(
        f"{name} must be a checkpoint folder, a Hub id or a loaded transformers model "
        f"(PreTrainedModel), got {_got(value)}{kind}"
    )


def model_list(name: str, value: Any) -> None:
    """A non-empty list or tuple of models (see :func:`model`)."""
    if isinstance(value, (str, os.PathLike)) or not isinstance(value, (list, tuple)):
        raise _wrong(name, "a list of models (checkpoint folders, Hub ids or loaded models)", value)
    if not value:
        raise HeadcutValueError(f"{name} is empty: give at least one model to benchmark")
    for i, item in enumerate(value):
        model(f"{name}[{i}]", item)


def strings(name: str, value: Any) -> None:
    """A list or tuple of strings (not one string: ``labels="a,b"`` would be its characters)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise _wrong(name, "a list of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _wrong(f"{name}[{i}]", "a string", item)


def _is_datasets(value: Any) -> bool:
    if not type(value).__module__.startswith("datasets"):
        return False  # datasets is imported only for a value that may be one of its objects
    import datasets

    return isinstance(value, (datasets.Dataset, datasets.DatasetDict))


_DATA_KINDS = (
    "a data file or datasets name (str or os.PathLike), a headcut.DataConfig, a datasets.Dataset or "
    "DatasetDict, or a list of dict rows"
)


def data(name: str, value: Any) -> None:
    """A data spec (see :mod:`headcut.api`): a path or ``datasets`` name, a DataConfig, a Calibration, a
    ``datasets.Dataset``/``DatasetDict`` or a list of dict rows."""
    if isinstance(value, (str, os.PathLike)):
        if not str(os.fspath(value)).strip():
            raise HeadcutValueError(f"{name} is empty: pass a data file or a datasets name")
        return  # a missing local file: api._check_data_spec, with the other data checks
    from .data import Calibration, DataConfig

    if isinstance(value, (DataConfig, Calibration)) or _is_datasets(value):
        return
    if isinstance(value, (list, tuple)):
        if not value:
            raise HeadcutValueError(f"{name} is an empty {type(value).__name__}: give at least one row")
        for i, row in enumerate(value):
            if not isinstance(row, dict):
                raise _wrong(f"{name}[{i}]", "a dict row (column -> value)", row)
        return
    raise _wrong(name, _DATA_KINDS, value)


def tokenizer(name: str, value: Any) -> None:
    """A tokenizer: callable on texts, with the attributes headcut reads (``pad_token_id``)."""
    if isinstance(value, (str, os.PathLike)):
        raise _wrong(name, "a loaded tokenizer (load one with transformers.AutoTokenizer.from_pretrained)", value)
    if not callable(value) or not hasattr(value, "pad_token_id"):
        raise _wrong(name, "a tokenizer (callable on texts, with pad_token_id, as transformers' tokenizers)", value)


def mask(name: str, value: Any) -> None:
    """A HeadMask, a mask mapping (``{"keep"|"drop": {block: [heads]}}``) or a mask JSON file."""
    from .model.masks import HeadMask

    if isinstance(value, (str, os.PathLike)):
        path(name, value)
    elif not isinstance(value, (HeadMask, Mapping)):
        raise _wrong(name, 'a HeadMask, a dict {"keep"|"drop": {block: [heads]}} or a mask JSON file', value)


def checkpoint_dir(name: str, value: Any) -> None:
    """A folder path whose nearest existing part is a folder (a fresh one is made inside it)."""
    path(name, value)
    p = Path(os.fspath(value)).expanduser()
    for part in (p, *p.parents):
        try:
            if not part.exists():
                continue
        except OSError:
            return  # unreadable: the training's own checks report it
        if not part.is_dir():
            where = "" if part == p else f": {part} is a file, so no folder can be made inside it"
            raise HeadcutValueError(f"{name} {p} is not a folder{where}; pass a folder path")
        return


def size(name: str, value: Any) -> None:
    """A memory size: ``12GB``, ``12GiB``, ``500MB`` or a whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise _wrong(name, "a size such as 12GB or a number of bytes", value)
    from .devices import parse_size

    try:
        parse_size(value if isinstance(value, str) else int(value))
    except HeadcutError as exc:
        raise HeadcutValueError(exc.args[0]) from None


def bool_or_path(name: str, value: Any) -> None:
    """True/False, or a path (``prune(trajectory="curve.csv")``)."""
    if not isinstance(value, bool):
        path(name, value)


def output(name: str, value: Any) -> None:
    """Where a model is written: a path, or an :class:`~headcut.files.atomic.OutputDir` checked by its maker."""
    from .files.atomic import OutputDir

    if not isinstance(value, OutputDir):
        path(name, value)


def output_file(name: str, value: Any) -> None:
    from .files.atomic import OutputFile

    if not isinstance(value, OutputFile):
        path(name, value)


def mapping(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise _wrong(name, "a dict", value)
    for key in value:
        if not isinstance(key, str):
            raise _wrong(f"a key of {name}", "a string", key)


def data_options(name: str, value: Any) -> None:
    """A dict of :class:`~headcut.data.DataConfig` fields (unknown names are refused by the API with the list)."""
    mapping(name, value)
    from .data import DataConfig

    _fields(DataConfig, value, lambda key: f"{name}[{key!r}]")


def eval_settings(name: str, value: Any) -> None:
    """``evaluate``'s options (``**options``): the fields of :class:`~headcut.config.EvalOptions`, checked by
    :func:`~headcut.config.eval_options` (unknown names, kinds, ranges, the include folder, the device)."""
    from .config import eval_options

    with values():
        eval_options(value)


def reporter(name: str, value: Any) -> None:
    """A :class:`headcut.progress.Reporter` (or an object with its ``task`` and ``step``)."""
    if not (callable(getattr(value, "task", None)) and callable(getattr(value, "step", None))):
        raise _wrong(name, "a headcut.progress.Reporter", value)


def formats(name: str, value: Any) -> None:
    """``"safetensors,onnx"`` or a list of format names (the names are checked by parse_formats)."""
    if isinstance(value, str):
        return
    if not isinstance(value, (list, tuple)):
        raise _wrong(name, "a format name or a list of them (safetensors, onnx, gguf)", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _wrong(f"{name}[{i}]", "a format name (safetensors, onnx, gguf)", item)


a_dict = instance_of(dict, "a dict")
a_list = instance_of(list, "a list")


def function(name: str, value: Any) -> None:
    if not callable(value):
        raise _wrong(name, "a function", value)


def checkpoint_form(name: str, value: Any) -> None:
    """A :class:`headcut.model.stock.CheckpointForm` (what :func:`headcut.model.stock.stock_form` returns)."""
    from .model.stock import CheckpointForm

    if not isinstance(value, CheckpointForm):
        raise _wrong(name, "a CheckpointForm from headcut.model.stock.stock_form", value)


def dtype(name: str, value: Any) -> None:
    import torch

    if not isinstance(value, (str, torch.dtype)):
        raise _wrong(name, "a dtype name (float32, float16, bfloat16) or a torch.dtype", value)


def bench_config(name: str, value: Any) -> None:
    from .config import BenchConfig

    if not isinstance(value, BenchConfig):
        raise _wrong(name, "a headcut.BenchConfig", value)
    _fields(BenchConfig, dataclasses.asdict(value), lambda key: f"{name}.{key}")


# ---- dataclass fields, from their annotations ------------------------------------------------------------

_BY_TYPE: dict[Any, Rule] = {bool: boolean, int: integer, float: number, str: text}


def _field_rule(annotation: Any) -> Rule | None:
    """The rule of a field annotated ``int``, ``float``, ``bool``, ``str`` or one of them ``| None``;
    None for any other annotation (not checked here)."""
    if annotation in _BY_TYPE:
        return _BY_TYPE[annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1 and members[0] in _BY_TYPE and len(typing.get_args(annotation)) == 2:
            return optional(_BY_TYPE[members[0]])
    return None


@functools.cache
def _field_rules(cls: type) -> dict[str, Rule]:
    hints = typing.get_type_hints(cls)
    rules = {f.name: _field_rule(hints.get(f.name)) for f in dataclasses.fields(cls)}
    return {k: r for k, r in rules.items() if r is not None}


def _fields(cls: type, given: Mapping[str, Any], label: Callable[[str], str]) -> None:
    """Check the known fields of ``cls`` in ``given`` (unknown names are left to the caller's message)."""
    rules = _field_rules(cls)
    for key, value in given.items():
        rule = rules.get(key)
        if rule is not None:
            rule(label(key), value)


def _method_options(given: Mapping[str, Any]) -> None:
    """``prune``'s method options (``**options``) against the method's Options fields."""
    from .pruning import get_method

    method = given.get("method")
    options = given.get("options") or {}
    if not options:
        return
    _fields(get_method(method).Options, options, lambda key: key)


def bench_models(models: Any, names: Any) -> None:
    """``models`` (a non-empty list of models) and ``names`` (None, or one string per model): the checks of
    :func:`headcut.bench` and :func:`headcut.jobs.bench_run.bench`."""
    model_list("models", models)
    if names is not None:
        strings("names", names)
        if len(names) != len(models):
            raise HeadcutValueError(
                f"names must match models one to one: {len(names)} name(s) for {len(models)} model(s)"
            )


def _bench_settings(given: Mapping[str, Any]) -> None:
    """``bench``'s settings (``**settings``) against BenchConfig's fields; names match models one to one."""
    from .config import BenchConfig

    _fields(BenchConfig, given.get("settings") or {}, lambda key: key)
    bench_models(given.get("models"), given.get("names"))


# ---- the table -------------------------------------------------------------------------------------------


def _catalog(name: str) -> Callable[[], Any]:
    def read() -> Any:
        from . import catalog

        return getattr(catalog, name)

    return read


def _method(value: str) -> Any:
    from .catalog import method_entry

    return method_entry(value)


def _scorer(value: str) -> Any:
    from .catalog import scorer_entry

    return scorer_entry(value)


_MODEL_IN = {"task": optional(choice(_catalog("TASKS"))), "allow_pickle": boolean, "trust_remote_code": boolean}
_DATA_IN = {
    "tokenizer": optional(tokenizer),
    "split": text,
    "data_options": optional(data_options),
    "seed": integer,
    "progress": optional(reporter),
}
_WRITES = {"formats": optional(formats), "gguf_type": text, "arguments": optional(a_dict)}
_TRAINS = {
    "device": optional(text),
    "checkpoint_dir": optional(checkpoint_dir),
    "resume": boolean,
    "restart": boolean,
    "eval_data": optional(data),
    "eval_split": text,
}

#: function -> argument -> rule; every parameter of each function has one (tests/test_hostile_api.py checks)
RULES: dict[str, dict[str, Rule]] = {
    "prune": {
        "model": model,
        "method": registered(_method),
        "keep": optional(integer),
        "sparsity": optional(number),
        "max_drop": optional(number),
        "data": optional(data),
        "uniform": boolean,
        "min_heads_per_block": integer,
        "via": optional(integer),
        "gqa": text,
        "trajectory": bool_or_path,
        "recover_steps": integer,
        "refit": boolean,
        "recover_data": optional(data),
        "recover_hidden_weight": number,
        "recover_average": number,
        "via_steps": optional(integer),
        "layerwise": boolean,
        "max_memory": optional(size),
        "out": optional(output),
        "force": boolean,
        "options": anything,
        **_MODEL_IN,
        **_DATA_IN,
        **_WRITES,
        **_TRAINS,
    },
    "score": {
        "model": model,
        "scorer": registered(_scorer),
        "data": optional(data),
        "normalize": text,
        "abs_per": text,
        "objective": text,
        "per": text,
        **_MODEL_IN,
        **_DATA_IN,
    },
    "finetune": {
        "model": model,
        "data": data,
        "teacher": optional(model),
        "epochs": optional(integer),
        "max_steps": optional(integer),
        "lr": number,
        "grad_accum": integer,
        "warmup_steps": integer,
        "weight_decay": number,
        "eval_every": optional(integer),
        "checkpoint_every": optional(integer),
        "alpha": number,
        "temperature": number,
        "hidden_weight": number,
        "mixup": number,
        "patience": optional(integer),
        "engine": choice(_catalog("ENGINES")),
        "labels": optional(strings),
        "out": optional(output),
        "force": boolean,
        **_MODEL_IN,
        **_DATA_IN,
        **_WRITES,
        **_TRAINS,
    },
    "evaluate": {"model": model, "data": optional(data), "options": eval_settings, **_MODEL_IN, **_DATA_IN},
    "export": {
        "model": model,
        "mask": mask,
        "gqa": text,
        "out": optional(output),
        "force": boolean,
        **_MODEL_IN,
        **_WRITES,
    },
    "bench": {
        "models": model_list,
        "config": optional(bench_config),
        "names": optional(strings),
        "progress": optional(reporter),
        "update_cards": boolean,
        "settings": anything,
        **_MODEL_IN,
    },
    "info": {"model": model, **_MODEL_IN},
    "load": {
        "path": checkpoint,
        "dtype": optional(dtype),
        "device": optional(text),
        "attn_implementation": optional(text),
        "notes": optional(a_list),
        "labels": optional(strings),
        **_MODEL_IN,
    },
    "save": {
        "model": transformers_model,
        "out": output,
        "source": optional(path),
        "force": boolean,
        "extra": optional(function),
        "trust_remote_code": boolean,
        "form": optional(checkpoint_form),
    },
    "Written.save": {
        "self": anything,
        "out": output,
        "force": boolean,
        "formats": optional(formats),
        "gguf_type": optional(text),
    },
    "Pruned.write_trajectory": {"self": anything, "csv_path": output_file, "png": boolean, "force": boolean},
}

#: checks that read several arguments, after each argument's own rule
AFTER: dict[str, list[Callable[[Mapping[str, Any]], None]]] = {
    "prune": [_method_options],
    "bench": [_bench_settings],
}


def check(function: str, given: Mapping[str, Any]) -> None:
    """Apply ``function``'s rules to its arguments ``given`` (name -> value), in the signature's order."""
    rules = RULES[function]
    for name, value in given.items():
        rule = rules.get(name)
        if rule is not None:
            rule(name, value)
    for after in AFTER.get(function, []):
        after(given)


def checked(function: str) -> Callable[[F], F]:
    """Decorate a public function: its arguments are checked against ``RULES[function]`` before it runs,
    and a call that does not fit its signature (a missing or unknown argument) is a HeadcutTypeError."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise HeadcutTypeError(f"{function.split('.')[-1]}(): {exc}") from None
            bound.apply_defaults()
            check(function, bound.arguments)
            try:
                return fn(*args, **kwargs)
            except OSError as exc:  # a file the checks did not foresee: a headcut error naming it, still
                error = file_error(exc)
                if error is None:
                    raise
                raise HeadcutValueError(Exception.__str__(error)) from None

        return wrapper  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def values() -> Iterator[None]:
    """Raise the plain :class:`HeadcutError` of a value check inside (a configuration's ``validate``, a
    registry lookup) as a :class:`HeadcutValueError` with the same message."""
    try:
        yield
    except HeadcutError as exc:
        if type(exc) is not HeadcutError:
            raise
        raise HeadcutValueError(Exception.__str__(exc)) from None
