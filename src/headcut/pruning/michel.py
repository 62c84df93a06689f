"""``michel``: Michel et al.'s iterative pruning (NeurIPS 2019, arXiv:1905.10650 §4; as summarised in the
DSP paper, arXiv:2108.04657 §4.2.1, eq. 21).

    iota_h = 1/M * sum_m | dL(y_m, x_m) / dg_h |         (DSP eq. 21; Michel et al. eq. 2: the ``gradient`` scorer)

"All the heads in the model are sorted accordingly and removed one by one in a greedy fashion. The
importance scores are re-computed every time a certain number of heads are removed": here every
step removes the lowest-scoring units (``--step`` heads, default 10 % of the heads as in Michel et
al.'s code, ``max(1, int(0.1 * heads))``), then the heads left are scored again on the *masked*
model (removed heads gated to 0, so they get no gradient). Scores are normalised per block by
their L2 norm by default (Michel et al. §4.1; ``--normalize none`` turns it off); ``--abs-per``
picks |dL/dg| per example (default, eq. 21) or per batch.
"""

from __future__ import annotations

from .ranked import ScoreMethod, ten_percent

METHOD = ScoreMethod(
    "michel", "gradient", rescoring=True, inverse=False, default_step=ten_percent, default_normalize="layer"
)
