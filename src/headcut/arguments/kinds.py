"""The kinds of value the Python API's arguments take that no option declaration states: a model (a checkpoint
folder, a Hub id or a loaded model), a list of them, data (a path, a DataConfig, a ``datasets`` object or rows), a
mask, an output path, a tokenizer, a reporter, output formats, a checkpoint folder, a memory size, a dtype ...
(:data:`headcut.arguments.table.RULES` names which argument takes which), and the plain kinds a declared option
field has (:func:`integer`, :func:`number`, :func:`boolean`, :func:`text`; :mod:`headcut.arguments.fields`).

A rule refuses with :class:`~headcut.errors.HeadcutTypeError` (the wrong kind of value: a string for a number, a list
for a mask, a module that is not a transformers model) or :class:`~headcut.errors.HeadcutValueError` (a value that
cannot work: NaN, an unknown task, a checkpoint folder inside a file), whose message names the keyword the caller
passed (``sparsity``, not ``--sparsity``). :func:`values` turns the plain refusals of the checks further in (a
configuration's ``validate``, a registry lookup) into ``HeadcutValueError``s for Python callers.
"""

from __future__ import annotations

import contextlib
import numbers
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..data import Calibration, DataConfig
from ..devices import parse_size
from ..errors import HeadcutError, HeadcutTypeError, HeadcutValueError, is_finite, label, shown
from ..files.atomic import OutputDir, OutputFile
from ..model.masks import HeadMask
from ..model.stock import CheckpointForm
from ..recipes import Recipe

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


def wrong(name: str, what: str, value: Any) -> HeadcutTypeError:
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
        raise wrong(name, "an integer", value)
    if not -(2**63) <= value < 2**64:
        raise HeadcutValueError(f"{_named(name)} {shown(value)} is out of range: integers here fit in 64 bits")


