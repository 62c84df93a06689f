"""``headcut.score``: every head's importance by a scorer (``headcut score``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..arguments.kinds import values
from ..arguments.table import checked
from ..catalog import scorer_entry
from ..config import ScoreConfig
from ..errors import HeadcutError, label
from ..model.surgery import model_blocks
from ..progress import Reporter, quiet
from ..scoring import score as run_score
from .base import ModelLike, calibration, check_data_spec, checked_data, load_model


@dataclass
class Scores:
    """What :func:`score` found: ``scores`` (:class:`headcut.scoring.HeadScores`: per block, one score per
    head), the model's ``blocks`` and the report ``headcut score --json`` writes."""

    scores: Any
    blocks: list[Any]
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@checked("score")
def score(
    model: ModelLike,
    scorer: str = "gradient",
    *,
    data: Any = None,
    normalize: str = "none",
    abs_per: str = "example",
    objective: str = "logits-norm",
    per: str = "batch",
    seed: int = 0,
    tokenizer: Any = None,
    task: str | None = None,
    split: str = "train",
    data_options: Mapping[str, Any] | None = None,
    progress: Reporter | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> Scores:
    """Score every head of ``model`` with ``scorer`` on ``data`` (``headcut score``; the data-free scorers
    value-l1, magnitude and random need none)."""

    progress = progress or quiet()
    with values():
        config = ScoreConfig(
            scorer=scorer, normalize=normalize, abs_per=abs_per, objective=objective, per=per, seed=seed
        )
        config.validate()
        entry = scorer_entry(scorer)
        if entry.needs_data and data is None:
            raise HeadcutError(f"scorer {scorer} needs {label('data')} (value-l1, magnitude and random do not)")
        spec = None
        if entry.needs_data:
            check_data_spec(data, label("data"))
            spec = checked_data(data, split, data_options, seed)
    notes: list[str] = []
    loaded = load_model(model, task, allow_pickle, trust_remote_code, notes, progress, seed=seed)
    cal = None
    if entry.needs_data:
        cal = calibration(spec, loaded, tokenizer, split, data_options, seed, trust_remote_code, progress, "data")
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
