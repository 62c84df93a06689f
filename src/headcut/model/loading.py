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

import inspect
import json
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from . import runtime
from ..adapters import MISSING, Adapter, adapter_for, adapter_for_config, adapter_for_model_type, runtime_mixins
from ..catalog import TASKS
from ..errors import HeadcutError, first_line
from ..files.atomic import OutputDir
from ..files.plan import check_paths
from ..files.names import inside
from ..files.space import os_error
from .record import check_record, expected_values
from .stock import CheckpointForm, stock_form
from ..sources import looks_like_path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".pkl")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HEADCUT_FILES = ("modeling_headcut.py", "headcut_runtime.py")
#: a config.json that describes more values than the weights hold by this factor (plus a margin for a
#: new task head) is refused before anything is allocated
SIZE_SLACK = 2
SIZE_MARGIN = 1 << 24

#: files of a source checkpoint that a saved model takes along (tokenizer, processor, generation and
#: special-token files, licences); nothing else is copied, never code
SIDE_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "source.spm",
    "target.spm", "bpe.codes", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "processor_config.json", "image_processor_config.json", "feature_extractor_config.json",
    "video_preprocessor_config.json", "generation_config.json", "LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE",
    "NOTICE.txt",
})


def link_root(folder: Path) -> Path:
    """Where a symbolic link in checkpoint ``folder`` may point: inside the folder, or, for a snapshot
    of the Hugging Face cache (``models--org--name/snapshots/REV``), inside that repository's cache."""
    real = folder.expanduser().resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith(("models--", "datasets--")):
        return real.parent.parent
    return real


