"""Checks of a checkpoint before and after it loads: its files (weights, links out of the folder, pickles), the
values and dtypes its safetensors store, and what the loaded model left missing, shaped otherwise or unused."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import HeadcutError
from ..files.names import inside
from ..files.space import os_error
from ..sources import looks_like_path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".pkl")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

#: files of a source checkpoint that a saved model takes along (tokenizer, processor, generation and
#: special-token files, licences); nothing else is copied, never code
SIDE_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.txt",
        "vocab.json",
        "merges.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tokenizer.model",
        "source.spm",
        "target.spm",
        "bpe.codes",
        "chat_template.jinja",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
        "image_processor_config.json",
        "feature_extractor_config.json",
        "video_preprocessor_config.json",
        "generation_config.json",
        "LICENSE",
        "LICENSE.txt",
        "LICENSE.md",
        "NOTICE",
        "NOTICE.txt",
    }
)


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
        raise HeadcutError(
            f"cannot load {path}: {len(wrong)} tensor(s) are stored in the wrong kind of number "
            f"({_first_few(wrong)}); the checkpoint is damaged or does not match its config.json"
        )


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


def check_checkpoint(path: str | os.PathLike[str], allow_pickle: bool = False) -> Path | None:
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
        if (
            f.name == "config.json" or f.name.endswith(WEIGHT_SUFFIXES) or f.name.endswith(".index.json")
        ) and not link_ok(f, root):
            raise HeadcutError(
                f"{p / f.name} is a symbolic link to {f.resolve()}, outside the checkpoint; "
                "headcut follows links only inside it: copy the file in"
            )
    for f in files:
        if (
            f.name == "config.json"
            or f.name.endswith(".index.json")
            or f.name in SIDE_FILES
            or (not safe and f.name.endswith(PICKLE_SUFFIXES))
        ):
            readable(f)
    if safe:
        stored_values(p)
    return p


def check_loading(
    model: nn.Module, info: dict[str, Any], path: str | Path, notes: list[str] | None, new_head: bool = False
) -> None:
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
        names = [
            f"{k[0]}: {shape(k[1])} in the weights, {shape(k[2])} in the model" if len(k) == 3 else str(k[0])
            for k in mismatched
        ]
        raise HeadcutError(
            f"cannot load {path}: {len(mismatched)} tensor(s) have the wrong shape ({_first_few(names)}); "
            "the checkpoint is damaged or does not match its config.json"
        )
    base_missing = missing if not new_head or is_base else [k for k in missing if k.startswith(prefix + ".")]
    if base_missing:
        raise HeadcutError(
            f"cannot load {path}: {len(base_missing)} tensor(s) missing from its weights "
            f"({_first_few(base_missing)}); the checkpoint is damaged or does not match its config.json"
        )
    if unexpected and not new_head:
        raise HeadcutError(
            f"cannot load {path}: {len(unexpected)} unexpected tensor(s) in its weights "
            f"({_first_few(unexpected)}) that {cls_name} does not use; the checkpoint is damaged or does "
            "not match its config.json"
        )
    if notes is not None:
        head = [k for k in missing if k not in base_missing]
        if head:
            notes.append(
                f"{cls_name} has a new task head: {len(head)} tensor(s) initialised at random ({_first_few(head)})"
            )
        if unexpected:
            notes.append(
                f"{len(unexpected)} tensor(s) of the checkpoint are not used by {cls_name} ({_first_few(unexpected)})"
            )
