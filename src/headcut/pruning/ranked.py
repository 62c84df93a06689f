"""The score-based methods: a scorer of ``headcut score`` ranks the heads, once (one-shot) or again on
the masked model before every step (iterative), and the exact-budget search of
:mod:`headcut.pruning.search` removes the lowest-ranked units.

The methods themselves are instances of :class:`ScoreMethod`, one module each: :mod:`.oneshot`
(every scorer once, and its inverse), :mod:`.michel`, :mod:`.greedy_gnorm`. Their options
(:class:`RankOptions` and the scorer-specific :class:`GradientOptions` / :class:`GnormOptions`):

* ``step``: heads removed per step (whole units: at most ``step``, at least one unit); None: the
  method's default (10 % of the heads for Michel et al., one head for Greedy-Gnorm). One-shot methods
  without ``--max-drop``/``--trajectory`` go to K in one step (their ranking is fixed anyway).
* ``rounds``: reach the target in this many steps instead, the heads to remove split as evenly as
  whole steps allow, the larger steps first (``ceil(left / rounds left)`` heads a step: TextPruner's
  ``n_iters`` schedule); not with ``step``. The cost of a re-scoring method is then ``rounds``
  scorings, whatever K.
* ``normalize``: ``none`` or ``layer`` (divide each block's scores by their L2 norm); None: the
  method's default (``layer`` for michel, as Michel et al. §4.1).
* ``abs_per`` (gradient scorer), ``objective`` and ``per`` (gnorm scorer): see
  :class:`headcut.config.ScoreConfig`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from ..catalog import ABS_PER, GNORM_PER, NORMALIZE, OBJECTIVES
from ..config import PruneConfig, ScoreConfig
from ..data import Calibration
from ..errors import HeadcutError
from ..model.masks import HeadMask
from ..options import OptionError, check_fields, option
from ..scoring import get_scorer
from ..scoring.base import Batch
from .base import PruneProgress, PruneResult, batches_of, score_masked
from .costs import Judge, loss_judge
from .method import MethodBase, Problem
from .search import Budget, run_search
from .units import BlockSet


@dataclass
class RankOptions:
    """Options of every score-based method (see the module's doc)."""

    step: int | None = option(
        None,
        low=1,
        help="Heads removed per step (whole units: at most N, at least one); "
        "default: 10 % of the heads, 1 for the greedy methods.",
    )
    rounds: int | None = option(
        None,
        low=1,
        metavar="R",
        help="Reach K in R steps instead of steps of --step, the "
        "heads to remove split evenly, the larger steps first (TextPruner's schedule; an "
        "iterative method then scores R times whatever K).",
    )
    normalize: str | None = option(
        None,
        choices=NORMALIZE,
        help="Divide each block's scores by their L2 norm; default: layer for michel, none otherwise.",
    )

    def validate(self) -> None:
        check_fields(self)
        if self.step is not None and self.rounds is not None:
            raise OptionError("{step} and {rounds} both set how many heads a step removes: give one of them")


@dataclass
class GradientOptions(RankOptions):
    """Options of the methods ranked by the gradient scorer: ``abs_per`` example (Michel et al.) or batch."""

    abs_per: str = option(
        "example", choices=ABS_PER, help="|dL/dg| per example (Michel et al.) or per batch (TextPruner)."
    )


@dataclass
class GnormOptions(RankOptions):
    """Options of the methods ranked by Gnorm: ``objective`` (logits-norm, the paper's; or loss) and
    ``per`` (the gradient norms of every batch, or of every example)."""

    objective: str = option(
        "logits-norm", choices=OBJECTIVES, help="Gradient of the logits' norm (the paper's) or of the task loss."
    )
    per: str = option(
        "batch",
        choices=GNORM_PER,
        help="Gradient norms of every batch (the authors' code) or every "
        "example (the paper's per-sentence description).",
    )


@dataclass
class FluctuationOptions(RankOptions):
    """Options of the methods ranked by FLAP's fluctuation: ``bias_compensation`` (FLAP §3.4)."""

    bias_compensation: bool = option(
        False,
        help="FLAP's bias compensation: the removed heads' mean output folded "
        "into the output projection's bias (needs a bias there, or a stock attention_bias "
        "field).",
    )


OPTIONS_OF_SCORER: dict[str, type[RankOptions]] = {
    "gradient": GradientOptions,
    "gnorm": GnormOptions,
    "fluctuation": FluctuationOptions,
}


def oriented(importance: dict[str, list[float]], inverse: bool) -> dict[str, list[float]]:
    """``importance`` as it is, or negated for an inverse method (the most important go first)."""
    if not inverse:
        return importance
    return {name: [-v for v in values] for name, values in importance.items()}


def protect(importance: dict[str, list[float]], protected: Mapping[str, float]) -> dict[str, list[float]]:
    """``importance`` with every head of the ``protected`` blocks (name -> measured cost) ranked above every other
    head, the block of least cost lowest (finite values, so that sums and ratios stay numbers): they go only when
    the budget cannot be met otherwise, the cheapest first."""
    if not protected:
        return importance
    top = max((abs(v) for values in importance.values() for v in values), default=1.0)
    above = 1e6 * max(top, 1.0)
    return {
        name: [above * (1 + max(protected[name], 0.0)) + abs(v) for v in values] if name in protected else values
        for name, values in importance.items()
    }


class Ranker:
    """Scores the heads with the method's scorer: again before every step (``rescoring``), or once
    on the input model and then from memory."""

    def __init__(
        self,
        method: ScoreMethod,
        config: ScoreConfig,
        batches: Sequence[Batch] | None,
        protected: Mapping[str, float] | None = None,
    ) -> None:
        self.rescoring = method.rescoring
        self.inverse = method.inverse
        self.protected = dict(protected or {})
        self.score_config = config
        self.batches = batches
        self.scorings = 0
        self._importance: dict[str, list[float]] | None = None
        #: the importance on the input model (oriented, before any protection): what a later stage ranks by
        self.first: dict[str, list[float]] | None = None

    def importance(self, model: nn.Module, mask: HeadMask, progress: PruneProgress | None) -> dict[str, list[float]]:
        if self.rescoring or self._importance is None:
            scores = score_masked(model, mask, self.batches, self.score_config, progress)
            self.scorings += 1
            own = oriented(scores.importance(), self.inverse)
            if self.first is None:
                self.first = own
            self._importance = protect(own, self.protected)
        return self._importance


class ScoreMethod(MethodBase):
    """A score-based method: ``scorer`` ranks the heads; ``rescoring``: scored again on the masked model
    before every step; ``inverse``: the most important go first; ``default_step(heads)``: heads per
    step without ``step``; ``default_normalize``: ``normalize`` when not given."""

    def __init__(
        self,
        name: str,
        scorer: str,
        rescoring: bool,
        inverse: bool,
        default_step: Callable[[int], int],
        default_normalize: str = "none",
    ) -> None:
        self.name = name
        self.scorer = scorer
        self.rescoring = rescoring
        self.inverse = inverse
        self.default_step = default_step
        self.default_normalize = default_normalize
        self.Options = OPTIONS_OF_SCORER.get(scorer, RankOptions)

    def __repr__(self) -> str:
        return f"ScoreMethod({self.name!r})"

    def score_config(self, config: PruneConfig, options: RankOptions) -> ScoreConfig:
        """The scorer options of this run (the method's defaults filled in)."""
        extra = {k: getattr(options, k) for k in ("abs_per", "objective", "per") if hasattr(options, k)}
        return ScoreConfig(
            scorer=self.scorer, normalize=options.normalize or self.default_normalize, seed=config.seed, **extra
        )

    def step(self, total: int, config: PruneConfig, options: RankOptions) -> tuple[int, bool]:
        stepwise = (
            self.rescoring
            or config.max_drop is not None
            or config.trajectory
            or options.step is not None
            or options.rounds is not None
        )
        return (options.step if options.step is not None else self.default_step(total)), stepwise

    def run(self, problem: Problem, options: RankOptions) -> PruneResult:
        batches = batches_of(problem.data)
        if self.entry.data != "none" and not batches:
            raise HeadcutError(f"method {self.name} needs calibration data (its scorer is {self.scorer})")
        score_config = self.score_config(problem.config, options)
        ranker = Ranker(self, score_config, batches if self.entry.data != "none" else None, problem.protected)
        budget = problem.budget if options.rounds is None else replace(problem.budget, rounds=options.rounds)
        result = run_search(
            problem.model,
            problem.blocks,
            problem.sets,
            budget,
            ranker,
            problem.config,
            problem.metric,
            problem.progress,
            judge=calibration_judge(problem, budget),
        )
        result.score_config = score_config
        result.importance = ranker.first
        return result

    def check_units(self, sets: list[BlockSet], budget: Budget, config: PruneConfig, options: Any) -> None:
        """Refuses a scorer that compares heads within a block only (:attr:`Scorer.within_block`) on a model
        whose every block is one unit: each unit would score the block's mean, 0, and the cut would be
        arbitrary."""
        super().check_units(sets, budget, config, options)

        if not get_scorer(self.scorer).within_block:
            return
        attention = [s for s in sets if s.heads]
        whole = [s for s in attention if s.mode == "group" and s.group_size >= s.heads]
        if attention and len(whole) == len(attention):
            raise HeadcutError(
                f"{self.name} cannot rank this model's units: its scores are standardised within each block, "
                f"and every block is one unit here (e.g. {whole[0].names[0]}: {whole[0].heads} query heads "
                f"sharing one KV head, under --gqa {config.gqa}), so every unit would score 0 and the cut would be "
                "arbitrary; use a scorer that compares layers (gradient), or --gqa uniform (query heads ranked within "
                "their layer; the KV cache shrinks only where a layer loses every head)"
            )


def calibration_judge(problem: Problem, budget: Budget) -> Judge | None:
    """A byte budget's refinement measure (:mod:`.costs`): the calibration data's loss (its task's primary
    metric, oriented so that lower is better) with only a mask's heads; None where there is nothing to refine
    or no calibration data to measure it on."""
    if budget.bytes is None or budget.bytes.by_heads or budget.bytes.allocation != "cost":
        return None
    if not isinstance(problem.data, Calibration):
        return None
    return loss_judge(problem.model, problem.data, problem.progress)


def ten_percent(total: int) -> int:
    """Michel et al.'s step: 10 % of the heads, at least one (their code: max(1, int(0.1 * heads)))."""
    return max(1, int(total * 0.1))


def one_head(total: int) -> int:
    """Greedy-Gnorm's step: one head (one unit) per re-computation (Algorithm 1)."""
    return 1