def link_ok(file: Path, root: Path) -> bool:
    """Whether ``file`` is no symbolic link, or one whose target lies inside ``root``."""
    if not file.is_symlink():
        return True
    return inside(file.resolve(), root)


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those of its index, else ``model.safetensors``, else all."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise HeadcutError(f"{index} is damaged: it is not a safetensors index") from None
        if not all(isinstance(n, str) and "/" not in n and "\\" not in n for n in names):
            raise HeadcutError(f"{index} names weight files outside its folder")
        return [folder / n for n in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    return sorted(f for f in folder.iterdir() if f.name.endswith(".safetensors"))


def stored_values(folder: Path) -> int:
    """Values held by the safetensors weights of ``folder``, read from their headers (nothing is
    loaded); a truncated or damaged file is a one-line error."""
    from safetensors import SafetensorError, safe_open

    total = 0
    for f in weight_files(folder):
        if not f.is_file():
            raise HeadcutError(f"{folder}: weight file {f.name} is missing")
        readable(f)
        try:
            with safe_open(f, "pt") as handle:
                for key in handle.keys():
                    n = 1
                    for dim in handle.get_slice(key).get_shape():
                        n *= dim
                    total += n
        except (SafetensorError, OSError, ValueError) as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HeadcutError(f"{f} is damaged (truncated or not a safetensors file): {why}") from None
    return total


#: safetensors' dtype names of floating-point numbers
FLOATING = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def stored_dtypes(folder: Path) -> dict[str, str]:
    """The dtype (safetensors' name) of each tensor of ``folder``'s safetensors weights, from their headers."""
    from safetensors import safe_open

    out: dict[str, str] = {}
    for f in weight_files(folder):
        with safe_open(f, "pt") as handle:
            for key in handle.keys():
                out[key] = handle.get_slice(key).get_dtype()
    return out


def check_dtypes(model: nn.Module, stored: dict[str, str], path: str | Path, key: Callable[[str], str | None]) -> None:
    """Refuse a checkpoint that stores a tensor the model holds in floating point as integers or booleans, or the
    other way round (transformers would cast it and load numbers that mean nothing). ``stored``: checkpoint key ->
    dtype; ``key``: a model tensor's key in the checkpoint (None: not there)."""
    wrong = []
    for name, t in model.state_dict().items():
        k = key(name)
        if k is not None and k in stored and (stored[k] in FLOATING) != t.is_floating_point():
            wrong.append(f"{name}: {stored[k]} in the weights, {str(t.dtype).removeprefix('torch.')} in the model")
    if wrong:
        raise HeadcutError(f"cannot load {path}: {len(wrong)} tensor(s) are stored in the wrong kind of number "
                           f"({_first_few(wrong)}); the checkpoint is damaged or does not match its config.json")


def _first_few(items: list[str]) -> str:
    """The first four of ``items`` in a message, and how many more."""
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")


def readable(file: Path) -> None:
    """Refuse a file this process may not read: ``cannot read PATH: permission denied``."""
    try:
        with open(file, "rb"):
            pass
    except PermissionError as exc:
        raise os_error("read", file, exc) from None


def check_checkpoint(path: str | Path, allow_pickle: bool = False) -> Path | None:
    """Validate a local checkpoint folder; return None for a hub id. One-line errors.

    Refuses a folder without config.json or weights, pickle-only weights without ``allow_pickle``,
    symbolic links (of the config or weights) that point outside the checkpoint, safetensors files
    whose header is damaged or truncated, and a folder or file headcut would read (the config, the
    weights, the tokenizer and other side files) that this process may not read."""
    try:
        return _check_checkpoint(path, allow_pickle)
    except PermissionError as exc:  # the folder itself: listing it, or the status of a file in it
        culprit = Path(exc.filename) if exc.filename is not None else Path(path)
        if culprit.parent == Path(path).expanduser():
            culprit = Path(path)  # a file's status needs only the folder's permission
        raise os_error("read", culprit, exc) from None


def _check_checkpoint(path: str | Path, allow_pickle: bool) -> Path | None:
    p = Path(path).expanduser()
    if not p.exists():
        if looks_like_path(str(path)):
            raise HeadcutError(f"checkpoint not found: {path}")
        return None
    if not p.is_dir():
        raise HeadcutError(f"{path} is not a checkpoint folder (expected a folder with config.json)")
    if not (p / "config.json").is_file():
        raise HeadcutError(f"{path} is not a checkpoint: it has no config.json")
    files = [f for f in p.iterdir() if f.is_file()]
    safe = [f.name for f in files if f.name.endswith(".safetensors")]
    pickled = [f.name for f in files if f.name.endswith(PICKLE_SUFFIXES)]
    if not safe:
        if pickled and not allow_pickle:
            raise HeadcutError(
                f"{path} has only pickle weights ({pickled[0]}); pickle can run code when loaded, "
                "so headcut refuses it unless you pass --allow-pickle"
            )
        if not pickled:
            raise HeadcutError(f"{path} is not a checkpoint: it has no weights (*.safetensors)")
    root = link_root(p)
    for f in files:
        if (f.name == "config.json" or f.name.endswith(WEIGHT_SUFFIXES) or f.name.endswith(".index.json")) \
                and not link_ok(f, root):
            raise HeadcutError(f"{p / f.name} is a symbolic link to {f.resolve()}, outside the checkpoint; "
                               "headcut follows links only inside it: copy the file in")
    for f in files:
        if f.name == "config.json" or f.name.endswith(".index.json") or f.name in SIDE_FILES \
                or (not safe and f.name.endswith(PICKLE_SUFFIXES)):
            readable(f)
    if safe:
        stored_values(p)
    return p


def model_class(config: Any, task: str | None = None, where: str | Path = "config.json") -> type:
    """The transformers class to load ``config`` with (``task`` picks an Auto class, else the
    config's ``architectures``, else the bare model). An ``architectures`` entry that is not a
    transformers class of the config's family is refused (``where`` names the config in the message):
    loading something else would leave the checkpoint's own weights unused."""
    return resolve_class(type(config), config.model_type, getattr(config, "architectures", None), task, where)


def resolve_class(config_class: type, model_type: str, architectures: Any, task: str | None,
                  where: str | Path) -> type:
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
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise HeadcutError(f"{where}: \"architectures\" must be a list of class names, got {architectures!r:.80}")
    for name in architectures or []:
        plain = name.removeprefix("Headcut")
        cls = getattr(transformers, plain, None) if plain.isidentifier() and not plain.startswith("_") else None
        base = getattr(cls, "config_class", None)
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and isinstance(base, type)
                and issubclass(config_class, base)):
            raise HeadcutError(f"{where} names the architecture {name[:80]!r}, which is not a {model_type} model class "
                               "of transformers: correct \"architectures\" in config.json, or pass --task to choose "
                               "the model class")
        return cls
    try:
        return transformers.AutoModel._model_mapping[config_class]
    except KeyError:
        raise HeadcutError(f"{model_type} has no base model in transformers") from None


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
            raise HeadcutError(f"{where} gives {given[0]} and {given[1]} (the same field) different values; "
                               "nothing was loaded")
        if given:
            return raw[given[0]]
        default = getattr(config_class, name, MISSING)
        return default if default is None or isinstance(default, (int, float, str)) else MISSING

    return get


