"""``greedy-entropy``: Greedy-Gnorm's greedy loop (Guo & Sheridan, arXiv:2602.04491, Algorithm 1) with the
paper's attention-entropy score (AE, §2.2.1, §3.3) in place of Gnorm: a documented variant, headcut's own.

    repeat:                                            (Algorithm 1, lines 3-8)
        AE_h <- mean over real query tokens of H_eps(p)  for every kept head, on the masked model
                H_eps(p) = -sum_j (p_j + eps) log(p_j + eps)              (eq. 20)
        remove the head with the highest AE (the most diffuse: low AE = focused = important)
    until the budget is met

The paper compares one-shot AE pruning (``headcut prune --method entropy``) with Greedy-Gnorm; this method
separates the two changes, the score and the re-computation after every removal, so the gain of the
greedy loop alone can be measured. ``epsilon`` is eq. 20's rectification constant (the authors' 1e-7);
``focused_first`` removes the most focused heads first instead (a diagnostic, like Inverse-Gnorm §4.1).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..config import DEFAULT_EPSILON, PruneConfig, ScoreConfig
from ..options import option
from .base import PruneResult
from .method import Problem
from .ranked import RankOptions, ScoreMethod, one_head


@dataclass
class GreedyEntropyOptions(RankOptions):
    """The score-based options plus eq. 20's ``epsilon`` and ``focused_first``."""

    epsilon: float = option(
        DEFAULT_EPSILON,
        low=0,
        high=1e-2,
        low_open=True,
        help="Eq. 20's rectification constant of the attention entropy.",
    )
    focused_first: bool = option(
        False,
        help="Remove the most focused (lowest-entropy) heads first: a diagnostic, "
        "as Inverse-Gnorm is for Greedy-Gnorm.",
    )


class GreedyEntropy(ScoreMethod):
    """:class:`ScoreMethod` over the ``entropy`` scorer, re-scored after every step, with its two options."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "entropy", rescoring=True, inverse=False, default_step=one_head)
        self.Options = GreedyEntropyOptions

    def score_config(self, config: PruneConfig, options: GreedyEntropyOptions) -> ScoreConfig:
        return ScoreConfig(
            scorer="entropy", normalize=options.normalize or "none", seed=config.seed, epsilon=options.epsilon
        )

    def run(self, problem: Problem, options: GreedyEntropyOptions) -> PruneResult:
        method = copy.copy(self)
        method.inverse = options.focused_first
        return ScoreMethod.run(method, problem, options)


METHOD = GreedyEntropy("greedy-entropy")
