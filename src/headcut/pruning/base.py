"""Types shared by the pruning methods: the result, the metric and the ranker interface (the common
configuration is :class:`headcut.config.PruneConfig`, each method's options are in its module)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from torch import nn

from .. import scoring
from ..config import PruneConfig, ScoreConfig
from ..data import Calibration
from ..errors import HeadcutError
from ..model.evaluation import PRIMARY, evaluate
from ..model.gating import gated
from ..model.masks import HeadMask
from ..model.surgery import HeadTotals, model_blocks
from ..scoring.base import Batch, HeadScores


def seed_in_range(value: int) -> int:
    """A seed derived from the run's (``seed * 1_000_003 + step``, ``seed + i``) that torch takes: one in
    [-2**63, 2**64) as it is, a larger or smaller one wrapped round to 64 bits as torch wraps a negative one
    (a seed near the ends of the range the user may give must not make torch overflow)."""
    return value if -(2**63) <= value < 2**64 else value % 2**64


#: ``progress(phase, done, total)``: phase ``"prune"`` (heads removed of the most that may go),
#: ``"score"`` and ``"eval"`` (batches of one scoring or evaluation pass); total None if unknown
PruneProgress = Callable[[str, int, int | None], None]


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
class PruneResult(HeadTotals):
    """What :func:`headcut.pruning.plan_prune` decided.

    ``mask``: the kept heads (every block, the input model's current numbering; a ``{"keep": ...}``
    mask). ``trajectory``: step 0 (the input model) and every step after. ``stopped``: ``budget``
    (reached --keep/--sparsity), ``max-drop`` (the next step dropped the metric by more than
    --max-drop; the mask is the step before), ``floor`` (--max-drop reached its floor: --keep,
    --sparsity, or nothing left to remove), ``policy`` (a method that decides the count: its own
    choice), ``bound`` (it was held to the --keep/--sparsity upper bound). ``scorings``: scoring (or
    reward evaluation) passes made. ``score_config``: the
    scorer options used (method defaults resolved). ``training``: a learned-gate method's training run;
    ``details``: another method's own record (AUBER's layers), reported under the method's name.
    ``slim``: filled by :func:`headcut.pruning.prune` (the :class:`~headcut.model.surgery.SlimResult`)."""

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
    options: Any = None
    details: Any = None
    #: a byte budget's record (:class:`headcut.pruning.costs.KvRecord`), None for a budget in heads
    kv: Any = None
    #: a score-based method's importance of every head on the input model (higher: more important; None for
    #: other methods): what the ``allocate`` stage ranks a block's KV groups by
    importance: dict[str, list[float]] | None = None

    def section(self) -> dict[str, Any]:
        """The method's own part of the report: the scorer options of a score-based method, the training
        run of a learned one."""
        out: dict[str, Any] = {}
        if self.options is not None:
            out["options"] = asdict(self.options)
        if self.score_config is not None:
            out["score_config"] = self.score_config.to_json()
        if self.training is not None:
            out["training"] = self.training.to_json()
        if self.details is not None:
            out[self.method] = self.details.to_json()
        if self.kv is not None:
            out["kv_budget"] = self.kv.to_json()
        return out

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
            **self.section(),
        }
        if self.slim is not None:
            out["slim"] = self.slim.to_json()
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

    if calibration.task not in PRIMARY:
        raise HeadcutError(f"cannot evaluate task {calibration.task!r}")
    name, higher = PRIMARY[calibration.task]

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

    def importance(
        self, model: nn.Module, mask: HeadMask, progress: PruneProgress | None
    ) -> dict[str, list[float]]: ...


CalibrationLike = Calibration | Sequence[Batch] | None


def batches_of(calibration: CalibrationLike) -> Sequence[Batch] | None:
    """The batches of a Calibration, or the sequence itself."""
    if isinstance(calibration, Calibration):
        return calibration.batches
    return calibration


def score_masked(
    model: nn.Module,
    mask: HeadMask,
    batches: Sequence[Batch] | None,
    config: ScoreConfig,
    progress: PruneProgress | None = None,
) -> HeadScores:
    """Score the heads of ``model`` with the heads outside ``mask`` gated to zero (the re-scoring of
    the iterative methods: a masked head takes no part in the forward, so it gets no gradient)."""

    full = all(len(mask.keep[b.name]) == b.heads for b in model_blocks(model))
    on_batch = None if progress is None else (lambda d, t: progress("score", d, t))
    with nullcontext() if full else gated(model, mask):
        return scoring.score(model, batches, config, progress=on_batch)  # looked up when called (tests count calls)