def check_config_numbers(adapter: Adapter, get: Callable[[str], Any], labels: Any, cls: type, where: str,
                         stored: int | None = None) -> None:
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
        raise HeadcutError(f"{where} describes at least {described:,} values but the weights hold {stored:,}; "
                           "the config does not match the weights (damaged or crafted); nothing was loaded")


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


def check_loading(model: nn.Module, info: dict[str, Any], path: str | Path, notes: list[str] | None,
                   new_head: bool = False) -> None:
    """Refuse missing, unexpected or mis-shaped tensors, naming the first few (``info``: transformers' loading info,
    or the same keys computed from a checkpoint's headers by the layer-wise path). Only a new task head
    (``new_head``: an explicit ``--task`` other than the checkpoint's own class) may be missing, and
    the checkpoint's own head unused: those become notes."""
    cls_name = type(model).__name__.removeprefix("Headcut")
    prefix = getattr(model, "base_model_prefix", "")
    is_base = model.base_model is model
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    mismatched = sorted((tuple(k) if isinstance(k, (tuple, list)) else (k,)) for k in info.get("mismatched_keys") or [])

    def shape(value: Any) -> str:
        return "(" + ", ".join(map(str, value)) + ")" if isinstance(value, (tuple, list, torch.Size)) else str(value)

    if mismatched:
        names = [f"{k[0]}: {shape(k[1])} in the weights, {shape(k[2])} in the model" if len(k) == 3 else str(k[0])
                 for k in mismatched]
        raise HeadcutError(f"cannot load {path}: {len(mismatched)} tensor(s) have the wrong shape ({_first_few(names)}); "
                           "the checkpoint is damaged or does not match its config.json")
    base_missing = missing if not new_head or is_base else [k for k in missing if k.startswith(prefix + ".")]
    if base_missing:
        raise HeadcutError(f"cannot load {path}: {len(base_missing)} tensor(s) missing from its weights "
                           f"({_first_few(base_missing)}); the checkpoint is damaged or does not match its config.json")
    if unexpected and not new_head:
        raise HeadcutError(f"cannot load {path}: {len(unexpected)} unexpected tensor(s) in its weights "
                           f"({_first_few(unexpected)}) that {cls_name} does not use; the checkpoint is damaged or does "
                           "not match its config.json")
    if notes is not None:
        head = [k for k in missing if k not in base_missing]
        if head:
            notes.append(f"{cls_name} has a new task head: {len(head)} tensor(s) initialised at random ({_first_few(head)})")
        if unexpected:
            notes.append(f"{len(unexpected)} tensor(s) of the checkpoint are not used by {cls_name} ({_first_few(unexpected)})")


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
        raise HeadcutError(f"--labels names the classes of a new classification head: load {path} with --task "
                           "sequence-classification")
    if any(name.endswith("ForSequenceClassification") for name in own):
        raise HeadcutError(f"--labels is for a new classification head, and {path} has one already (labels: "
                           f"{', '.join(map(str, config.id2label.values()))})")
    names = [str(label).strip() for label in labels]
    if len(names) < 2 or len(set(names)) != len(names) or not all(names):
        raise HeadcutError(f"--labels needs two or more distinct names, got {','.join(names)!r}")
    config.num_labels = len(names)
    config.id2label = dict(enumerate(names))
    config.label2id = {name: i for i, name in enumerate(names)}


def open_checkpoint(path: str | Path, task: str | None, allow_pickle: bool, trust_remote_code: bool,
                    labels: list[str] | None = None) -> tuple[Path | None, str, Any, type, bool, bool]:
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
            raise HeadcutError(f"{path}: config.json describes {described:,} values but the weights hold {stored:,}; "
                               "the config does not match the weights (damaged or crafted); nothing was loaded")
    del skeleton
    own = cls.__name__ in (getattr(config, "architectures", None) or [])
    if has_cut:
        cls = cut_class(cls)
    return local, source, config, cls, has_cut, own


