"""One-shot methods: rank every head once with a scorer of ``headcut score``, then remove the lowest.

``--method NAME`` for each scorer NAME (gradient, gnorm, confidence, entropy, value-l1, magnitude,
random): the scores are computed once, on the input model, after the scorer's normalisation, and
oriented with :meth:`HeadScores.importance` (higher = more important). Heads (units) are removed
lowest first; ``--uniform`` keeps the same number in every block instead (TextPruner's even
masking). With ``--max-drop`` or ``--trajectory`` the same ranking is cut in steps.

``--method inverse-NAME`` removes the *highest* first: the diagnostic "inverse pruning" of
Greedy-Gnorm (001_*.txt sec. 4.2, Inverse-AE: the static ranking reversed). ``random`` (seeded
uniform scores: Greedy-Gnorm's random-pruning baseline) has no inverse.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..masks import HeadMask
from ..scoring.base import Batch
from .base import (
    Method,
    PruneConfig,
    PruneProgress,
    oriented,
    score_masked,
    ten_percent,
)


class OneShotRanker:
    """Scores once (on the first call: the input model) and reuses the scores at every step."""

    rescoring = False

    def __init__(self, method: Method, config: PruneConfig, batches: Sequence[Batch] | None) -> None:
        self.method = method
        self.score_config = method.score_config(config)
        self.batches = batches
        self.scorings = 0
        self._importance: dict[str, list[float]] | None = None

    def importance(self, model: nn.Module, mask: HeadMask, progress: PruneProgress | None) -> dict[str, list[float]]:
        if self._importance is None:
            scores = score_masked(model, mask, self.batches, self.score_config, progress)
            self.scorings += 1
            self._importance = oriented(scores.importance(), self.method.inverse)
        return self._importance


def one_shot_methods(scorers: Sequence[str], no_inverse: Sequence[str]) -> list[Method]:
    """A one-shot method per scorer, and an inverse one per scorer not in ``no_inverse``."""
    forward = [
        Method(name=name, summary="one-shot: a seeded random mask (--seed)" if name == "random" else
               f"one-shot: remove the heads {name} ranks least important", scorer=name, rescoring=False,
               inverse=False, default_step=ten_percent, default_normalize="none", make=OneShotRanker)
        for name in scorers
    ]
    inverse = [
        Method(name=f"inverse-{name}", summary=f"one-shot, reversed: remove the heads {name} ranks most important "
               "first (diagnostic)", scorer=name, rescoring=False, inverse=True, default_step=ten_percent,
               default_normalize="none", make=OneShotRanker)
        for name in scorers if name not in no_inverse
    ]
    return forward + inverse