def number(name: str, value: Any) -> None:
    """A finite real number (an int or a float, not a bool)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise wrong(name, "a number", value)
    if not is_finite(value):
        raise HeadcutValueError(f"{name} must be a finite number, got {shown(value)}")


def instance_of(kind: type, what: str) -> Rule:
    """A rule: the value is a ``kind`` (``what`` says so in the message)."""

    def check(name: str, value: Any) -> None:
        if not isinstance(value, kind):
            raise wrong(name, what, value)

    return check


boolean = instance_of(bool, "True or False")


def text(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise wrong(name, "a string", value)
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
        raise wrong(name, "a path (str or os.PathLike)", value)
    if not str(os.fspath(value)).strip():
        raise HeadcutValueError(f"{name} is empty: pass a path")


def checkpoint(name: str, value: Any) -> None:
    """A checkpoint folder or Hub id (what :func:`headcut.load` reads)."""
    if not isinstance(value, (str, os.PathLike)):
        raise wrong(name, "a checkpoint folder or a Hub id (str or os.PathLike)", value)
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
        raise wrong(name, "a list of models (checkpoint folders, Hub ids or loaded models)", value)
    if not value:
        raise HeadcutValueError(f"{name} is empty: give at least one model to benchmark")
    for i, item in enumerate(value):
        model(f"{name}[{i}]", item)


def strings(name: str, value: Any) -> None:
    """A list or tuple of strings (not one string: ``labels="a,b"`` would be its characters)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise wrong(name, "a list of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise wrong(f"{name}[{i}]", "a string", item)


def _is_datasets(value: Any) -> bool:
    if not type(value).__module__.startswith("datasets"):
        return False  # datasets is imported only for a value that may be one of its objects
    import datasets

    return isinstance(value, (datasets.Dataset, datasets.DatasetDict))


_DATA_KINDS = (
    "a data file or datasets name (str or os.PathLike), a headcut.DataConfig, a datasets.Dataset or "
    "DatasetDict, or a list of dict rows"
)


def recipe(name: str, value: Any) -> None:
    """A recipe (see :mod:`headcut.recipes`): a built-in name or a file path, a mapping of its YAML form, or a
    :class:`~headcut.recipes.Recipe` (what it holds is checked when it is read)."""
    if isinstance(value, (str, os.PathLike)):
        if not str(os.fspath(value)).strip():
            raise HeadcutValueError(f"{name} is empty: give a recipe's name or file")
        return
    if isinstance(value, (Recipe, Mapping)):
        return
    raise wrong(name, "a recipe name, a recipe file, a mapping or a headcut.recipes.Recipe", value)


def data(name: str, value: Any) -> None:
    """A data spec (see :mod:`headcut.api`): a path or ``datasets`` name, a DataConfig, a Calibration, a
    ``datasets.Dataset``/``DatasetDict`` or a list of dict rows."""
    if isinstance(value, (str, os.PathLike)):
        if not str(os.fspath(value)).strip():
            raise HeadcutValueError(f"{name} is empty: pass a data file or a datasets name")
        return  # a missing local file: jobs.base.check_data_spec, with the other data checks

    if isinstance(value, (DataConfig, Calibration)) or _is_datasets(value):
        return
    if isinstance(value, (list, tuple)):
        if not value:
            raise HeadcutValueError(f"{name} is an empty {type(value).__name__}: give at least one row")
        for i, row in enumerate(value):
            if not isinstance(row, dict):
                raise wrong(f"{name}[{i}]", "a dict row (column -> value)", row)
        return
    raise wrong(name, _DATA_KINDS, value)


def tokenizer(name: str, value: Any) -> None:
    """A tokenizer: callable on texts, with the attributes headcut reads (``pad_token_id``)."""
    if isinstance(value, (str, os.PathLike)):
        raise wrong(name, "a loaded tokenizer (load one with transformers.AutoTokenizer.from_pretrained)", value)
    if not callable(value) or not hasattr(value, "pad_token_id"):
        raise wrong(name, "a tokenizer (callable on texts, with pad_token_id, as transformers' tokenizers)", value)


def mask(name: str, value: Any) -> None:
    """A HeadMask, a mask mapping (``{"keep"|"drop": {block: [heads]}}``) or a mask JSON file."""

    if isinstance(value, (str, os.PathLike)):
        path(name, value)
    elif not isinstance(value, (HeadMask, Mapping)):
        raise wrong(name, 'a HeadMask, a dict {"keep"|"drop": {block: [heads]}} or a mask JSON file', value)


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
        raise wrong(name, "a size such as 12GB or a number of bytes", value)

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

    if not isinstance(value, OutputDir):
        path(name, value)


def output_file(name: str, value: Any) -> None:

    if not isinstance(value, OutputFile):
        path(name, value)


def mapping(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise wrong(name, "a dict", value)
    for key in value:
        if not isinstance(key, str):
            raise wrong(f"a key of {name}", "a string", key)


def reporter(name: str, value: Any) -> None:
    """A :class:`headcut.progress.Reporter` (or an object with its ``task`` and ``step``)."""
    if not (callable(getattr(value, "task", None)) and callable(getattr(value, "step", None))):
        raise wrong(name, "a headcut.progress.Reporter", value)


def formats(name: str, value: Any) -> None:
    """``"safetensors,onnx"`` or a list of format names (the names are checked by parse_formats)."""
    if isinstance(value, str):
        return
    if not isinstance(value, (list, tuple)):
        raise wrong(name, "a format name or a list of them (safetensors, onnx, gguf)", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise wrong(f"{name}[{i}]", "a format name (safetensors, onnx, gguf)", item)


a_dict = instance_of(dict, "a dict")
a_list = instance_of(list, "a list")


def function(name: str, value: Any) -> None:
    if not callable(value):
        raise wrong(name, "a function", value)


def checkpoint_form(name: str, value: Any) -> None:
    """A :class:`headcut.model.stock.CheckpointForm` (what :func:`headcut.model.stock.stock_form` returns)."""

    if not isinstance(value, CheckpointForm):
        raise wrong(name, "a CheckpointForm from headcut.model.stock.stock_form", value)


def dtype(name: str, value: Any) -> None:
    import torch

    if not isinstance(value, (str, torch.dtype)):
        raise wrong(name, "a dtype name (float32, float16, bfloat16) or a torch.dtype", value)


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


def head_counts(name: str, value: Any) -> None:
    """Heads counts of a schedule: ``"48,24"`` or a list or tuple of integers (their values are the request's
    check)."""
    if isinstance(value, str):
        return text(name, value)
    if not isinstance(value, (list, tuple)) or not value:
        raise wrong(name, "heads counts: a string K1,K2,... or a list of integers", value)
    for i, count in enumerate(value):
        integer(f"{name}[{i}]", count)
