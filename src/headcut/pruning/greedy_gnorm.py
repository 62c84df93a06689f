"""``greedy-gnorm`` and ``inverse-gnorm``: Greedy-Gnorm's Algorithm 1 (Guo & Sheridan, arXiv:2602.04491 §3.1).

    repeat:                                   (Algorithm 1, lines 3-8)
        N_Q, N_K, N_V <- ComputeGnorm(model under the current mask)     (eqs. 9-16)
        Gnorm <- N_Q * N_K * N_V                                          (eq. 17)
        remove argmin Gnorm over the heads still kept; update the mask
    until the budget is met (or the accuracy rule of ``--max-drop`` stops it)

The Gnorm scores are those of the ``gnorm`` scorer, computed with the removed heads gated to 0 (they
take no part in the forward, so their Q, K and V blocks get no gradient; only kept units are
candidates). Its objective is the paper's and the authors' code's by default: the gradient of the
L2 norm of the output logits (label-free); ``--objective loss`` uses the task loss instead.
``--per example`` takes the gradient norms of every sentence (the paper's description, eq. 9-16)
instead of every batch (the authors' code). ``--step N`` removes N heads per re-computation for
speed (default 1, as in the paper; on shared-weight blocks one unit is one head in every sharing
layer, like the paper's ALBERT).

``inverse-gnorm`` (§4.1, "Inverse-Gnorm": a dynamic baseline that removes the most gradient-active
heads first) runs the same loop and removes the argmax instead.
"""

from __future__ import annotations

from .ranked import ScoreMethod, one_head

METHOD = ScoreMethod("greedy-gnorm", "gnorm", rescoring=True, inverse=False, default_step=one_head)
INVERSE = ScoreMethod("inverse-gnorm", "gnorm", rescoring=True, inverse=True, default_step=one_head)
