"""``headcut.evaluate``: the task metric of a model on data (``headcut eval``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..arguments import checked, values
from ..errors import label
from ..progress import Reporter, quiet
from .base import ModelLike, calibration, check_data_spec, load_model


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
    from ..model.evaluation import evaluate as run_eval

    progress = progress or quiet()
    with values():
        check_data_spec(data, label('data'))
    notes: list[str] = []
    loaded = load_model(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    cal = calibration(data, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
    assert cal is not None
    with progress.task(f"evaluating ({cal.task})", len(cal.batches), "batches") as bar:
        result = run_eval(loaded.module, cal, progress=lambda d, t: bar.update(d, t))
    notes += cal.notes + result.notes
    report = {"model": loaded.name, **result.to_json(), "data": cal.to_json()}
    return Evaluation(result=result, data=cal.to_json(), report=report, notes=notes)
