"""``random``: the random-pruning baseline (Greedy-Gnorm's "Random pruning", arXiv:2602.04491 sec. 4.1).

Score of every head: an independent uniform draw in [0, 1) from a ``torch.Generator`` seeded with
``config.seed``, drawn block by block in the order of :func:`headcut.model_blocks` (so the same
seed and model give the same scores, on any device). Data-free.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..adapters import Block
from .base import Batch, Progress, RawScores, ScoreConfig, Scorer


def random_scores(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    generator = torch.Generator().manual_seed(int(config.seed))
    return RawScores({b.name: torch.rand(b.heads, generator=generator, dtype=torch.float64) for b in blocks})


SCORER = Scorer(
    name="random",
    fn=random_scores,
    needs_data=False,
    higher_is_important=True,
)
