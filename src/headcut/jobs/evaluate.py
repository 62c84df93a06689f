"""``headcut.evaluate``: the task metric of a model on data, perplexity at the pruning papers' windows, and
lm-evaluation-harness tasks (``headcut eval``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..arguments.kinds import values
from ..arguments.table import checked
from ..config import EvalOptions, eval_options
from ..data import Calibration, DataConfig, detect_task, load_windows
from ..errors import HeadcutError, HeadcutTypeError, label
from ..model.evaluation import evaluate as run_eval
from ..model.harness import check_installed, check_model, prepare_tasks, run_harness
from ..options import OptionError
from ..progress import Reporter, quiet
from .base import (
    LoadedModel,
    ModelLike,
    calibration,
    check_data_spec,
    checked_data,
    data_config,
    load_model,
    model_tokenizer,
    move,
)


@dataclass
class Evaluation:
    """What :func:`evaluate` measured: ``result`` (the metrics of ``data``; with ``windows``: the perplexity at
    the first window given; None without ``data``), ``windows`` (window length -> its perplexity result),
    ``lm_eval`` (the harness's results, a :class:`headcut.model.harness.HarnessResult`, or None), the data read
    (``data``: its report entry) and the report ``headcut eval --json`` writes."""

    result: Any
    data: dict[str, Any] | None
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    windows: dict[int, Any] = field(default_factory=dict)
    lm_eval: Any = None

    @property
    def value(self) -> float:
        """The primary metric of ``data`` (accuracy, perplexity, ...; with ``windows``: at the first window)."""
        if self.result is None:
            raise HeadcutError("this evaluation read no data (lm-eval only): its results are in .lm_eval")
        return float(self.result.value)


def _place(loaded: LoadedModel, device: str | None) -> None:
    """Move the model to ``device`` (``auto``: CUDA when available); None: leave it where it is."""
    if device is None:
        return
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    move(loaded.module, torch.device(device))


def _quiet(progress: Reporter) -> bool:
    return getattr(progress, "mode", "quiet") == "quiet"


def _windows_report(results: dict[int, Any]) -> dict[str, Any]:
    return {
        "task": "causal-lm",
        "primary": "perplexity",
        "higher_is_better": False,
        "perplexity": {str(w): r.value for w, r in results.items()},
        "windows": [{"window": w, **r.to_json()} for w, r in results.items()],
    }


@checked("evaluate")
def evaluate(
    model: ModelLike,
    data: Any = None,
    *,
    tokenizer: Any = None,
    task: str | None = None,
    split: str = "train",
    data_options: Mapping[str, Any] | None = None,
    seed: int = 0,
    progress: Reporter | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    **options: Any,
) -> Evaluation:
    """The task metric of ``model`` on ``data`` (``headcut eval``): accuracy and macro-F1, perplexity, seq2seq
    loss (and BLEU with sacrebleu), masked-LM perplexity; examples/s.

    ``options`` (:class:`headcut.config.EvalOptions`, the flags of ``headcut eval``): ``windows`` (``"128,2048"``,
    ``2048`` or ``[128, 2048]``): a causal LM's perplexity over non-overlapping windows of the whole text of
    ``data``, one result per length (see :mod:`headcut.data.windows`); ``lm_eval`` (``"boolq,piqa"``, a list, or
    ``"default"`` for the pruning papers' seven zero-shot tasks): lm-evaluation-harness tasks on the model (extra
    ``headcut[lm-eval]``), with ``lm_eval_include`` (a folder of custom task YAML files), ``lm_eval_fewshot``,
    ``lm_eval_limit`` and ``lm_eval_batch_size``; ``device``: evaluate there (a model given as a module is moved
    in place). ``data`` may be left out with ``lm_eval``."""

    progress = progress or quiet()
    with values():
        opts: EvalOptions = eval_options(options)
        if data is None and opts.lm_eval is None:
            raise HeadcutTypeError(
                f"nothing to evaluate: give {label('data')} (the metric of the model's task head) "
                f"or {label('lm_eval')} TASKS (lm-evaluation-harness)"
            )
        spec = None
        if data is not None:
            check_data_spec(data, label("data"))
            spec = checked_data(data, split, data_options, seed)
        sizes = opts.window_sizes()
        if sizes and data is None:
            raise OptionError("{windows} needs {data}: the text to measure perplexity on")
        if sizes and isinstance(data, Calibration):
            raise OptionError(
                "{windows} reads the text of {data} itself: give a file, a datasets name or rows, "
                "not a ready Calibration"
            )
        if opts.lm_eval is not None:
            check_installed()
        config = (
            (spec if isinstance(spec, DataConfig) else data_config(data, split, data_options, seed)) if sizes else None
        )
    notes: list[str] = []
    loaded = load_model(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    prepared = None
    if opts.lm_eval is not None:  # the harness's tasks first: a task that cannot be read stops the run now
        check_model(detect_task(loaded.module))
        names = opts.task_names()
        harness_tokenizer = model_tokenizer(loaded, tokenizer, trust_remote_code)
        with progress.step(f"lm-eval: reading {len(names)} task{'s' if len(names) != 1 else ''}"):
            prepared = prepare_tasks(names, opts.lm_eval_include, quiet=_quiet(progress))
    _place(loaded, opts.device)
    report: dict[str, Any] = {"model": loaded.name}
    result, data_json, windows = None, None, {}
    if sizes:
        assert isinstance(config, DataConfig)
        tok = model_tokenizer(loaded, tokenizer, trust_remote_code)
        dataset = None if isinstance(data, (str, os.PathLike, DataConfig)) else data
        with progress.step("reading data"):
            stream, cals = load_windows(loaded.module, tok, config, sizes, dataset=dataset)
        notes += stream.notes
        for window in cals:
            with progress.task(
                f"perplexity, windows of {window.seq_len} tokens", len(window.batches), "batches"
            ) as bar:
                windows[window.seq_len] = run_eval(loaded.module, window, progress=lambda d, t: bar.update(d, t))
            notes += window.notes + windows[window.seq_len].notes
        result = windows[sizes[0]]
        data_json = {
            **stream.to_json(),
            "windows": {
                str(c.seq_len): {
                    "windows": c.examples,
                    "tokens": c.tokens,
                    "scored_tokens": c.scored_tokens,
                    "windows_per_batch": c.batch_size,
                    "notes": list(c.notes),
                }
                for c in cals
            },
            "batch_size": config.batch_size,
            "seq_len": config.seq_len,
        }
        report.update(_windows_report(windows))
        report["data"] = data_json
    elif data is not None:
        cal = calibration(spec, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
        assert cal is not None
        with progress.task(f"evaluating ({cal.task})", len(cal.batches), "batches") as bar:
            result = run_eval(loaded.module, cal, progress=lambda d, t: bar.update(d, t))
        notes += cal.notes + result.notes
        data_json = cal.to_json()
        report.update({**result.to_json(), "data": data_json})
    harness = None
    if prepared is not None:
        with progress.step(f"lm-eval: {', '.join(prepared.expanded)}"):
            harness = run_harness(
                loaded.module,
                harness_tokenizer,
                detect_task(loaded.module),
                prepared,
                num_fewshot=opts.lm_eval_fewshot,
                limit=opts.lm_eval_limit,
                batch_size=opts.lm_eval_batch_size,
                quiet=_quiet(progress),
            )
        notes += harness.notes
        report["lm_eval"] = harness.to_json()
    if "notes" not in report or windows:
        report["notes"] = list(dict.fromkeys(notes))
    return Evaluation(result=result, data=data_json, report=report, notes=notes, windows=windows, lm_eval=harness)
