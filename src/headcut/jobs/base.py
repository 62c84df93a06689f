"""The job skeleton every command shares: loading the model (or taking a loaded one), reading data into
calibration batches, checking data specs, choosing the device, the progress bars of training jobs, saving
a model with its report and card (:func:`save_model`; the results: :mod:`.results`), and the report's record of the arguments.

Each command is one module beside this one (``info``, ``evaluate``, ``score``, ``export``, ``prune``,
``finetune``, ``bench``), a function a user calls as ``headcut.<command>`` (see :mod:`headcut.api`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeAlias

import torch
from torch import nn

from ..arguments.table import checked
from ..data import Calibration, DataConfig, looks_local
from ..data.files import precheck
from ..errors import HeadcutError, first_line, label
from ..files.atomic import OutputDir
from ..files.names import real_path
from ..files.plan import check_paths
from ..model import loading as io
from ..model import saving
from ..outputs.formats import check_formats
from ..outputs.reports import weights_bytes
from ..progress import Reporter, Task

ModelLike: TypeAlias = str | os.PathLike[str] | nn.Module


# ---- models, tokenizers and data ------------------------------------------------------------------


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
    from ..data import load_tokenizer

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
    from ..data import load_calibration

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
    from ..training.distributed import from_env

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


# ---- several processes: the agreement before training ---------------------------------------------------


class Agreement:
    """The setup of a job that may run in several processes (``torchrun``, ``accelerate launch``), up to the
    agreement of its processes (:meth:`headcut.training.distributed.Dist.agree`). The job runs inside
    :meth:`guard` and calls :meth:`agree` once its model and data are loaded, before its first collective. An
    error before that point, in any process, goes to the other processes through the agreement (the process
    joins the process group for it if it had not yet), so that every process stops at once with the failed
    process's line instead of waiting for it (torchrun would SIGKILL a process blocked in a collective after 30
    seconds; one blocked in the process group's rendezvous waits for 30 minutes)."""

    def __init__(self) -> None:
        #: whether this process has taken part in the agreement (every later error is its own)
        self.reached = False

    def agree(self, dist: Any, fingerprint: Callable[[], Mapping[str, str]]) -> None:
        """The agreement of ``dist``'s processes on ``fingerprint()`` (:func:`run_fingerprint`; computed only
        when there are several processes; an error computing it goes to the others as any setup error)."""
        mine = fingerprint() if dist.active else {}
        self.reached = True
        dist.agree(mine)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """The job: an error before :meth:`agree` in a run of several processes is exchanged with the other
        processes, and every process raises the same one line (``process 1: <its error>``); the failed process
        raises its own error as it is when it is not a refusal (a bug keeps its traceback). After the agreement,
        a collective that fails because another process went away is a one-line error."""
        from ..training.distributed import from_env, launched_processes, lost_process

        try:
            yield
        except Exception as exc:
            if launched_processes() <= 1:
                raise
            if self.reached:
                lost = lost_process(exc)
                if lost is None:
                    raise
                raise lost from None
            self.reached = True
            message, refusal = _setup_error(exc)
            agreed: HeadcutError | None = None
            try:
                dist = from_env()
            except Exception:
                raise exc from None
            try:
                dist.agree(error=message)
            except HeadcutError as stop:
                agreed = stop
            if agreed is not None and refusal:
                raise agreed from None
            raise


def _setup_error(exc: Exception) -> tuple[str, bool]:
    """What the other processes are told of ``exc`` (a refusal's own message, its options marked as
    :func:`headcut.errors.label` marks them) and whether it is a refusal (one line, no traceback)."""
    if isinstance(exc, HeadcutError):
        return Exception.__str__(exc), True
    if isinstance(exc, OSError):
        from ..files.space import file_error

        error = file_error(exc)
        if error is not None:
            return Exception.__str__(error), True
    return f"{type(exc).__name__}: {first_line(exc)}", False


#: values of each parameter that a model's digest in :func:`run_fingerprint` reads (with every name and shape)
SAMPLED_VALUES = 64


