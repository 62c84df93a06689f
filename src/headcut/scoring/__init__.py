"""Head-importance scorers: one module per scorer, written against the adapter interface only.

```python
from headcut.scoring import ScoreConfig, score

scores = score(model, batches, ScoreConfig(scorer="gradient", normalize="layer"))
scores.blocks["self.0"]        # one float per head, in headcut.model_blocks order
scores.importance()            # oriented so that higher = more important (entropy negated)
```

``batches`` is an iterable of dicts for ``model(**batch)`` with ``attention_mask`` and ``labels``
(the task loss is ``model(**batch).loss``); data-free scorers ignore it (it may be None). Every
scorer makes at most one pass over it: one forward and one backward per batch (gradient, gnorm),
or one forward (confidence, entropy); no per-head loops. The model is in eval mode while scored
(training flags restored afterwards) and its weights are never changed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import nn

from ..adapters import Block
from ..catalog import SCORERS, resolve, scorer_entry
from ..config import ScoreConfig
from ..model.surgery import model_blocks
from .base import Batch, HeadScores, Progress, RawScores, Scorer, kv_group_scores, layer_norm_factor


def get_scorer(name: str) -> Scorer:
    """The scorer registered as ``name`` in :data:`headcut.catalog.SCORERS` (a one-line error lists the
    real ones)."""
    return resolve(scorer_entry(name).target)  # type: ignore[return-value]


def score(
    model: nn.Module,
    batches: Iterable[Batch] | None,
    config: ScoreConfig | str | None = None,
    progress: Progress | None = None,
) -> HeadScores:
    """Score every head of ``model`` with ``config.scorer`` (a ScoreConfig, or a scorer name).

    ``progress(done, total)`` is called after every calibration batch (``total`` is None when
    ``batches`` has no length). Scores of blocks sharing weights (ALBERT) are per layer for the
    data scorers that see each layer's call (gradient, confidence, entropy, fluctuation) and equal across the
    sharing layers for the weight-based ones (gnorm, value-l1, magnitude)."""
    if config is None:
        config = ScoreConfig()
    elif isinstance(config, str):
        config = ScoreConfig(scorer=config)
    scorer = get_scorer(config.scorer)
    config.validate()
    blocks = model_blocks(model)
    start = time.perf_counter()
    raw = scorer.fn(model, blocks, batches if scorer.needs_data else None, config, progress)
    return finish_scores(scorer, blocks, raw, config, time.perf_counter() - start)


def finish_scores(
    scorer: Scorer, blocks: list[Block], raw: RawScores, config: ScoreConfig, seconds: float
) -> HeadScores:
    """A scorer's raw scores of ``blocks`` as :class:`HeadScores`: per KV group where grouped, normalised as
    ``config`` says (the whole-model and the layer-wise scoring share this)."""
    out: dict[str, list[float]] = {}
    groups: dict[str, list[float] | None] = {}
    for block in blocks:
        values = raw.blocks[block.name].detach().to("cpu", torch.float64).reshape(block.heads)
        grouped = kv_group_scores(block, values)
        if config.normalize == "layer":  # Michel et al.: each block's scores divided by their L2 norm
            factor = layer_norm_factor(values)
            values = values / factor
            grouped = None if grouped is None else grouped / factor
        out[block.name] = [float(v) for v in values]
        groups[block.name] = None if grouped is None else [float(v) for v in grouped]
    return HeadScores(
        scorer=scorer.name,
        blocks=out,
        kv_groups=groups,
        higher_is_important=scorer.higher_is_important,
        examples=raw.examples,
        seconds=seconds,
        config=config,
    )


__all__ = ["SCORERS", "HeadScores", "ScoreConfig", "Scorer", "finish_scores", "get_scorer", "score"]
