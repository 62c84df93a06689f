"""Loading checkpoints safely and saving slimmed models atomically.

Saved layout (a normal transformers checkpoint plus two small files):

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
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from . import runtime
from .adapters import adapter_for, adapter_for_config, runtime_mixins
from .errors import HeadcutError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".pkl")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HEADCUT_FILES = ("modeling_headcut.py", "headcut_runtime.py")

#: ``--task`` values and the Auto class each one loads with
TASKS: dict[str, str] = {
    "base": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is meant as a local path: a Hub id is "name" or "org/name"."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def check_checkpoint(path: str | Path, allow_pickle: bool = False) -> Path | None:
    """Validate a local checkpoint folder; return None for a hub id. One-line errors."""
    p = Path(path).expanduser()
    if not p.exists():
        if looks_like_path(str(path)):
            raise HeadcutError(f"checkpoint not found: {path}")
        return None
    if not p.is_dir():
        raise HeadcutError(f"{path} is not a checkpoint folder (expected a folder with config.json)")
    if not (p / "config.json").is_file():
        raise HeadcutError(f"{path} is not a checkpoint: it has no config.json")
    files = [f.name for f in p.iterdir() if f.is_file()]
    safe = [f for f in files if f.endswith(".safetensors")]
    pickled = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
    if not safe:
        if pickled and not allow_pickle:
            raise HeadcutError(
                f"{path} has only pickle weights ({pickled[0]}); pickle can run code when loaded, "
                "so headcut refuses it unless you pass --allow-pickle"
            )
        if not pickled:
            raise HeadcutError(f"{path} is not a checkpoint: it has no weights (*.safetensors)")
    return p


def model_class(config: Any, task: str | None = None) -> type:
    """The transformers class to load ``config`` with (``task`` picks an Auto class)."""
    if task is not None:
        if task not in TASKS:
            raise HeadcutError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        auto = getattr(transformers, TASKS[task])
        try:
            return auto._model_mapping[type(config)]
        except KeyError:
            raise HeadcutError(f"{config.model_type} has no {task} model in transformers") from None
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name.removeprefix("Headcut"), None)
        if isinstance(cls, type):
            return cls
    return transformers.AutoModel._model_mapping[type(config)]


def cut_class(cls: type) -> type:
    """``cls`` with the cut of ``config.headcut`` applied at construction (headcut's own loader)."""

    def __init__(self: nn.Module, config: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, config, *args, **kwargs)
        runtime.apply_cut(self, config, runtime_mixins())

    return type(f"Headcut{cls.__name__}", (cls,), {"__init__": __init__, "__module__": cls.__module__})


def load(
    path: str | Path,
    task: str | None = None,
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    attn_implementation: str | None = None,
) -> nn.Module:
    """Load a checkpoint (original or slimmed by headcut) for a supported family, in eval mode.

    Local folders must hold safetensors weights; pickle weights need ``allow_pickle=True`` and
    checkpoints that ship their own code need ``trust_remote_code=True`` (headcut's own saved files
    are not run: headcut applies the recorded cut itself). Non-local names are loaded from the
    Hugging Face Hub by transformers.
    """
    local = check_checkpoint(path, allow_pickle)
    source = str(local) if local is not None else str(path)
    try:
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise HeadcutError(f"cannot read the config of {path}: {str(exc).splitlines()[0]}") from None
    has_cut = bool(getattr(config, "headcut", None))
    if getattr(config, "auto_map", None) and not has_cut and not trust_remote_code:
        raise HeadcutError(f"{path} ships its own model code; pass --trust-remote-code to run it")
    adapter_for_config(config)
    cls = model_class(config, task)
    if has_cut:
        cls = cut_class(cls)
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype if dtype is not None else "auto"}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if allow_pickle:
        kwargs["use_safetensors"] = None
    else:
        kwargs["use_safetensors"] = True
    try:
        model = cls.from_pretrained(source, **kwargs)
    except (OSError, ValueError, RuntimeError) as exc:
        raise HeadcutError(f"cannot load {path}: {str(exc).strip().splitlines()[0]}") from None
    if device:
        model.to(device)
    return model.eval()


def check_output(out: str | Path, force: bool) -> Path:
    """Refuse an existing non-empty output without ``force`` (before any work starts)."""
    p = Path(out).expanduser()
    if p.exists():
        if p.is_dir() and not any(p.iterdir()):
            return p
        if not force:
            raise HeadcutError(f"{out} already exists and is not empty; pass --force to replace it")
    return p


@contextmanager
def atomic_dir(out: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``out``; on success it becomes ``out``, on any error or
    interruption (Ctrl-C included) it is removed and ``out`` is left as it was."""
    final = check_output(out, force)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.headcut-", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.headcut-old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _auto_classes(config: Any) -> dict[str, str]:
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
    from . import __version__

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


TOKENIZER_SKIP = {"config.json", "generation_config.json", "headcut-report.json", *HEADCUT_FILES}


def copy_side_files(source: str | Path | None, dest: Path) -> list[str]:
    """Copy tokenizer/processor and other non-weight files of a local source checkpoint."""
    if source is None:
        return []
    src = Path(source)
    if not src.is_dir():
        return []
    copied = []
    for f in sorted(src.iterdir()):
        if not f.is_file() or f.name in TOKENIZER_SKIP or f.name.endswith(WEIGHT_SUFFIXES):
            continue
        if f.name.endswith(".index.json") or (dest / f.name).exists():
            continue
        shutil.copy2(f, dest / f.name)
        copied.append(f.name)
    return copied


def write_checkpoint(model: nn.Module, folder: Path, source: str | Path | None = None) -> None:
    """Write ``model`` into an existing empty folder (see :func:`save` for the atomic version)."""
    original = type(model)
    while original.__name__.startswith("Headcut") and original.__bases__:
        original = original.__bases__[0]
    model.save_pretrained(folder, save_original_format=False)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [original.__name__]
    cfg.pop("auto_map", None)
    if cfg.get("headcut"):
        classes = _auto_classes(model.config)
        cfg["auto_map"] = {auto: f"modeling_headcut.Headcut{name}" for auto, name in sorted(classes.items())}
        (folder / "modeling_headcut.py").write_text(_modeling_source(classes))
        (folder / "headcut_runtime.py").write_text(_runtime_source(model.config))
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    copy_side_files(source, folder)


def save(
    model: nn.Module,
    out: str | Path,
    source: str | Path | None = None,
    force: bool = False,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Save ``model`` to ``out`` atomically (temporary folder, then rename).

    ``source`` is the checkpoint folder the model came from (its tokenizer files are copied);
    ``extra`` may write more files (a report) into the temporary folder before the rename."""
    adapter_for(model)
    with atomic_dir(out, force) as tmp:
        write_checkpoint(model, tmp, source)
        if extra is not None:
            extra(tmp)
    return Path(out)
