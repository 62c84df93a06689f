"""How ``headcut score`` (and the score-based methods) score heads: :class:`ScoreConfig`; what ``score`` writes
besides its report: :class:`PlotOptions`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..catalog import ABS_PER, GNORM_PER, NORMALIZE, OBJECTIVES, SCORERS, scorer_entry
from ..options import check_fields, option

#: the epsilon of Greedy-Gnorm's rectified attention entropy (reference code: ``e = 0.0000001``)
DEFAULT_EPSILON = 1e-7


@dataclass
class ScoreConfig:
    """How to score heads.

    ``scorer``: a name in :data:`headcut.catalog.SCORERS`. ``normalize``: ``none`` or ``layer``
    (Michel et al. §4.1: divide each block's scores by their L2 norm). ``abs_per`` (gradient):
    ``example`` (Michel et al.: mean over examples of |dL_i/dg|) or ``batch`` (TextPruner: mean over
    batches of |dL_batch/dg|). ``objective`` (gnorm): ``logits-norm`` (Greedy-Gnorm's: the gradient of
    the L2 norm of the output logits, label-free) or ``loss`` (the task loss). ``per`` (gnorm): the
    gradient norms of every ``batch`` (the authors' code) or of every ``example`` (the paper's
    per-sentence description, eq. 9-16), averaged. ``seed`` (random). ``epsilon`` (entropy): the
    rectification constant."""

    scorer: str = option(
        "gradient",
        choices=tuple(SCORERS),
        metavar="SCORER",
        panel="Options",
        help=f"Scorer: {', '.join(SCORERS)} (see above).",
    )
    normalize: str = option(
        "none",
        choices=NORMALIZE,
        panel="Options",
        help="layer: divide each block's scores by their L2 norm (Michel et al. 4.1).",
    )
    abs_per: str = option(
        "example",
        choices=ABS_PER,
        panel="Options",
        help="gradient: |dL/dg| per example (Michel et al.) or of each batch's mean loss (TextPruner).",
    )
    objective: str = option(
        "logits-norm",
        choices=OBJECTIVES,
        panel="Options",
        help="gnorm: the gradient of the logits' L2 norm (label-free; the paper's) or of the task loss.",
    )
    per: str = option(
        "batch",
        choices=GNORM_PER,
        panel="Options",
        help="gnorm: the gradient norms of every batch (the authors' code) or of every example, averaged.",
    )
    seed: int = 0
    epsilon: float = option(
        DEFAULT_EPSILON,
        low=0,
        high=1,
        low_open=True,
        high_open=True,
        cli=False,
        help="entropy: the rectification constant.",
    )

    def validate(self) -> None:

        scorer_entry(self.scorer)
        check_fields(self)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PlotOptions:
    """What ``headcut score`` writes besides its report (the command line only): ``plot``, a PNG heatmap."""

    plot: str | None = option(
        None,
        metavar="FILE.png",
        panel="Options",
        help="Also write a PNG heatmap (needs matplotlib: pip install 'headcut[plots]').",
    )
