"""Loading checkpoints safely and saving slimmed models atomically.

A cut with the same head counts in every block, in a family whose stock config can state them, is saved as a
plain transformers checkpoint (stock config, no headcut record, no code; see :mod:`headcut.model.stock`).
Any other cut is saved in headcut's form (a normal transformers checkpoint plus two small files):

* ``model.safetensors`` and ``config.json`` (with a ``headcut`` section: the cut record, and an
  ``auto_map`` naming the classes of ``modeling_headcut.py``);
* ``modeling_headcut.py`` and ``headcut_runtime.py``: subclasses of the original transformers
  classes that apply the recorded cut in ``__init__``, so that
  ``AutoModelFor...from_pretrained(dir, trust_remote_code=True)`` loads the model without headcut;
* the tokenizer / processor files of the source checkpoint.

:func:`load` reads such a folder without remote code: it applies the same cut with headcut's own
copy of the runtime.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from ..adapters import MISSING, Adapter, adapter_for_config, adapter_for_model_type, runtime, runtime_mixins
from ..catalog import TASKS
from ..errors import HeadcutError, first_line
from ..files.space import os_error
from .checks import check_checkpoint, check_dtypes, check_loading, stored_dtypes, stored_values
from .record import check_record, expected_values

#: a config.json that describes more values than the weights hold by this factor (plus a margin for a
#: new task head) is refused before anything is allocated
SIZE_SLACK = 2
SIZE_MARGIN = 1 << 24


def model_class(config: Any, task: str | None = None, where: str | Path = "config.json") -> type:
    """The transformers class to load ``config`` with (``task`` picks an Auto class, else the
    config's ``architectures``, else the bare model). An ``architectures`` entry that is not a
    transformers class of the config's family is refused (``where`` names the config in the message):
    loading something else would leave the checkpoint's own weights unused."""
    return resolve_class(type(config), config.model_type, getattr(config, "architectures", None), task, where)


def resolve_class(config_class: type, model_type: str, architectures: Any, task: str | None, where: str | Path) -> type:
    """:func:`model_class` from a config class and the ``architectures`` of a config.json (before the
    config itself is built)."""
    if task is not None:
        if task not in TASKS:
            raise HeadcutError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        auto = getattr(transformers, TASKS[task])
        try:
            return auto._model_mapping[config_class]
        except KeyError:
            raise HeadcutError(f"{model_type} has no {task} model in transformers") from None
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        raise HeadcutError(f'{where}: "architectures" must be a list of class names, got {architectures!r:.80}')
    for name in architectures or []:
        plain = name.removeprefix("Headcut")
        cls = getattr(transformers, plain, None) if plain.isidentifier() and not plain.startswith("_") else None
        base = getattr(cls, "config_class", None)
        if not (
            isinstance(cls, type)
            and issubclass(cls, transformers.PreTrainedModel)
            and isinstance(base, type)
            and issubclass(config_class, base)
        ):
            raise HeadcutError(
                f"{where} names the architecture {name[:80]!r}, which is not a {model_type} model class "
                'of transformers: correct "architectures" in config.json, or pass --task to choose '
                "the model class"
            )
        return cls
    try:
        return transformers.AutoModel._model_mapping[config_class]
    except KeyError:
        raise HeadcutError(f"{model_type} has no base model in transformers") from None


def class_task(cls: type) -> str | None:
    """The task (:data:`headcut.catalog.TASKS`, but ``base``) whose transformers Auto class loads ``cls`` or a class
    it derives from (headcut's cut classes derive from the stock ones), or None."""
    names = {c.__name__ for c in cls.__mro__}
    for task, auto in TASKS.items():
        if task == "base":
            continue
        # the Auto class's names by model type (its lazy mapping's table: reading it imports no model)
        table = getattr(getattr(transformers, auto)._model_mapping, "_model_mapping", {})
        for value in table.values():
            if names & ({value} if isinstance(value, str) else set(value)):
                return task
    return None


def read_config_file(folder: Path) -> dict[str, Any]:
    """The JSON object of ``folder/config.json`` (one-line errors: unreadable, not JSON, too deep)."""
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_bytes())
    except PermissionError as exc:
        raise os_error("read", path, exc) from None
    except RecursionError:
        raise HeadcutError(f"cannot read the config of {folder}: {path} is nested too deeply") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise HeadcutError(f"cannot read the config of {folder}: {first_line(exc)}") from None
    if not isinstance(raw, dict):
        raise HeadcutError(f"cannot read the config of {folder}: {path} is not a JSON object")
    return raw


