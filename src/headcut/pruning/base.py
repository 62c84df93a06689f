"""Types shared by the pruning methods: the config, the result, the metric and the ranker interface."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from torch import nn

from ..data import Calibration
from ..errors import HeadcutError
from ..evaluation import evaluate
from ..gating import gated
from ..masks import GQA_POLICIES, HeadMask
from ..scoring.base import (
    ABS_PER,
    NORMALIZE,
    OBJECTIVES,
    Batch,
    HeadScores,
    ScoreConfig,
)

#: ``progress(phase, done, total)``: phase ``"prune"`` (heads removed of the most that may go),
#: ``"score"`` and ``"eval"`` (batches of one scoring or evaluation pass); total None if unknown
PruneProgress = Callable[[str, int, int | None], None]

#: methods of later work: named so that asking for one gets a clear answer
NOT_YET_METHODS = ("auber", "lottery")

#: the fraction of heads one step removes by default (Michel et al.: 10 % of the heads per step)
DEFAULT_STEP_FRACTION = 0.1


@dataclass
class PruneConfig:
    """How to prune.

    ``method``: a name in :data:`headcut.pruning.METHODS`. Budget: exactly one of ``keep`` (heads
    left) and ``sparsity`` (fraction removed: keep = floor((1 - s) * heads)), or ``max_drop`` (stop
    before the metric drops by more than this, in the metric's own units) with ``keep``/``sparsity``
    optional as a floor. ``step``: heads removed per step (a step removes whole units: at most
    ``step`` heads, at least one unit); None = the method's default. ``uniform``: the same number of
    heads in every block. ``min_heads_per_block``: never take a block below this. ``gqa``: the
    grouped-query policy (units and slimming). ``seed``: the random scorer's seed. ``normalize``
    (None = the method's default), ``abs_per`` and ``objective``: the scorer options of
    :class:`headcut.scoring.ScoreConfig`. ``trajectory``: evaluate after every step (needs a metric).
    ``training``: the :class:`headcut.pruning.gate_training.LearnedOptions` of a learned-gate method
    (None: its defaults).
    """

    method: str = "gradient"
    keep: int | None = None
    sparsity: float | None = None
    max_drop: float | None = None
    step: int | None = None
    uniform: bool = False
    min_heads_per_block: int = 0
    gqa: str = "auto"
    seed: int = 0
    normalize: str | None = None
    abs_per: str = "example"
    objective: str = "loss"
    trajectory: bool = False
    training: Any = None

    def validate(self) -> None:
        """One-line errors for values that cannot work (the method name is checked by the registry)."""
        if self.keep is not None and self.sparsity is not None:
            raise HeadcutError("give one budget: --keep or --sparsity, not both")
        if self.keep is None and self.sparsity is None and self.max_drop is None:
            raise HeadcutError("no budget: pass --keep K, --sparsity S or --max-drop D")
        if self.keep is not None and (isinstance(self.keep, bool) or self.keep < 0):
            raise HeadcutError(f"--keep must be a head count >= 0 (got {self.keep})")
        if self.sparsity is not None and not (0.0 <= self.sparsity <= 1.0 and math.isfinite(self.sparsity)):
            raise HeadcutError(f"--sparsity must be a fraction in [0, 1] (got {self.sparsity})")
        if self.max_drop is not None and not (self.max_drop >= 0 and math.isfinite(self.max_drop)):
            raise HeadcutError(f"--max-drop must be a number >= 0 in the metric's units (got {self.max_drop})")
        if self.step is not None and self.step < 1:
            raise HeadcutError(f"--step must be at least 1 head (got {self.step})")
        if self.min_heads_per_block < 0:
            raise HeadcutError(f"--min-heads-per-block must be >= 0 (got {self.min_heads_per_block})")
        if self.gqa not in GQA_POLICIES:
            raise HeadcutError(f"unknown --gqa policy {self.gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
        for name, value, valid in (
            ("normalize", self.normalize, (None, *NORMALIZE)),
            ("abs-per", self.abs_per, ABS_PER),
            ("objective", self.objective, OBJECTIVES),
        ):
            if value not in valid:
                raise HeadcutError(f"unknown --{name} {value!r}; choose one of {', '.join(v for v in valid if v)}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.training is not None and not isinstance(out["training"], dict):
            out["training"] = self.training.to_json()
        return out


@dataclass
class TrajectoryPoint:
    """The model after one step: ``heads`` left, the ``metric`` (None without a metric), the heads
    this step removed (``"block:head"``, the input model's numbering), whether the step re-scored the
    heads first, and whether the metric stayed within ``--max-drop`` (None without it)."""

    step: int
    heads: int
    metric: float | None
    removed: list[str] = field(default_factory=list)
    rescored: bool = False
    within: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PruneResult:
    """What :func:`headcut.pruning.plan_prune` decided.

    ``mask``: the kept heads (every block, the input model's current numbering; a ``{"keep": ...}``
    mask). ``trajectory``: step 0 (the input model) and every step after. ``stopped``: ``budget``
    (reached --keep/--sparsity), ``max-drop`` (the next step dropped the metric by more than
    --max-drop; the mask is the step before), ``floor`` (--max-drop reached its floor: --keep,
    --sparsity, or nothing left to remove). ``scorings``: scoring passes made. ``score_config``: the
    scorer options used (method defaults resolved). ``slim``: filled by
    :func:`headcut.pruning.prune` (the :class:`~headcut.surgery.SlimResult`)."""

    method: str
    mask: HeadMask
    heads_before: dict[str, int]
    heads_after: dict[str, int]
    trajectory: list[TrajectoryPoint]
    stopped: str
    scorings: int
    seconds: float
    config: PruneConfig
    metric: str | None = None
    higher_is_better: bool | None = None
    metric_before: float | None = None
    metric_after: float | None = None
    target: int | None = None
    score_config: ScoreConfig | None = None
    slim: Any = None
    training: Any = None

    @property
    def total_before(self) -> int:
        return sum(self.heads_before.values())

    @property
    def total_after(self) -> int:
        return sum(self.heads_after.values())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "mask": self.mask.to_json(),
            "heads_before": self.total_before,
            "heads_after": self.total_after,
            "heads_per_block_before": dict(self.heads_before),
            "heads_per_block_after": dict(self.heads_after),
            "target": self.target,
            "stopped": self.stopped,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "metric_before": self.metric_before,
            "metric_after": self.metric_after,
            "trajectory": [p.to_json() for p in self.trajectory],
            "scorings": self.scorings,
            "seconds": self.seconds,
            "config": self.config.to_json(),
            "score_config": None if self.score_config is None else self.score_config.to_json(),
        }
        if self.slim is not None:
            out["slim"] = self.slim.to_json()
        if self.training is not None:
            out["training"] = self.training.to_json()
        return out


@dataclass
class Metric:
    """A quality measure of the model with only some heads: ``measure(mask)`` (the mask is complete,
    in the model's current numbering), its ``name`` and orientation."""

    name: str
    higher_is_better: bool
    measure: Callable[[HeadMask], float]


def eval_metric(model: nn.Module, calibration: Calibration, progress: PruneProgress | None = None) -> Metric:
    """The primary metric of :func:`headcut.evaluate` on ``calibration``, with the heads outside the
    mask gated to zero (exact: the slimmed model computes the same outputs). BLEU is not generated."""
    from ..evaluation import PRIMARY

    if calibration.task not in PRIMARY:
        raise HeadcutError(f"cannot evaluate task {calibration.task!r}")
    name, higher = PRIMARY[calibration.task]

    from ..surgery import model_blocks

    heads = {b.name: b.heads for b in model_blocks(model)}

    def measure(mask: HeadMask) -> float:
        full = all(len(mask.keep[name]) == n for name, n in heads.items())
        on_batch = None if progress is None else (lambda d, t: progress("eval", d, t))
        with nullcontext() if full else gated(model, mask):
            return evaluate(model, calibration, progress=on_batch, bleu=False).value

    return Metric(name, higher, measure)


def within_drop(before: float, value: float, max_drop: float, higher_is_better: bool) -> bool:
    """Whether ``value`` is within ``max_drop`` of ``before`` (absolute, in the metric's units: a
    higher-is-better metric may fall by at most max_drop, a lower-is-better one rise by at most it)."""
    if math.isnan(value):
        return False
    change = before - value if higher_is_better else value - before
    if math.isnan(change):  # inf - inf: no worse than an infinite start
        return True
    return change <= max_drop + 1e-9 * max(1.0, abs(max_drop), abs(before))


class Ranker(Protocol):
    """A method's head order: ``importance(model, mask, progress)`` -> per block, one value per head
    (current numbering), higher = keep longer. ``rescoring``: whether it scores again on the masked
    model at every step (else it is called with the unmasked model first and may cache)."""

    rescoring: bool
    scorings: int

    def importance(self, model: nn.Module, mask: HeadMask, progress: PruneProgress | None) -> dict[str, list[float]]:
        ...


CalibrationLike = Calibration | Sequence[Batch] | None


def batches_of(calibration: CalibrationLike) -> Sequence[Batch] | None:
    """The batches of a Calibration, or the sequence itself."""
    if isinstance(calibration, Calibration):
        return calibration.batches
    return calibration


def score_masked(
    model: nn.Module, mask: HeadMask, batches: Sequence[Batch] | None, config: ScoreConfig,
    progress: PruneProgress | None = None,
) -> HeadScores:
    """Score the heads of ``model`` with the heads outside ``mask`` gated to zero (the re-scoring of
    the iterative methods: a masked head takes no part in the forward, so it gets no gradient)."""
    from ..scoring import score
    from ..surgery import model_blocks

    full = all(len(mask.keep[b.name]) == b.heads for b in model_blocks(model))
    on_batch = None if progress is None else (lambda d, t: progress("score", d, t))
    with nullcontext() if full else gated(model, mask):
        return score(model, batches, config, progress=on_batch)


def ten_percent(total: int) -> int:
    """Michel et al.'s step: 10 % of the heads, at least one (their code: max(1, int(0.1 * heads)))."""
    return max(1, int(total * DEFAULT_STEP_FRACTION))


def one_head(total: int) -> int:
    """Greedy-Gnorm's step: one head (one unit) per re-computation (Algorithm 1)."""
    return 1


@dataclass(frozen=True)
class Method:
    """A registered pruning method.

    ``scorer``: the :mod:`headcut.scoring` scorer that ranks the heads; ``rescoring``: scored again
    on the masked model before every step (else once, on the input model); ``inverse``: removes the
    most important heads first; ``default_step(heads)``: heads per step when --step is not given;
    ``default_normalize``: --normalize when not given; ``make(method, config, batches)``: the
    ranker (a class taking those three)."""

    name: str
    summary: str
    scorer: str
    rescoring: bool
    inverse: bool
    default_step: Callable[[int], int]
    default_normalize: str
    make: Callable[[Method, PruneConfig, Sequence[Batch] | None], Ranker]

    def score_config(self, config: PruneConfig) -> ScoreConfig:
        """The scorer options of ``config`` for this method."""
        return ScoreConfig(
            scorer=self.scorer, normalize=config.normalize or self.default_normalize, abs_per=config.abs_per,
            objective=config.objective, seed=config.seed,
        )


def oriented(importance: dict[str, list[float]], inverse: bool) -> dict[str, list[float]]:
    """``importance`` as it is, or negated for an inverse method (the most important go first)."""
    if not inverse:
        return importance
    return {name: [-v for v in values] for name, values in importance.items()}


class RescoringRanker:
    """Scores the masked model again before every step (the iterative methods)."""

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
