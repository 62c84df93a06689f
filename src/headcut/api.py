"""headcut's Python API: every command as a function, with the command's defaults and report.

```python
import headcut

res = headcut.prune("model/", method="pass", keep=16, data="train.csv", eval_data="dev.csv", seed=0)
res.model, res.mask, res.report          # slimmed model, kept heads, the report `--json` writes
res.save("slim/")                        # what `headcut prune --out slim/` writes
scores = headcut.score("model/", scorer="gnorm", data="cal.csv")
tuned = headcut.finetune("slim/", data="train.csv", teacher="model/", max_steps=500)
headcut.evaluate("slim/", data="dev.csv").value
headcut.export("model/", {"drop": {"self.0": [1, 2]}}).save("cut/")
headcut.bench(["model/", "slim/"], device="cpu")
```

* **Models**: a checkpoint folder, a Hugging Face Hub id, or a loaded model (``torch.nn.Module`` of a
  supported family; it is changed in place by ``prune``, ``export`` and ``finetune``).
* **Data**: a file or a ``datasets`` name (read with ``split``/``eval_split`` and ``data_options``:
  the fields of :class:`headcut.data.DataConfig` such as ``text_col``, ``max_examples``, ``seq_len``,
  ``batch_size``), a :class:`~headcut.data.DataConfig`, a ``datasets.Dataset`` or a list of dict rows,
  or a ready :class:`~headcut.data.Calibration`. The tokenizer comes from the checkpoint folder (or
  ``tokenizer=``).
* **Results** carry ``report``: the dict the command's ``--json`` writes. Those of commands that write a
  model have ``save(out, force=False)``: atomic, with the command line's checks (see
  :mod:`headcut.outputs`); ``force`` replaces only a folder headcut wrote.
* ``progress``: a :class:`headcut.progress.Reporter` (default: silent).
* **Errors**: every refusal is a :class:`~headcut.errors.HeadcutError`. Each function checks its arguments
  first (:mod:`headcut.arguments`), before anything is loaded, read or written: a wrong kind of value is a
  ``HeadcutTypeError`` (also a ``TypeError``), a value that cannot work a ``HeadcutValueError`` (also a
  ``ValueError``), and the message names the keyword. ``headcut.load`` and ``headcut.save`` are
  :func:`headcut.io.load` and :func:`headcut.io.save` with the same checks.

The command line is a thin layer over these functions: it parses, calls one of them and renders the
result, so the same arguments give the same result (and report) either way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from . import io
from .arguments import checked, values
from .catalog import METHODS, method_entry
from .config import BenchConfig, FinetuneConfig, PruneConfig, ScoreConfig
from .data import Calibration, DataConfig, looks_local
from .errors import HeadcutError
from .formats import check_formats, parse_formats
from .masks import HeadMask, check_mask
from .outputs import OutputDir, OutputFile, check_paths, real_path, special_kind
from .progress import Reporter, Task, quiet
from .reports import (
    FINETUNE_REPORT,
    PRUNE_REPORT,
    export_report,
    finetune_report,
    prune_report,
    weights_bytes,
    write_trajectory_csv,
    write_trajectory_png,
)

ModelLike = str | os.PathLike[str] | nn.Module


# ---- models, tokenizers and data ------------------------------------------------------------------

@dataclass
class _Model:
    """A model the API works on: the module, its name for reports, and its local folder (or None)."""

    module: nn.Module
    name: str
    folder: Path | None
    given_module: bool = False


def _source_folder(model: nn.Module) -> Path | None:
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    p = Path(path).expanduser() if path else None
    return p if p is not None and (p / "config.json").is_file() else None


def _load(model: ModelLike, task: str | None, allow_pickle: bool, trust_remote_code: bool, notes: list[str],
          progress: Reporter, seed: int = 0, **kwargs: Any) -> _Model:
    """Load ``model`` (a module is used as it is). Weights the checkpoint lacks (a new task head) are
    initialised from ``seed``, so the same command gives the same model; the global RNG is left as it was."""
    if isinstance(model, nn.Module):
        folder = _source_folder(model)
        return _Model(model, str(folder) if folder is not None else type(model).__name__.removeprefix("Headcut"),
                      folder, given_module=True)
    name = str(model)
    with progress.step(f"loading {name}"), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, notes=notes,
                         **kwargs)
    local = Path(model).expanduser()
    return _Model(module, name, local if local.is_dir() else None)


def _check_data_spec(spec: Any, flag: str) -> None:
    """Refuse a missing local data file before minutes of model loading."""
    path = spec.path if isinstance(spec, DataConfig) else spec
    if isinstance(path, (str, os.PathLike)):
        text = str(path)
        if not text.strip():
            raise HeadcutError(f"no data given: pass {flag} FILE (or a datasets name)")
        if looks_local(text) and not Path(text).expanduser().exists():
            raise HeadcutError(f"data file not found: {text}")


def _data_config(spec: Any, split: str, data_options: Mapping[str, Any] | None, seed: int) -> DataConfig:
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


def _calibration(spec: Any, model: _Model, tokenizer: Any, split: str, data_options: Mapping[str, Any] | None,
                 seed: int, trust_remote_code: bool, progress: Reporter, what: str) -> Calibration | None:
    """``spec`` (see the module's doc) as model-ready batches."""
    if spec is None or isinstance(spec, Calibration):
        return spec
    config = _data_config(spec, split, data_options, seed)
    from .data import load_calibration, load_tokenizer

    if tokenizer is None:
        if model.folder is None and model.given_module:
            raise HeadcutError("pass tokenizer= for a model that was not loaded from a checkpoint folder")
        source = str(model.folder) if model.folder is not None else model.name
        with io.quiet_transformers():
            tokenizer = load_tokenizer(source, trust_remote_code=trust_remote_code)
    dataset = None if isinstance(spec, (str, os.PathLike, DataConfig)) else spec
    with progress.step(f"reading {what}"):
        return load_calibration(model.module, tokenizer, config, dataset=dataset)


def _digest(path: Path) -> str:
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
        if pa.stat().st_size == pb.stat().st_size and _digest(pa) == _digest(pb):
            return f"{a.path} and {b.path} have identical contents"
        return None
    if a.path == b.path and a.split == b.split and a.config_name == b.config_name:
        return f"both are {a.path} split {a.split}"
    return None


def _specs(data: Any, eval_data: Any, split: str, eval_split: str, data_options: Mapping[str, Any] | None,
           seed: int) -> tuple[Any, Any]:
    """The data and eval-data specs as DataConfigs where they are names; refuses the same data twice."""
    for spec, flag in ((data, "--data"), (eval_data, "--eval-data")):
        if spec is not None:
            _check_data_spec(spec, flag)
    as_config = (str, os.PathLike)
    d = _data_config(data, split, data_options, seed) if isinstance(data, as_config) else data
    e = _data_config(eval_data, eval_split, data_options, seed) if isinstance(eval_data, as_config) else eval_data
    if d is not None and e is not None:
        why = same_data(d, e)
        if why:
            raise HeadcutError(f"--data and --eval-data are the same data ({why}): training or calibration data and "
                               "evaluation data must differ; hold out part of the data for --eval-data")
    return d, e


def _device(device: str | None) -> Any:
    from .distributed import from_env

    dist = from_env()
    return dist, dist.device(device or "auto")


def _move(model: nn.Module, device: Any) -> None:
    if next(model.parameters()).device != device:
        model.to(device)


def _calls(values: dict[str, Any]) -> dict[str, Any]:
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
            out[key] = _calls(dict(value))
        else:
            out[key] = f"<{type(value).__name__}>"
    return out


# ---- saving -----------------------------------------------------------------------------------------

def _save(model: nn.Module, out: str | os.PathLike[str] | OutputDir, source: Path | None, force: bool,
          report: dict[str, Any], report_name: str, reads: Mapping[str, Any], trust_remote_code: bool,
          formats: Sequence[str] = ("safetensors",), gguf_type: str = "f16") -> io.SavedModel:
    """Save ``model`` with ``report`` and a model card inside it (the report's ``out``, weights size and
    ``formats`` filled in); ``formats``: see :mod:`headcut.formats`."""
    import json

    from .formats import write_formats
    from .modelcard import write_card

    check_formats(model, formats, gguf_type)
    target_path = out.path if isinstance(out, OutputDir) else Path(out)
    check_paths(reads={k: v for k, v in reads.items() if v is not None}, writes={}, replaces={"--out": target_path})
    report["out"] = str(target_path)

    def write(folder: Path) -> None:
        if tuple(formats) != ("safetensors",):
            report["formats"] = write_formats(model, folder, formats, gguf_type)
        if isinstance(report.get("size_bytes"), dict):
            report["size_bytes"]["after"] = weights_bytes(folder) if "safetensors" in formats else None
        write_card(folder, model, report, source=source, formats=report.get("formats"),
                   has_weights="safetensors" in formats)
        (folder / report_name).write_text(json.dumps(report, indent=2) + "\n")

    saved = io.save(model, out if isinstance(out, OutputDir) else target_path, source=source, force=force, extra=write,
                    trust_remote_code=trust_remote_code)
    if saved.notes:
        report.setdefault("notes", []).extend(n for n in saved.notes if n not in report.get("notes", []))
    return saved


def _local_reads(**specs: Any) -> dict[str, Path | None]:
    out: dict[str, Path | None] = {}
    for name, spec in specs.items():
        path = spec.path if isinstance(spec, DataConfig) else spec
        if isinstance(path, (str, os.PathLike)) and Path(path).expanduser().exists():
            out[name] = real_path(path)
    return out


# ---- results that write a model ---------------------------------------------------------------------

@dataclass(kw_only=True)
class Written:
    """What the commands that write a model return: ``model``, ``report`` (what the report file inside the
    output and ``--json`` hold) and ``save(out)``, which writes both atomically (see the module's doc)."""

    REPORT: ClassVar[str] = PRUNE_REPORT

    model: nn.Module
    report: dict[str, Any]
    source: Path | None = None
    notes: list[str] = field(default_factory=list)
    reads: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    formats: tuple[str, ...] = ("safetensors",)
    gguf_type: str = "f16"

    @checked("Written.save")
    def save(self, out: str | os.PathLike[str] | OutputDir, force: bool = False, *,
             formats: str | Sequence[str] | None = None, gguf_type: str | None = None) -> io.SavedModel:
        """Write the model, its report and its model card (``README.md``) to ``out`` (atomically; ``force``
        replaces only a folder headcut wrote). ``formats``: ``safetensors``, ``onnx``, ``gguf`` or several
        (default: the command's ``formats``); ``gguf_type``: ``f16``, ``f32`` or ``q8_0``."""
        from .formats import parse_formats

        with values():
            chosen = parse_formats(formats) if formats is not None else self.formats
        return _save(self.model, out, self.source, force, self.report, self.REPORT, self.reads,
                     self.trust_remote_code, chosen, gguf_type or self.gguf_type)


# ---- the building blocks' entry points ------------------------------------------------------------------

#: :func:`headcut.io.load` with its arguments checked first (``headcut.load``)
load = checked("load")(io.load)
#: :func:`headcut.io.save` with its arguments checked first (``headcut.save``)
save = checked("save")(io.save)


# ---- info and evaluate ----------------------------------------------------------------------------------

@checked("info")
def info(model: ModelLike, *, task: str | None = None, allow_pickle: bool = False,
         trust_remote_code: bool = False) -> Any:
    """The attention blocks (name, kind, layer, heads, KV heads, head size), head total and parameter count
    of ``model`` (``headcut info``); a :class:`headcut.modelinfo.ModelInfo` whose ``to_json()`` is the JSON."""
    from .modelinfo import info as describe

    loaded = _load(model, task, allow_pickle, trust_remote_code, [], quiet())
    return describe(loaded.module)


@dataclass
class Evaluation:
    """What :func:`evaluate` measured: ``result`` (the metrics), the data read (``data``: its report
    entry) and the report ``headcut eval --json`` writes."""

    result: Any
    data: dict[str, Any]
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def value(self) -> float:
        """The primary metric (accuracy, perplexity, ...)."""
        return float(self.result.value)


@checked("evaluate")
def evaluate(model: ModelLike, data: Any, *, tokenizer: Any = None, task: str | None = None, split: str = "train",
             data_options: Mapping[str, Any] | None = None, seed: int = 0, progress: Reporter | None = None,
             allow_pickle: bool = False, trust_remote_code: bool = False) -> Evaluation:
    """The task metric of ``model`` on ``data`` (``headcut eval``): accuracy and macro-F1, perplexity,
    seq2seq loss (and BLEU with sacrebleu), masked-LM perplexity; examples/s."""
    from .evaluation import evaluate as run_eval

    progress = progress or quiet()
    with values():
        _check_data_spec(data, "--data")
    notes: list[str] = []
    loaded = _load(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    cal = _calibration(data, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
    assert cal is not None
    with progress.task(f"evaluating ({cal.task})", len(cal.batches), "batches") as bar:
        result = run_eval(loaded.module, cal, progress=lambda d, t: bar.update(d, t))
    notes += cal.notes + result.notes
    report = {"model": loaded.name, **result.to_json(), "data": cal.to_json()}
    return Evaluation(result=result, data=cal.to_json(), report=report, notes=notes)


# ---- score ----------------------------------------------------------------------------------------------

@dataclass
class Scores:
    """What :func:`score` found: ``scores`` (:class:`headcut.scoring.HeadScores`: per block, one score per
    head), the model's ``blocks`` and the report ``headcut score --json`` writes."""

    scores: Any
    blocks: list[Any]
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@checked("score")
def score(model: ModelLike, scorer: str = "gradient", *, data: Any = None, normalize: str = "none",
          abs_per: str = "example", objective: str = "logits-norm", per: str = "batch", seed: int = 0,
          tokenizer: Any = None, task: str | None = None, split: str = "train",
          data_options: Mapping[str, Any] | None = None, progress: Reporter | None = None,
          allow_pickle: bool = False, trust_remote_code: bool = False) -> Scores:
    """Score every head of ``model`` with ``scorer`` on ``data`` (``headcut score``; the data-free scorers
    value-l1, magnitude and random need none)."""
    from .catalog import scorer_entry
    from .scoring import score as run_score
    from .surgery import model_blocks

    progress = progress or quiet()
    with values():
        config = ScoreConfig(scorer=scorer, normalize=normalize, abs_per=abs_per, objective=objective, per=per,
                             seed=seed)
        config.validate()
        entry = scorer_entry(scorer)
        if entry.needs_data and data is None:
            raise HeadcutError(f"scorer {scorer} needs --data (value-l1, magnitude and random do not)")
        if entry.needs_data:
            _check_data_spec(data, "--data")
    notes: list[str] = []
    loaded = _load(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    cal = None
    if entry.needs_data:
        cal = _calibration(data, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
        assert cal is not None
        with progress.task(f"scoring ({scorer})", len(cal.batches), "batches") as bar:
            result = run_score(loaded.module, cal.batches, config, progress=lambda d, t: bar.update(d, t))
        notes += cal.notes
    else:
        if data is not None:
            notes.append(f"scorer {scorer} reads no data: --data was not used")
        result = run_score(loaded.module, None, config)
    report: dict[str, Any] = {"model": loaded.name, **result.to_json(), "config": config.to_json()}
    if cal is not None:
        report["data"] = cal.to_json()
    return Scores(scores=result, blocks=model_blocks(loaded.module), report=report, notes=notes)


# ---- export ---------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class Exported(Written):
    """A model with the heads of a mask removed (:func:`export`): ``model`` (slimmed in place), ``slim``
    (:class:`headcut.surgery.SlimResult`) and ``report``; ``save(out)`` writes it with
    ``headcut-report.json``."""

    slim: Any


@checked("export")
def export(model: ModelLike, mask: HeadMask | Mapping[str, Any] | str | os.PathLike[str], *, gqa: str = "auto",
           task: str | None = None, allow_pickle: bool = False, trust_remote_code: bool = False,
           formats: str | Sequence[str] | None = None, gguf_type: str = "f16",
           arguments: dict[str, Any] | None = None) -> Exported:
    """Remove the heads ``mask`` drops (``headcut export``): a mask dict ``{"keep"|"drop": {block: [heads]}}``,
    a :class:`HeadMask` or a mask JSON file. ``formats``/``gguf_type``: what ``save`` writes (see
    :mod:`headcut.formats`), checked here before the work."""
    from .catalog import GQA_POLICIES
    from .masks import read_mask_file
    from .surgery import slim

    arguments = arguments if arguments is not None else _calls({"model": model, "gqa": gqa, "task": task})
    with values():
        if gqa not in GQA_POLICIES:
            raise HeadcutError(f"unknown --gqa policy {gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
        chosen = parse_formats(formats)
    reads: dict[str, Any] = {}
    if isinstance(mask, (str, os.PathLike)):
        reads["--mask"] = real_path(mask)
        raw: Any = read_mask_file(mask)
    else:
        raw = mask.to_json() if isinstance(mask, HeadMask) else dict(mask)
        with values():
            check_mask(raw)  # its form, before the model is loaded (as a mask file's)
    notes: list[str] = []
    loaded = _load(model, task, allow_pickle, trust_remote_code, notes, quiet())
    check_formats(loaded.module, chosen, gguf_type)
    if loaded.folder is not None:
        reads["MODEL"] = real_path(loaded.folder)
    result = slim(loaded.module, raw, gqa=gqa)
    notes += result.notes
    report = export_report(model=loaded.name, arguments=arguments, mask=raw, gqa=gqa, slimmed=result, notes=notes)
    return Exported(model=loaded.module, slim=result, report=report, source=loaded.folder, notes=notes,
                    reads=reads, trust_remote_code=trust_remote_code, formats=chosen, gguf_type=gguf_type)


# ---- prune ----------------------------------------------------------------------------------------------

class _PruneBars:
    """``progress(phase, done, total)`` of :func:`headcut.pruning.plan_prune` (and training steps) as
    reporter tasks; ``train``: the label of the training phase."""

    UNITS = {"prune": "heads", "score": "batches", "eval": "batches", "train": "steps", "agent": "episodes"}

    def __init__(self, reporter: Reporter, method: str, metric: str | None, train: str | None = None) -> None:
        self.reporter = reporter
        self.labels = {"prune": f"pruning ({method}, heads removed)", "score": "scoring", "eval": "evaluating",
                       "train": train or f"training gates ({method})", "agent": f"training the {method} agent"}
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
        for key, label in (("kl", "KL"), ("tau", "tau"), ("lambda", "lambda"), ("open", "open heads")):
            if key in entry:
                fields_[label] = entry[key]
        if self.metric is not None and isinstance(entry.get("eval"), dict) and self.metric in entry["eval"]:
            self.last_metric = entry["eval"][self.metric]
        if self.last_metric is not None and self.metric is not None:
            fields_[self.metric] = self.last_metric
        task.fields.update(fields_)

    def close(self) -> None:
        for task in self.tasks.values():
            task.finish()


@dataclass(kw_only=True)
class Pruned(Written):
    """What :func:`prune` produced: ``model`` (slimmed), ``mask`` (kept heads, the input model's
    numbering: ``export --mask`` replays it), ``report`` (what ``headcut-report.json`` and ``--json`` hold)
    and ``result`` (:class:`headcut.pruning.PruneResult`: trajectory, training run, ...). ``save(out)``
    writes the model with its report; ``write_trajectory(csv)`` the metric after every step."""

    mask: HeadMask
    result: Any

    @checked("Pruned.write_trajectory")
    def write_trajectory(self, csv_path: str | os.PathLike[str] | OutputFile, png: bool = True,
                         force: bool = False) -> list[Path]:
        """Write the trajectory (one row per step) to a ``.csv`` file, and its plot beside it as ``.png``
        when matplotlib is installed (and ``png``); returns the files written."""
        import importlib.util

        csv_file = csv_path if isinstance(csv_path, OutputFile) else OutputFile(csv_path, "--trajectory", force=force)
        if csv_file.path.suffix.lower() != ".csv":
            raise HeadcutError(f"--trajectory must name a .csv file (a .png is written beside it), got {csv_file.path}")
        png_file = OutputFile(csv_file.path.with_suffix(".png"), "--trajectory (its PNG)", force=csv_file.force)
        if not isinstance(csv_path, OutputFile):
            csv_file.check()
        png = png and importlib.util.find_spec("matplotlib") is not None
        if png:
            png_file.check()
        temps: list[Path] = []
        try:
            temps.append(csv_file.temp())
            write_trajectory_csv(temps[0], self.result)
            if png:
                temps.append(png_file.temp())
                name = Path(self.report["model"]).name
                write_trajectory_png(temps[1], self.result, f"{name}: {self.result.method}")
            for temp, final in zip(temps, (csv_file, png_file)):
                final.commit(temp)
            temps = []
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)
        if not png and special_kind(png_file.path) is None:
            png_file.path.unlink(missing_ok=True)  # a stale PNG of an earlier run (never a pipe or a device)
        return [csv_file.path] + ([png_file.path] if png else [])


@checked("prune")
def prune(
    model: ModelLike, method: str, *, keep: int | None = None, sparsity: float | None = None,
    max_drop: float | None = None, data: Any = None, eval_data: Any = None, uniform: bool = False,
    min_heads_per_block: int = 0, gqa: str = "auto", seed: int = 0, trajectory: bool = False,
    tokenizer: Any = None, task: str | None = None, split: str = "train", eval_split: str = "validation",
    data_options: Mapping[str, Any] | None = None, device: str | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None, resume: bool = False, restart: bool = False,
    progress: Reporter | None = None, allow_pickle: bool = False, trust_remote_code: bool = False,
    formats: str | Sequence[str] | None = None, gguf_type: str = "f16", recover_steps: int = 0,
    arguments: dict[str, Any] | None = None, **options: Any,
) -> Pruned:
    """Choose heads with ``method`` and remove them (``headcut prune``); see the module's doc for models and
    data. Budget: ``keep`` K heads, or ``sparsity`` S (K = floor((1 - S) heads)), or ``max_drop`` D (remove
    while the eval metric stays within D; score-based methods), met exactly in whole units or refused
    with the nearest valid budgets before any data is read. ``options``: the method's own options (e.g.
    ``max_steps=500`` for a learned method, ``step=4`` for michel; :func:`headcut.pruning.make_options`
    refuses the others). ``checkpoint_dir``/``resume``/``restart``: a learned method's resume checkpoint
    (``restart`` discards a stale one). ``device``: where to score or train (auto: CUDA when available).
    ``formats``/``gguf_type``: what ``save`` writes (see :mod:`headcut.formats`), checked before the work.
    ``recover_steps`` N > 0: after the cut, N steps of recovery fine-tuning on ``data``, distilled from the
    unpruned model (``finetune``'s loss and defaults: lr 5e-5, alpha 0.5, temperature 2); the report's
    ``recovery`` has its curve, and ``metric.after`` is the recovered model's (``after_pruning``: before
    the recovery)."""
    from .pruning import check_budget, get_method, make_options, plan_prune
    from .surgery import slim

    start = time.perf_counter()
    arguments = arguments if arguments is not None else _calls(dict(
        model=model, method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, data=data, eval_data=eval_data,
        uniform=uniform, min_heads_per_block=min_heads_per_block, gqa=gqa, seed=seed, trajectory=trajectory,
        task=task, split=split, eval_split=eval_split, data_options=data_options, device=device, **options))
    progress = progress or quiet()
    with values():  # every value refused before any work, as a HeadcutValueError
        config = PruneConfig(method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, uniform=uniform,
                             min_heads_per_block=min_heads_per_block, gqa=gqa, seed=seed, trajectory=trajectory)
        config.validate()
        entry = method_entry(method)
        chosen = get_method(method)
        opts = make_options(chosen, options)
        chosen.check(config, opts)
        if max_drop is not None and eval_data is None:
            raise HeadcutError("--max-drop needs --eval-data (the metric it watches)")
        if trajectory and eval_data is None:
            raise HeadcutError("--trajectory needs --eval-data (the metric after every step)")
        if getattr(opts, "eval_every", None) is not None and eval_data is None:
            raise HeadcutError("--eval-every needs --eval-data")
        if not (isinstance(recover_steps, int) and recover_steps >= 0):
            raise HeadcutError(f"--recover-steps must be a whole number >= 0 (got {recover_steps})")
        if recover_steps and data is None:
            raise HeadcutError("--recover-steps trains the pruned model: it needs --data (training data with labels)")
        if entry.data != "none" and data is None:
            free = [m.name for m in METHODS.values() if m.data == "none"]
            what = "training data with labels" if entry.data == "training" else "calibration data"
            raise HeadcutError(f"method {method} needs --data ({what}); {', '.join(free)} do not")
        notes: list[str] = []
        if data is not None and entry.data == "none" and not recover_steps:
            notes.append(f"method {method} reads no data: --data was not used")
            data = None
        data_spec, eval_spec = _specs(data, eval_data, split, eval_split, data_options, seed)
        training = entry.resumable  # the methods that checkpoint their training
        if checkpoint_dir is not None and training:
            from .training.engine import prepare_checkpoint_dir

            prepare_checkpoint_dir(checkpoint_dir, resume, restart)
        elif resume:
            learned = ", ".join(m.name for m in METHODS.values() if m.resumable)
            raise HeadcutError(f"--resume applies to the methods that keep checkpoints ({learned}), not to {method}")
        dist, torch_device = _device(device)
        chosen = parse_formats(formats)
    loaded = _load(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    check_formats(loaded.module, chosen, gguf_type)
    check_budget(loaded.module, config, opts)  # refuse an unreachable budget before reading data
    cal = _calibration(data_spec, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
    eval_cal = _calibration(eval_spec, loaded, tokenizer, eval_split, data_options, seed, trust_remote_code, progress,
                            "eval data")
    for c, what in ((cal, "data"), (eval_cal, "eval data")):
        if c is not None:
            notes += [f"{what}: {n}" for n in c.notes]
    if checkpoint_dir is not None and training and dist.main and not resume:
        from .training.engine import clear_checkpoint_dir

        clear_checkpoint_dir(checkpoint_dir)
    dist.barrier()

    from .evaluation import PRIMARY

    metric = PRIMARY[eval_cal.task][0] if eval_cal is not None else None
    train_label = {"agent": f"fine-tuning ({method})", "rewind": f"training ({method})"}.get(entry.kind)
    bars = _PruneBars(progress, method, metric, train=train_label)
    _move(loaded.module, torch_device)
    identity = {"model": str(real_path(loaded.folder)) if loaded.folder is not None else loaded.name}
    from .finetuning import frozen_teacher

    unpruned = frozen_teacher(loaded.module) if recover_steps else None
    try:
        result = plan_prune(loaded.module, cal, config, opts, eval_calibration=eval_cal, progress=bars,
                            on_step=bars.on_step, checkpoint_dir=checkpoint_dir if training else None, resume=resume,
                            dist=dist, identity=identity)
    finally:
        bars.close()
    loaded.module.to("cpu")
    run = result.training
    if run is not None:
        last_open = run.history[-1].get("open") if run.history else None
        if run.moved is None and last_open is not None and last_open != result.target:
            notes.append(f"training ended with {last_open:g} heads open, not {result.target}: the gates had not "
                         "converged, so keeping the top heads changed the trained model; more steps (--epochs, "
                         "--max-steps) let them settle")
        if run.moved is not None:
            notes.append(f"{method} kept {run.own_kept:g} heads by its own rule (gate > 0.5); the adjustment to "
                         f"--keep {result.target} moved {run.moved} head(s)")
    slimmed = slim(loaded.module, result.mask, gqa=gqa)
    result.slim = slimmed
    notes += slimmed.notes
    recovery = None
    if unpruned is not None:
        recovery = _recover(loaded.module, unpruned, cal, eval_cal, recover_steps, seed, progress, metric, torch_device)
        result.metric_after, pruned_metric = recovery.metric_after, result.metric_after
        del unpruned
    report = prune_report(
        model=loaded.name, arguments=arguments, result=result, slimmed=slimmed,
        size_before=weights_bytes(loaded.folder), data=cal.to_json() if cal is not None else None,
        eval_data=eval_cal.to_json() if eval_cal is not None else None, seconds=time.perf_counter() - start,
        notes=notes,
    )
    if recovery is not None:
        report["recovery"] = {"steps": recovery.steps, "distilled_from": "the unpruned model",
                              "config": recovery.config.to_json(), "seconds": recovery.seconds,
                              "history_summary": recovery.summary(), "curve": recovery.history}
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = pruned_metric
    reads = _local_reads(**{"MODEL": loaded.folder, "--data": data_spec, "--eval-data": eval_spec})
    return Pruned(model=loaded.module, mask=result.mask, report=report, result=result, source=loaded.folder,
                  notes=notes, reads=reads, trust_remote_code=trust_remote_code, formats=chosen, gguf_type=gguf_type)


def _recover(model: nn.Module, teacher: nn.Module, cal: Calibration | None, eval_cal: Calibration | None, steps: int,
             seed: int, progress: Reporter, metric: str | None, device: Any) -> Any:
    """``steps`` of recovery fine-tuning of the slimmed ``model``, distilled from ``teacher`` (the unpruned
    model): :func:`headcut.finetuning.finetune` with its defaults."""
    from .finetuning import finetune as run_finetune

    if cal is None:
        raise HeadcutError("--recover-steps needs training data with labels (--data)")
    bars = _PruneBars(progress, "recovery", metric, train=f"recovery fine-tuning (distilled, {steps} steps)")
    _move(model, device)
    _move(teacher, device)
    try:
        recovered = run_finetune(model, cal, FinetuneConfig(max_steps=steps, seed=seed, checkpoint_every=None),
                                 teacher=teacher, eval_calibration=eval_cal, progress=lambda d, t: bars("train", d, t),
                                 on_step=bars.on_step)
    finally:
        bars.close()
    model.to("cpu")
    return recovered


# ---- finetune -------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class Finetuned(Written):
    """What :func:`finetune` produced: ``model`` (trained in place, heads kept), ``result``
    (:class:`headcut.finetuning.FinetuneResult`: history, metric before/after) and ``report`` (what
    ``headcut-finetune.json`` and ``--json`` hold); ``save(out)`` writes the model with its report."""

    REPORT: ClassVar[str] = FINETUNE_REPORT

    result: Any


@checked("finetune")
def finetune(
    model: ModelLike, data: Any, *, eval_data: Any = None, teacher: ModelLike | None = None,
    epochs: int | None = None, max_steps: int | None = None, lr: float = 5e-5, grad_accum: int = 1,
    warmup_steps: int = 0, weight_decay: float = 0.0, eval_every: int | None = None,
    checkpoint_every: int | None = 100, alpha: float = 0.5, temperature: float = 2.0, hidden_weight: float = 0.0,
    patience: int | None = None, seed: int = 0, tokenizer: Any = None, task: str | None = None, labels: Sequence[str] | None = None, split: str = "train",
    eval_split: str = "validation", data_options: Mapping[str, Any] | None = None, device: str | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None, resume: bool = False, restart: bool = False,
    progress: Reporter | None = None, allow_pickle: bool = False, trust_remote_code: bool = False,
    formats: str | Sequence[str] | None = None, gguf_type: str = "f16", arguments: dict[str, Any] | None = None,
) -> Finetuned:
    """Recovery training of ``model`` on ``data`` (``headcut finetune``): its heads are kept; with a
    ``teacher`` the loss is ``alpha * T^2 * KL(teacher/T || model/T) + (1 - alpha) * task loss`` over the
    labelled positions. Neither ``epochs`` nor ``max_steps``: 3 epochs. ``labels``: the classes of a new
    classification head (with ``task="sequence-classification"`` on a checkpoint without one: train a
    classifier from a base encoder). ``patience`` N: early stopping, after N evaluations (every ``eval_every``
    steps on ``eval_data``) without a better metric, keeping the best weights (such a run keeps no resume
    checkpoints). ``checkpoint_dir``/``resume``/``restart``: the resume checkpoint (see :func:`prune`).
    ``formats``/``gguf_type``: what ``save`` writes (see :mod:`headcut.formats`)."""
    from .finetuning import finetune as run_finetune

    start = time.perf_counter()
    arguments = arguments if arguments is not None else _calls(dict(
        model=model, data=data, eval_data=eval_data, teacher=teacher, epochs=epochs, max_steps=max_steps, lr=lr,
        grad_accum=grad_accum, warmup_steps=warmup_steps, weight_decay=weight_decay, eval_every=eval_every,
        checkpoint_every=checkpoint_every, alpha=alpha, temperature=temperature, hidden_weight=hidden_weight,
        patience=patience, seed=seed, task=task,
        labels=",".join(labels) if labels else None, split=split, eval_split=eval_split, data_options=data_options,
        device=device))
    progress = progress or quiet()
    with values():  # every value refused before any work, as a HeadcutValueError
        if teacher is None and (alpha != 0.5 or temperature != 2.0 or hidden_weight):
            raise HeadcutError("--alpha, --temperature and --hidden-weight need --distill-from TEACHER")
        if eval_every is not None and eval_data is None:
            raise HeadcutError("--eval-every needs --eval-data")
        config = FinetuneConfig(epochs=epochs, max_steps=max_steps, lr=lr, grad_accum=grad_accum,
                                warmup_steps=warmup_steps, weight_decay=weight_decay, eval_every=eval_every,
                                checkpoint_every=checkpoint_every, seed=seed, alpha=alpha, temperature=temperature,
                                hidden_weight=hidden_weight, patience=patience)
        config.validate()
        if patience is not None and eval_data is None:
            raise HeadcutError("--patience needs --eval-data (the metric it watches) and --eval-every")
        if patience is not None:
            if resume:
                raise HeadcutError("--resume does not apply with --patience: an early-stopped run keeps no checkpoints")
            checkpoint_dir = None  # the best weights live in memory; nothing to resume from
        data_spec, eval_spec = _specs(data, eval_data, split, eval_split, data_options, seed)
    if isinstance(teacher, (str, os.PathLike)):
        io.check_checkpoint(teacher, allow_pickle)
    with values():
        if checkpoint_dir is not None:
            from .training.engine import prepare_checkpoint_dir

            prepare_checkpoint_dir(checkpoint_dir, resume, restart)
        elif resume:
            raise HeadcutError("resume needs a checkpoint folder")
        dist, torch_device = _device(device)
        notes: list[str] = []
        if labels is not None and isinstance(model, nn.Module):
            raise HeadcutError("labels= applies to a model loaded from a checkpoint (set the head's labels yourself)")
        extra = {"labels": list(labels)} if labels is not None else {}
        chosen = parse_formats(formats)
    loaded = _load(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed, **extra)
    check_formats(loaded.module, chosen, gguf_type)
    teacher_model = None
    teacher_name = None
    if teacher is not None:
        t = _load(teacher, task, allow_pickle, trust_remote_code, [], progress)
        teacher_model, teacher_name = t.module, t.name
    cal = _calibration(data_spec, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
    eval_cal = _calibration(eval_spec, loaded, tokenizer, eval_split, data_options, seed, trust_remote_code, progress,
                            "eval data")
    assert cal is not None
    for c, what in ((cal, "data"), (eval_cal, "eval data")):
        if c is not None:
            notes += [f"{what}: {n}" for n in c.notes]
    if checkpoint_dir is not None and dist.main and not resume:
        from .training.engine import clear_checkpoint_dir

        clear_checkpoint_dir(checkpoint_dir)
    dist.barrier()
    _move(loaded.module, torch_device)
    if teacher_model is not None:
        _move(teacher_model, torch_device)
    from .evaluation import PRIMARY

    metric = PRIMARY[eval_cal.task][0] if eval_cal is not None else None
    bars = _PruneBars(progress, "finetune", metric, train="fine-tuning")
    identity = {"model": str(real_path(loaded.folder)) if loaded.folder is not None else loaded.name,
                "teacher": teacher_name if teacher_name is None or not Path(teacher_name).exists()
                else str(real_path(teacher_name))}
    try:
        result = run_finetune(loaded.module, cal, config, teacher=teacher_model, eval_calibration=eval_cal,
                              checkpoint_dir=checkpoint_dir, resume=resume,
                              progress=lambda d, t: bars("train", d, t), on_step=bars.on_step, dist=dist,
                              identity=identity)
    finally:
        bars.close()
    loaded.module.to("cpu")
    report = finetune_report(
        model=loaded.name, teacher=teacher_name, arguments=arguments, result=result, data=cal.to_json(),
        eval_data=eval_cal.to_json() if eval_cal is not None else None, seconds=time.perf_counter() - start,
        notes=notes,
    )
    reads = _local_reads(**{"MODEL": loaded.folder, "--data": data_spec, "--eval-data": eval_spec,
                            "--distill-from": teacher if isinstance(teacher, (str, os.PathLike)) else None})
    return Finetuned(model=loaded.module, result=result, report=report, source=loaded.folder, notes=notes,
                     reads=reads, trust_remote_code=trust_remote_code, formats=chosen, gguf_type=gguf_type)


# ---- bench ----------------------------------------------------------------------------------------------

@dataclass
class Benchmark:
    """What :func:`bench` measured: one :class:`headcut.benchmark.BenchResult` per model (speed-up and FLOP
    ratio relative to the first) and the report ``headcut bench --json`` writes."""

    results: list[Any]
    config: BenchConfig
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    cards: list[Path] = field(default_factory=list)


@checked("bench")
def bench(models: Sequence[ModelLike], *, config: BenchConfig | None = None, names: Sequence[str] | None = None,
          task: str | None = None, progress: Reporter | None = None, allow_pickle: bool = False,
          trust_remote_code: bool = False, update_cards: bool = False, **settings: Any) -> Benchmark:
    """Time ``models`` on synthetic inputs (``headcut bench``): latency, throughput, FLOPs, memory, and
    generation speed and KV-cache size for decoders. ``settings``: fields of :class:`BenchConfig`
    (``device``, ``batch_size``, ``seq_len``, ``runs``, ``runtime="torch,onnxruntime"`` for a row per
    model and runtime, ...), or pass ``config``. ``update_cards``: write the measured speed-up into the model
    card (README.md) of every headcut output after the first model (``headcut bench --update-card``)."""
    from .benchmark import bench as run_bench
    from .benchmark import report_json

    with values():
        if config is None:
            allowed = {f.name for f in fields(BenchConfig)}
            wrong = sorted(set(settings) - allowed)
            if wrong:
                raise HeadcutError(f"unknown bench setting {wrong[0]!r}; settings: {', '.join(sorted(allowed))}")
            config = BenchConfig(**settings)
        elif settings:
            raise HeadcutError("give config= or settings, not both")
        notes = config.validate()
    for m in models:  # refuse a missing folder before spending minutes on the others
        if isinstance(m, (str, os.PathLike)):
            io.check_checkpoint(m, allow_pickle)
    progress = progress or quiet()
    tasks: dict[tuple[int, str], Task] = {}

    def on_progress(index: int, name: str, stage: str, done: int, total: int) -> None:
        task = tasks.get((index, stage))
        if task is None:
            task = tasks[(index, stage)] = progress.task(f"[{index + 1}/{len(models)}] {name}: {stage}", total, "")
        task.update(done, total)

    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [t.finish() for t in tasks.values()])
        results = run_bench(list(models), config, names=names, task=task, allow_pickle=allow_pickle,
                            trust_remote_code=trust_remote_code, progress=on_progress)
    report = report_json(results, config)
    for r in results:
        notes += [f"{r.name}: {n}" for n in r.notes]
    cards: list[Path] = []
    if update_cards:
        from .benchmark import device_name
        from .modelcard import update_speed

        threads = f", {results[0].threads} threads" if results and config.device == "cpu" else ""
        cards, skipped = update_speed(results, list(models), f"{device_name(config.device)} ({config.device}{threads})")
        notes += skipped
    return Benchmark(results=results, config=config, report=report, notes=notes, cards=cards)