def load(
    path: str | Path,
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
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype if dtype is not None else "auto",
                              "output_loading_info": True, "ignore_mismatched_sizes": True}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    kwargs["use_safetensors"] = None if allow_pickle else True
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(source, **kwargs)
    except pickle.UnpicklingError:
        raise HeadcutError(f"refused {path}: its pickle weights hold more than tensors (torch's weights-only "
                           "loader stopped them; they could run code)") from None
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


def _runtime_source(config: Any) -> str:
    adapter = adapter_for_config(config)
    parts = [inspect.getsource(runtime)]
    for mixin in adapter.runtime_mixins:
        parts.append(inspect.getsource(mixin))
    return "\n\n".join(parts)


def _modeling_source(classes: dict[str, str]) -> str:
    from .. import __version__

    lines = [
        f'"""Generated by headcut {__version__}: the original transformers classes with the head cut',
        'recorded in config.json ("headcut") applied at construction. Needs torch and transformers only."""',
        "",
        "import transformers",
        "",
        "from .headcut_runtime import apply_cut",
        "",
    ]
    for cls_name in sorted(set(classes.values())):
        lines += [
            "",
            f"class Headcut{cls_name}(transformers.{cls_name}):",
            "    def __init__(self, config, *args, **kwargs):",
            "        super().__init__(config, *args, **kwargs)",
            "        apply_cut(self, config)",
            "",
        ]
    return "\n".join(lines)


def _hub_code(ref: Any) -> bool:
    """Whether an ``auto_map`` value names code on the Hub (``org/repo--module.Class``), not a file
    shipped beside the checkpoint."""
    refs = ref if isinstance(ref, list) else [ref]
    return all(r is None or (isinstance(r, str) and "--" in r) for r in refs)