def _raw_lookup(raw: dict[str, Any], config_class: type, where: str) -> Callable[[str], Any]:
    """``get(field)`` over a config.json's values: the field under its own name or an alias of
    ``config_class.attribute_map``, else the class default, else MISSING."""
    aliases: dict[str, list[str]] = {}
    for alias, name in (getattr(config_class, "attribute_map", None) or {}).items():
        aliases.setdefault(name, []).append(alias)

    def get(name: str) -> Any:
        given = [n for n in (name, *aliases.get(name, ())) if n in raw]
        if len({json.dumps(raw[n]) for n in given}) > 1:
            raise HeadcutError(
                f"{where} gives {given[0]} and {given[1]} (the same field) different values; nothing was loaded"
            )
        if given:
            return raw[given[0]]
        default = getattr(config_class, name, MISSING)
        return default if default is None or isinstance(default, (int, float, str)) else MISSING

    return get


def check_config_numbers(
    adapter: Adapter, get: Callable[[str], Any], labels: Any, cls: type, where: str, stored: int | None = None
) -> None:
    """Refuse a config whose head, layer or size fields are not positive integers (or whose widths
    their head counts do not divide), a classifier without labels, and, given the values the
    weights hold (``stored``), a config that describes far more: all from the numbers alone, before
    anything is built. ``get``: see :meth:`Adapter.config_numbers`; ``labels``: its num_labels."""
    try:
        numbers = adapter.config_numbers(get)
    except ValueError as exc:
        raise HeadcutError(f"{where}: {exc}; nothing was loaded") from None
    if isinstance(labels, bool) or not isinstance(labels, int) or labels < 0:
        raise HeadcutError(f"{where}: num_labels is {labels!r:.40}; it must be a positive integer; nothing was loaded")
    name = cls.__name__.removeprefix("Headcut")
    if labels == 0 and name.endswith("Classification"):
        raise HeadcutError(f"{where}: num_labels is 0, but {name} needs at least one label; nothing was loaded")
    if stored is None:
        return
    width = next((numbers[s.width] for s in adapter.stacks if numbers.get(s.width)), 1) or 1
    described = adapter.min_values(numbers, name) + labels * width
    if described > SIZE_SLACK * stored + SIZE_MARGIN:
        raise HeadcutError(
            f"{where} describes at least {described:,} values but the weights hold {stored:,}; "
            "the config does not match the weights (damaged or crafted); nothing was loaded"
        )


def cut_class(cls: type) -> type:
    """``cls`` with the cut of ``config.headcut`` applied at construction (headcut's own loader)."""

    def __init__(self: nn.Module, config: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, config, *args, **kwargs)
        runtime.apply_cut(self, config, runtime_mixins())

    return type(f"Headcut{cls.__name__}", (cls,), {"__init__": __init__, "__module__": cls.__module__})


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' and the Hub's own loading bars and LOAD REPORT tables off for the block (headcut
    reports what it loads in its own words); their settings are restored afterwards."""
    import huggingface_hub

    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    hub_bars = not huggingface_hub.utils.are_progress_bars_disabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
        if hub_bars:
            huggingface_hub.utils.enable_progress_bars()


def _precheck_config(local: Path, task: str | None, stored: int | None, where: str) -> None:
    """The checks of config.json that need no config object and no model: its family, its model
    class, its numbers and the size they describe against the weights' headers (``stored``)."""
    raw = read_config_file(local)
    model_type = raw.get("model_type")
    if model_type is None:
        return  # AutoConfig may still tell the family from the folder's name; checked after it
    adapter = adapter_for_model_type(model_type)
    config_class = transformers.CONFIG_MAPPING[model_type] if model_type in transformers.CONFIG_MAPPING else None
    if config_class is None:
        return  # a family headcut knows but this transformers does not: AutoConfig says so next
    cls = resolve_class(config_class, model_type, raw.get("architectures"), task, where)
    if "num_labels" in raw:
        labels = raw["num_labels"]
    else:
        labels = len(raw["id2label"]) if isinstance(raw.get("id2label"), dict) else 2
    check_config_numbers(adapter, _raw_lookup(raw, config_class, where), labels, cls, where, stored)


def set_labels(config: Any, cls: type, labels: list[str], path: str | Path) -> None:
    """Give a new sequence-classification head of ``cls`` the label names ``labels``."""
    own = getattr(config, "architectures", None) or []
    if not cls.__name__.endswith("ForSequenceClassification"):
        raise HeadcutError(
            f"--labels names the classes of a new classification head: load {path} with --task sequence-classification"
        )
    if any(name.endswith("ForSequenceClassification") for name in own):
        raise HeadcutError(
            f"--labels is for a new classification head, and {path} has one already (labels: "
            f"{', '.join(map(str, config.id2label.values()))})"
        )
    names = [str(label).strip() for label in labels]
    if len(names) < 2 or len(set(names)) != len(names) or not all(names):
        raise HeadcutError(f"--labels needs two or more distinct names, got {','.join(names)!r}")
    config.num_labels = len(names)
    config.id2label = dict(enumerate(names))
    config.label2id = {name: i for i, name in enumerate(names)}


