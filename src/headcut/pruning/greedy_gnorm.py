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

from .base import Method, RescoringRanker, one_head

METHODS = [
    Method(
        name="greedy-gnorm", summary="iterative: remove the lowest-Gnorm head, re-compute, repeat (Greedy-Gnorm, "
        "Algorithm 1)", scorer="gnorm", rescoring=True, inverse=False, default_step=one_head,
        default_normalize="none", make=RescoringRanker,
    ),
    Method(
        name="inverse-gnorm", summary="iterative, reversed: remove the highest-Gnorm head, re-compute, repeat "
        "(diagnostic)", scorer="gnorm", rescoring=True, inverse=True, default_step=one_head,
        default_normalize="none", make=RescoringRanker,
    ),
]