def _clean_auto_map(name: str, text: str, trust_remote_code: bool, notes: list[str]) -> str:
    """``text`` of a JSON side file without ``auto_map`` entries that would run foreign code."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if not isinstance(data, dict) or not data.get("auto_map"):
        return text
    entries = data["auto_map"] if isinstance(data["auto_map"], dict) else {}
    kept = {k: v for k, v in entries.items() if trust_remote_code and _hub_code(v)}
    dropped = sorted(set(entries) - set(kept)) or ["auto_map"]
    if kept:
        data["auto_map"] = kept
    else:
        del data["auto_map"]
    why = "it names code files headcut does not copy" if trust_remote_code else "it would run foreign code " \
        "(keep Hub references with --trust-remote-code)"
    notes.append(f"{name}: dropped auto_map entries {', '.join(dropped)}: {why}")
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def copy_side_files(source: str | Path | None, dest: Path, trust_remote_code: bool = False) -> tuple[list[str], list[str]]:
    """Copy the tokenizer, processor, generation and licence files of a local source checkpoint
    (:data:`SIDE_FILES`, nothing else: no code). A symbolic link is followed only inside the checkpoint
    (or its Hugging Face cache repository) and copied as a plain file; ``auto_map`` entries that name
    foreign code are dropped. Returns the names copied and notes on what was left out."""
    copied: list[str] = []
    notes: list[str] = []
    if source is None:
        return copied, notes
    src = Path(source).expanduser()
    if not src.is_dir():
        return copied, notes
    root = link_root(src)
    skipped = []
    for f in sorted(src.iterdir(), key=lambda p: p.name):
        if f.name not in SIDE_FILES:
            if f.suffix == ".py" and f.name not in HEADCUT_FILES:
                skipped.append(f.name)
            continue
        if (dest / f.name).exists() or not f.is_file():
            continue
        if not link_ok(f, root):
            notes.append(f"{f.name} not copied: it is a symbolic link to {f.resolve()}, outside the checkpoint")
            continue
        try:
            data = f.read_bytes()
        except PermissionError as exc:  # a read error, not one of writing the output
            raise os_error("read", f, exc) from None
        if f.suffix == ".json":
            text = _clean_auto_map(f.name, data.decode("utf-8", errors="replace"), trust_remote_code, notes)
            (dest / f.name).write_text(text, encoding="utf-8")
        else:
            (dest / f.name).write_bytes(data)
        copied.append(f.name)
    if skipped:
        notes.append(f"not copied (code): {', '.join(skipped)}")
    return copied, notes


def write_checkpoint(model: nn.Module, folder: Path, source: str | Path | None = None,
                     trust_remote_code: bool = False, form: CheckpointForm | None = None) -> list[str]:
    """Write ``model`` into an existing empty folder (see :func:`save` for the atomic version) in ``form``
    (default: :func:`headcut.model.stock.stock_form`: a plain transformers checkpoint where the cut allows it,
    else headcut's form with ``modeling_headcut.py``); returns notes on the side files left out."""
    form = form if form is not None else stock_form(model)
    written = form.model if form.stock and form.model is not None else model
    with quiet_transformers():
        written.save_pretrained(folder, save_original_format=False)
    return finish_checkpoint(model, folder, source, trust_remote_code, form)


def finish_checkpoint(model: nn.Module, folder: Path, source: str | Path | None, trust_remote_code: bool,
                      form: CheckpointForm) -> list[str]:
    """The files of a checkpoint beside its weights (:func:`write_checkpoint` wrote ``config.json`` with them;
    else it is written here): the config in ``form`` (the stock config, or headcut's record with
    ``modeling_headcut.py``), and the source's side files; returns notes on the side files left out."""
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        written = form.model if form.stock and form.model is not None else model
        with quiet_transformers():
            written.config.save_pretrained(folder)
            generation = getattr(model, "generation_config", None)
            if generation is not None and model.can_generate():
                generation.save_pretrained(folder)
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [form.architecture]
    cfg.pop("auto_map", None)
    cfg.pop("custom_pipelines", None)
    if form.stock:
        cfg.pop("headcut", None)
    elif cfg.get("headcut"):
        classes = auto_classes(model.config)
        cfg["auto_map"] = {auto: f"modeling_headcut.Headcut{name}" for auto, name in sorted(classes.items())}
        (folder / "modeling_headcut.py").write_text(_modeling_source(classes))
        (folder / "headcut_runtime.py").write_text(_runtime_source(model.config))
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return copy_side_files(source, folder, trust_remote_code)[1]


@dataclass
class SavedModel(os.PathLike):
    """Where :func:`save` wrote a model (usable as a path) and what it left out (``notes``)."""

    path: Path
    notes: list[str] = field(default_factory=list)
    #: how it was written: stock transformers or headcut's form (see :mod:`headcut.model.stock`)
    form: CheckpointForm | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


def save(
    model: nn.Module,
    out: str | Path | OutputDir,
    source: str | Path | None = None,
    force: bool = False,
    extra: Callable[[Path], None] | None = None,
    trust_remote_code: bool = False,
    form: CheckpointForm | None = None,
) -> SavedModel:
    """Save ``model`` to ``out`` atomically (temporary folder, then rename); see :mod:`headcut.files`.

    ``source`` is the checkpoint folder the model came from (its tokenizer files are copied, see
    :func:`copy_side_files`); ``extra`` may write more files (a report) into the temporary folder
    before the rename. ``out`` may be an :class:`~headcut.files.atomic.OutputDir` the caller checked and
    locked before its work; a path is checked and locked here. ``force`` replaces an existing folder
    only if headcut wrote it. ``form``: how to write it (default: :func:`headcut.model.stock.stock_form`, a
    plain transformers checkpoint when the cut allows it)."""
    adapter_for(model)
    if source is not None:
        check_paths({"source": source}, {"--out": out.path if isinstance(out, OutputDir) else out})
    target = out if isinstance(out, OutputDir) else OutputDir(out, force)
    held = target.lock.held
    if not held:
        target.check()
        target.acquire()
    form = form if form is not None else stock_form(model)
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()  # tied tensors once
    try:
        with target.staging(need=sum(t.numel() * t.element_size() for t in tensors)) as tmp:
            notes = write_checkpoint(model, tmp, source, trust_remote_code, form)
            if extra is not None:
                extra(tmp)
    finally:
        if not held:
            target.release()
    return SavedModel(Path(target.path), notes, form)
