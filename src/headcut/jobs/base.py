"""The job skeleton every command shares: loading the model (or taking a loaded one), reading data into
calibration batches, checking data specs, choosing the device, and the report's record of the arguments; the
building blocks ``headcut.load`` and ``headcut.save``. Beside it: :mod:`.saving` (a model with its report and card),
:mod:`.agreement` (several processes), :mod:`.bars` (progress bars), :mod:`.results` (the results).

Each command is one module beside this one (``info``, ``evaluate``, ``score``, ``export``, ``prune``,
``finetune``, ``bench``), a function a user calls as ``headcut.<command>`` (see :mod:`headcut.api`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeAlias

import torch
from torch import nn

from ..arguments.table import checked
from ..data import Calibration, DataConfig, load_calibration, load_tokenizer, looks_local
from ..data.files import precheck
from ..errors import HeadcutError, label
from ..model import loading as io
from ..model import saving
from ..progress import Reporter
from ..training.distributed import from_env

ModelLike: TypeAlias = str | os.PathLike[str] | nn.Module


@dataclass
class LoadedModel:
    """A model the API works on: the module, its name for reports, and its local folder (or None)."""

    module: nn.Module
    name: str
    folder: Path | None
    given_module: bool = False


def source_folder(model: nn.Module) -> Path | None:
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    p = Path(path).expanduser() if path else None
    return p if p is not None and (p / "config.json").is_file() else None


def load_model(
    model: ModelLike,
    task: str | None,
    allow_pickle: bool,
    trust_remote_code: bool,
    notes: list[str],
    progress: Reporter,
    seed: int = 0,
    **kwargs: Any,
) -> LoadedModel:
    """Load ``model`` (a module is used as it is). Weights the checkpoint lacks (a new task head) are
    initialised from ``seed``, so the same command gives the same model; the global RNG is left as it was."""
    if isinstance(model, nn.Module):
        folder = source_folder(model)
        return LoadedModel(
            model,
            str(folder) if folder is not None else type(model).__name__.removeprefix("Headcut"),
            folder,
            given_module=True,
        )
    name = str(model)
    with progress.step(f"loading {name}"), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = io.load(
            model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, notes=notes, **kwargs
        )
    local = Path(model).expanduser()
    return LoadedModel(module, name, local if local.is_dir() else None)


def check_data_spec(spec: Any, flag: str) -> None:
    """Refuse a missing local data file before minutes of model loading."""
    path = spec.path if isinstance(spec, DataConfig) else spec
    if isinstance(path, (str, os.PathLike)):
        text = str(path)
        if not text.strip():
            raise HeadcutError(f"no data given: pass {flag} FILE (or a datasets name)")
        if looks_local(text) and not Path(text).expanduser().exists():
            raise HeadcutError(f"data file not found: {text}")


def data_config(spec: Any, split: str, data_options: Mapping[str, Any] | None, seed: int) -> DataConfig:
    if isinstance(spec, DataConfig):
        config = spec
    else:
        path = str(spec) if isinstance(spec, (str, os.PathLike)) else "<in-memory dataset>"
        options = dict(data_options or {})
        allowed = {f.name for f in fields(DataConfig)} - {"path", "split", "seed"}
        wrong = sorted(set(options) - allowed)
        if wrong:
            raise HeadcutError(f"unknown data option {wrong[0]!r}; data options: {', '.join(sorted(allowed))}")
        config = DataConfig(path=path, split=split, seed=seed, **options)
    config.validate()
    return config


def checked_data(spec: Any, split: str, data_options: Mapping[str, Any] | None, seed: int) -> Any:
    """``spec`` as a checked :class:`DataConfig` where it names data (rows and ready configs as they are), its file
    refused before minutes of model loading if the run could not read it (:func:`headcut.data.files.precheck`)."""
    if not isinstance(spec, (str, os.PathLike, DataConfig)):
        return spec
    config = data_config(spec, split, data_options, seed)
    precheck(config)
    return config


def model_tokenizer(model: LoadedModel, tokenizer: Any, trust_remote_code: bool) -> Any:
    """``tokenizer`` if given, else the tokenizer of the model's checkpoint folder (or Hub id)."""
    if tokenizer is not None:
        return tokenizer

    if model.folder is None and model.given_module:
        raise HeadcutError("pass tokenizer= for a model that was not loaded from a checkpoint folder")
    source = str(model.folder) if model.folder is not None else model.name
    with io.quiet_transformers():
        return load_tokenizer(source, trust_remote_code=trust_remote_code)


