"""``greedy-gnorm`` and ``inverse-gnorm``: Greedy-Gnorm's Algorithm 1 (001_*.txt sec. 3.1).

    repeat:                                   (Algorithm 1, lines 3-8)
        N_Q, N_K, N_V <- ComputeGnorm(model under the current mask)     (eqs. 9-16)
        Gnorm <- N_Q * N_K * N_V                                          (eq. 17)
        remove argmin Gnorm over the heads still kept; update the mask
    until the budget is met (or the accuracy rule of ``--max-drop`` stops it)

The Gnorm scores are those of the ``gnorm`` scorer (``--objective loss`` or ``logits-norm``), computed
with the removed heads gated to 0 (they take no part in the forward, so their Q, K and V blocks get
no gradient; only kept units are candidates). ``--step N`` removes N heads per re-computation for
speed (default 1, as in the paper; on shared-weight blocks one unit is one head in every sharing
layer, like the paper's ALBERT).

``inverse-gnorm`` (sec. 4.1, "Inverse-Gnorm": a dynamic baseline that removes the most
gradient-active heads first) runs the same loop and removes the argmax instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..masks import HeadMask
from ..scoring.base import Batch
from .base import Method, PruneConfig, PruneProgress, one_head, oriented, score_masked


class GreedyGnormRanker:
    """Re-computes Gnorm on the masked model before every removal step."""

    rescoring = True

    def __init__(self, method: Method, config: PruneConfig, batches: Sequence[Batch] | None) -> None:
        self.inverse = method.inverse
        self.score_config = method.score_config(config)
        self.batches = batches
        self.scorings = 0

    def importance(self, model: nn.Module, mask: HeadMask, progress: PruneProgress | None) -> dict[str, list[float]]:
        scores = score_masked(model, mask, self.batches, self.score_config, progress)
        self.scorings += 1
        return oriented(scores.importance(), self.inverse)


METHODS = [
    Method(
        name="greedy-gnorm", summary="iterative: remove the lowest-Gnorm head, re-compute, repeat (Greedy-Gnorm, "
        "Algorithm 1)", scorer="gnorm", rescoring=True, inverse=False, default_step=one_head,
        default_normalize="none", make=GreedyGnormRanker,
    ),
    Method(
        name="inverse-gnorm", summary="iterative, reversed: remove the highest-Gnorm head, re-compute, repeat "
        "(diagnostic)", scorer="gnorm", rescoring=True, inverse=True, default_step=one_head,
        default_normalize="none", make=GreedyGnormRanker,
    ),
]