def open_checkpoint(
    path: str | Path, task: str | None, allow_pickle: bool, trust_remote_code: bool, labels: list[str] | None = None
) -> tuple[Path | None, str, Any, type, bool, bool]:
    """Every check :func:`load` makes before it allocates anything, and what it found: the local folder (None
    for a Hub name), the name transformers reads, the config, the model class (headcut's cut class for a
    slimmed model), whether the config has a headcut record and whether the class is the checkpoint's own."""
    local = check_checkpoint(path, allow_pickle)
    source = str(local) if local is not None else str(path)
    where = str(local / "config.json") if local is not None else f"{path} (config.json)"
    stored = None
    if local is not None:
        stored = stored_values(local) if any(f.name.endswith(".safetensors") for f in local.iterdir()) else None
        _precheck_config(local, task, stored, where)
    try:
        with quiet_transformers():
            config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except PermissionError as exc:
        raise os_error("read", exc.filename if exc.filename is not None else path, exc) from None
    except Exception as exc:  # a damaged or crafted config.json: any parse error is the user's input
        raise HeadcutError(f"cannot read the config of {path}: {first_line(exc)}") from None
    has_cut = getattr(config, "headcut", None) is not None
    if getattr(config, "auto_map", None) and not has_cut and not trust_remote_code:
        raise HeadcutError(f"{path} ships its own model code; pass --trust-remote-code to run it")
    adapter = adapter_for_config(config)
    cls = model_class(config, task, where)
    check_config_numbers(adapter, lambda name: getattr(config, name, MISSING), config.num_labels, cls, where, stored)
    if labels is not None:
        set_labels(config, cls, labels, path)
    skeleton = check_record(config, cls, str(path))
    if stored is not None:
        described = expected_values(skeleton)
        if described > SIZE_SLACK * stored + SIZE_MARGIN:
            raise HeadcutError(
                f"{path}: config.json describes {described:,} values but the weights hold {stored:,}; "
                "the config does not match the weights (damaged or crafted); nothing was loaded"
            )
    del skeleton
    own = cls.__name__ in (getattr(config, "architectures", None) or [])
    if has_cut:
        cls = cut_class(cls)
    return local, source, config, cls, has_cut, own


def load(
    path: str | os.PathLike[str],
    task: str | None = None,
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    attn_implementation: str | None = None,
    notes: list[str] | None = None,
    labels: list[str] | None = None,
) -> nn.Module:
    """Load a checkpoint (original or slimmed by headcut) for a supported family, in eval mode.

    Local folders must hold safetensors weights; pickle weights need ``allow_pickle=True`` and
    checkpoints that ship their own code need ``trust_remote_code=True`` (headcut's own saved files
    are not run: headcut applies the recorded cut itself). Non-local names are loaded from the
    Hugging Face Hub by transformers.

    Before anything is allocated, the headcut record of a slimmed model is validated (see
    :mod:`headcut.model.record`) and the size its config describes is compared with its weights' headers.
    Missing, unexpected or mis-shaped tensors are refused (a different ``task`` than the checkpoint's
    own may add a new head: ``notes`` then says which tensors were initialised at random).
    ``labels``: the label names of a new sequence-classification head (``task`` sequence-classification
    on a checkpoint without one), so data with string labels maps onto it.
    """
    local, source, config, cls, has_cut, own = open_checkpoint(path, task, allow_pickle, trust_remote_code, labels)
    # mis-shaped tensors come back in the loading info (and are refused by name below) instead of an
    # error that points at a report headcut keeps quiet
    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": dtype if dtype is not None else "auto",
        "output_loading_info": True,
        "ignore_mismatched_sizes": True,
    }
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    kwargs["use_safetensors"] = None if allow_pickle else True
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(source, **kwargs)
    except pickle.UnpicklingError:
        raise HeadcutError(
            f"refused {path}: its pickle weights hold more than tensors (torch's weights-only "
            "loader stopped them; they could run code)"
        ) from None
    except HeadcutError:
        raise
    except PermissionError as exc:
        raise os_error("read", exc.filename if exc.filename is not None else path, exc) from None
    except Exception as exc:  # damaged weights, unreadable files
        why = first_line(exc)
        if "above report" in why or "CONVERSION" in why:
            why = f"transformers could not convert its weights to {cls.__name__.removeprefix('Headcut')}"
        raise HeadcutError(f"cannot load {path}: {why}") from None
    check_loading(model, info, path, notes, new_head=task is not None and not own)
    if local is not None and any(local.glob("*.safetensors")):
        stored = stored_dtypes(local)
        check_dtypes(model, stored, path, lambda name: name)
    if device:
        model.to(device)
    return model.eval()


def auto_classes(config: Any) -> dict[str, str]:
    """Auto class name -> transformers class name, for every Auto class this family supports."""
    out: dict[str, str] = {}
    for name in dir(transformers):
        if not name.startswith("AutoModel"):
            continue
        auto = getattr(transformers, name)
        mapping = getattr(auto, "_model_mapping", None)
        names = getattr(mapping, "_model_mapping", None)
        if not isinstance(names, dict):
            continue
        cls_name = names.get(config.model_type)
        if isinstance(cls_name, str) and isinstance(getattr(transformers, cls_name, None), type):
            out[name] = cls_name
    return out