def calibration(
    spec: Any,
    model: LoadedModel,
    tokenizer: Any,
    split: str,
    data_options: Mapping[str, Any] | None,
    seed: int,
    trust_remote_code: bool,
    progress: Reporter,
    what: str,
    unlabelled: bool = False,
) -> Calibration | None:
    """``spec`` (see the module's doc) as model-ready batches (``unlabelled``: inputs only, see
    :func:`headcut.data.load_calibration`). A :class:`DataConfig` is read as it is: the request checked it
    (:func:`checked_data`, :func:`data_specs`)."""
    if spec is None or isinstance(spec, Calibration):
        return spec
    config = spec if isinstance(spec, DataConfig) else data_config(spec, split, data_options, seed)

    tokenizer = model_tokenizer(model, tokenizer, trust_remote_code)
    dataset = None if isinstance(spec, (str, os.PathLike, DataConfig)) else spec
    with progress.step(f"reading {what}"):
        return load_calibration(model.module, tokenizer, config, dataset=dataset, unlabelled=unlabelled, checked=True)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def same_data(a: Any, b: Any) -> str | None:
    """Why two data specs are the same data (the same file, files with identical bytes, the same
    ``datasets`` name, config and split, or the same object), else None."""
    if a is b:
        return "both are the same object"
    if not (isinstance(a, DataConfig) and isinstance(b, DataConfig)):
        return None
    if looks_local(a.path) and looks_local(b.path):
        pa, pb = Path(a.path).expanduser(), Path(b.path).expanduser()
        if not (pa.is_file() and pb.is_file()):
            return None
        if os.path.samefile(pa, pb):
            return f"both are {a.path}"
        if pa.stat().st_size == pb.stat().st_size and file_digest(pa) == file_digest(pb):
            return f"{a.path} and {b.path} have identical contents"
        return None
    if a.path == b.path and a.split == b.split and a.config_name == b.config_name:
        return f"both are {a.path} split {a.split}"
    return None


def data_specs(
    data: Any, eval_data: Any, split: str, eval_split: str, data_options: Mapping[str, Any] | None, seed: int
) -> tuple[Any, Any]:
    """The data and eval-data specs as DataConfigs where they are names; refuses the same data twice."""
    for spec, flag in ((data, label("data")), (eval_data, label("eval_data"))):
        if spec is not None:
            check_data_spec(spec, flag)
    d = checked_data(data, split, data_options, seed)
    e = checked_data(eval_data, eval_split, data_options, seed)
    if d is not None and e is not None:
        why = same_data(d, e)
        if why:
            raise HeadcutError(
                f"{label('data')} and {label('eval_data')} are the same data ({why}): training or "
                "calibration data and evaluation data must differ; hold out part of the data for "
                f"{label('eval_data')}"
            )
    return d, e


def pick_device(device: str | None) -> Any:

    dist = from_env()
    return dist, dist.device(device or "auto")


def move(model: nn.Module, device: Any) -> None:
    if next(model.parameters()).device != device:
        model.to(device)


def plain_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """A function's arguments as plain JSON values (for a report's ``arguments``)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("progress", "tokenizer") or value is None:
            continue
        if isinstance(value, (str, int, float, bool)):
            out[key] = value
        elif isinstance(value, os.PathLike):
            out[key] = str(value)
        elif isinstance(value, DataConfig):
            out[key] = asdict(value)
        elif isinstance(value, Mapping):
            out[key] = plain_arguments(dict(value))
        else:
            out[key] = f"<{type(value).__name__}>"
    return out


#: :func:`headcut.model.loading.load` with its arguments checked first (``headcut.load``)
load = checked("load")(io.load)


#: :func:`headcut.model.saving.save` with its arguments checked first (``headcut.save``)
save = checked("save")(saving.save)