def weights_digest(model: nn.Module) -> str:
    """A digest of ``model``'s weights: every name, dtype and shape, and the first :data:`SAMPLED_VALUES` values
    of each tensor (two copies of different checkpoints differ there; reading every weight would cost seconds a
    gigabyte)."""
    from ..training.checkpoint import digest

    return digest(
        {
            name: [str(t.dtype), list(t.shape), None if t.is_meta else t.detach().reshape(-1)[:SAMPLED_VALUES].cpu()]
            for name, t in model.state_dict().items()
        }
    )


def data_settings(spec: Any, split: str, data_options: Mapping[str, Any] | None, seed: int) -> dict[str, Any]:
    """The settings of reading ``spec`` (a data file or ``datasets`` name) that every process of a run must
    share: every field of its :class:`DataConfig` but the path (two machines may keep the data in other
    places); none for rows given in memory."""
    if spec is None or isinstance(spec, Calibration):
        return {}
    config = data_config(spec, split, data_options, seed)
    return {k: v for k, v in asdict(config).items() if k != "path"}


def run_fingerprint(
    settings: Mapping[str, Any],
    models: Mapping[str, nn.Module | None],
    reads: Mapping[str, Calibration | None],
    found: str | None = None,
) -> dict[str, str]:
    """What must be the same in every process of a run (:meth:`Agreement.agree`), as phrases that complete
    ``process N ...``: the versions of headcut and torch, ``settings`` (keyword: value), each of ``models``
    (keyword: module) by :func:`weights_digest`, each of ``reads`` (keyword: data) by its examples and the
    digest of its batches (the digest a resume checkpoint records), and ``found`` (what the process found in
    its resume checkpoint folder, with ``resume``)."""
    from .. import __version__
    from ..training.checkpoint import digest

    out = {"ran headcut": __version__, "ran torch": torch.__version__}
    for name, value in settings.items():
        out[f"was given {label(name)}"] = _setting(value)
    for name, module in models.items():
        out[f"loaded {label(name)} with"] = "no model" if module is None else f"weights digest {weights_digest(module)}"
    for name, cal in reads.items():
        out[f"read {label(name)} with"] = (
            "no data" if cal is None else f"{cal.examples} examples (digest {digest(cal.batches)})"
        )
    if found is not None:
        out["found"] = found
    return out


def checkpoint_found(checkpoint_dir: str | os.PathLike[str] | None) -> str:
    """What a resumed run found in its checkpoint folder, for :func:`run_fingerprint` (every process of the run
    must find the same: a folder that only one machine has is refused before the work)."""
    from ..training.checkpoint import has_checkpoint

    found = checkpoint_dir is not None and has_checkpoint(checkpoint_dir)
    return "a resume checkpoint" if found else "no resume checkpoint"


def _setting(value: Any) -> str:
    """A setting's value in a fingerprint (and the message that shows it)."""
    if value is None:
        return "none"
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_setting(v) for v in value)
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except ValueError:
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


# ---- saving -----------------------------------------------------------------------------------------


def save_model(
    model: nn.Module,
    out: str | os.PathLike[str] | OutputDir,
    source: Path | None,
    force: bool,
    report: dict[str, Any],
    report_name: str,
    reads: Mapping[str, Any],
    trust_remote_code: bool,
    formats: Sequence[str] = ("safetensors",),
    gguf_type: str = "f16",
) -> saving.SavedModel:
    """Save ``model`` with ``report`` and a model card inside it (the report's ``out``, weights size and
    ``formats`` filled in); ``formats``: see :mod:`headcut.outputs.formats`."""
    import json

    from ..model.stock import stock_form
    from ..outputs.formats import write_formats
    from ..outputs.modelcard import write_card

    check_formats(model, formats, gguf_type)
    target_path = out.path if isinstance(out, OutputDir) else Path(out)
    check_paths(reads={k: v for k, v in reads.items() if v is not None}, writes={}, replaces={"--out": target_path})
    report["out"] = str(target_path)
    form = stock_form(model)
    report["checkpoint"] = form.to_json()  # its loader names the folder OUT (the report's "out")

    def write(folder: Path) -> None:
        if tuple(formats) != ("safetensors",):
            report["formats"] = write_formats(model, folder, formats, gguf_type)
        if isinstance(report.get("size_bytes"), dict):
            report["size_bytes"]["after"] = weights_bytes(folder) if "safetensors" in formats else None
        write_card(
            folder, model, report, source=source, formats=report.get("formats"), has_weights="safetensors" in formats
        )
        (folder / report_name).write_text(json.dumps(report, indent=2) + "\n")

    saved = saving.save(
        model,
        out if isinstance(out, OutputDir) else target_path,
        source=source,
        force=force,
        extra=write,
        trust_remote_code=trust_remote_code,
        form=form,
    )
    if saved.notes:
        report.setdefault("notes", []).extend(n for n in saved.notes if n not in report.get("notes", []))
    return saved


def local_reads(**specs: Any) -> dict[str, Path | None]:
    out: dict[str, Path | None] = {}
    for name, spec in specs.items():
        path = spec.path if isinstance(spec, DataConfig) else spec
        if isinstance(path, (str, os.PathLike)) and Path(path).expanduser().exists():
            out[name] = real_path(path)
    return out


def spec_path(spec: Any) -> Any:
    """The path of a data spec given as a path or DataConfig (None otherwise)."""
    if isinstance(spec, DataConfig):
        return spec.path
    return spec if isinstance(spec, (str, os.PathLike)) else None


# ---- the building blocks' entry points ------------------------------------------------------------------

#: :func:`headcut.model.loading.load` with its arguments checked first (``headcut.load``)
load = checked("load")(io.load)
#: :func:`headcut.model.saving.save` with its arguments checked first (``headcut.save``)
save = checked("save")(saving.save)


class Bars:
    """``progress(phase, done, total)`` of :func:`headcut.pruning.plan_prune` (and training steps) as
    reporter tasks; ``train``: the label of the training phase."""

    UNITS = {
        "prune": "heads",
        "score": "batches",
        "eval": "batches",
        "refit": "batches",
        "train": "steps",
        "agent": "episodes",
    }

    def __init__(self, reporter: Reporter, method: str, metric: str | None, train: str | None = None) -> None:
        self.reporter = reporter
        self.labels = {
            "prune": f"pruning ({method}, heads removed)",
            "score": "scoring",
            "eval": "evaluating",
            "refit": "refitting the output projections (least squares)",
            "train": train or f"training gates ({method})",
            "agent": f"training the {method} agent",
        }
        self.metric = metric
        self.tasks: dict[str, Task] = {}
        self.last_metric: Any = None

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        task = self.tasks.get(phase)
        if task is None or task.finished or done < task.done:
            if task is not None and not task.finished:
                task.finish()
            label = self.labels.get(phase, phase)
            task = self.tasks[phase] = self.reporter.task(label, total, self.UNITS.get(phase, ""))
        task.update(done, total)

    def on_step(self, entry: dict[str, Any]) -> None:
        """A training step's history entry: its loss, temperature/lambda, open heads and the last metric; or
        an agent's episode (``phase`` ``agent``): its layer, epsilon, mean reward and heads pruned."""
        phase = entry.get("phase", "train")
        task = self.tasks.get(phase)
        if task is None:
            return
        if phase != "train":
            task.fields.update({k: v for k, v in entry.items() if k != "phase"})
            return
        fields_: dict[str, Any] = {"loss": entry.get("task_loss", entry.get("loss"))}
        for key, shown in (("kl", "KL"), ("tau", "tau"), ("lambda", "lambda"), ("open", "open heads")):
            if key in entry:
                fields_[shown] = entry[key]
        if self.metric is not None and isinstance(entry.get("eval"), dict) and self.metric in entry["eval"]:
            self.last_metric = entry["eval"][self.metric]
        if self.last_metric is not None and self.metric is not None:
            fields_[self.metric] = self.last_metric
        task.fields.update(fields_)

    def close(self) -> None:
        for task in self.tasks.values():
            task.finish()
