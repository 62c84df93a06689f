"""Head pruning: decide which heads to remove (``plan_prune``) and remove them (``prune``).

```python
from headcut.pruning import PruneConfig, plan_prune, prune

result = plan_prune(model, calibration, PruneConfig(method="greedy-gnorm", keep=48))
result.mask                      # HeadMask in the model's current numbering; the model is unchanged
result = prune(model, calibration, PruneConfig(method="michel", sparsity=0.5))   # + headcut.slim
```

Methods (:data:`METHODS`), one module each: :mod:`.oneshot` (every scorer of ``headcut score``
used once, and its inverse), :mod:`.michel` (iterative re-scoring with the gradient scorer),
:mod:`.greedy_gnorm` (Greedy-Gnorm's Algorithm 1, and inverse-gnorm). Units and budgets:
:mod:`.units`; the removal loop, steps and the ``--max-drop`` rule: :mod:`.search`.
"""

from __future__ import annotations

from torch import nn

from ..data import Calibration
from ..errors import HeadcutError
from ..masks import plan_cuts
from ..scoring import SCORERS
from ..surgery import model_blocks, slim
from . import greedy_gnorm, michel
from .base import (
    LEARNED_GATE_METHODS,
    CalibrationLike,
    Method,
    Metric,
    PruneConfig,
    PruneProgress,
    PruneResult,
    TrajectoryPoint,
    batches_of,
    eval_metric,
    within_drop,
)
from .oneshot import one_shot_methods
from .search import Budget, keep_from_sparsity, resolve_budget, run_search
from .units import BlockSet, block_sets

#: name -> method, in the order ``headcut prune --help`` lists them
METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        *one_shot_methods(list(SCORERS), no_inverse=("gnorm", "random")),
        michel.METHOD,
        *greedy_gnorm.METHODS,
    ]
}


def get_method(name: str) -> Method:
    """The registered method ``name``; a HeadcutError listing the real ones (learned-gate methods of a
    later release get a "not implemented yet" answer)."""
    method = METHODS.get(name)
    if method is not None:
        return method
    if name in LEARNED_GATE_METHODS:
        raise HeadcutError(
            f"method {name!r} (learned gates) is not implemented yet; available methods: {', '.join(METHODS)}"
        )
    raise HeadcutError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")


def needs_data(method: Method) -> bool:
    """Whether the method's scorer reads calibration data."""
    return SCORERS[method.scorer].needs_data


def _stepwise(method: Method, config: PruneConfig) -> bool:
    return method.rescoring or config.max_drop is not None or config.trajectory or config.step is not None


def check_budget(model: nn.Module, config: PruneConfig) -> tuple[list[BlockSet], Budget]:
    """Validate ``config`` against ``model`` (method, flags, budget in units) without scoring:
    the refusals of :func:`plan_prune`, available before any data is read."""
    config.validate()
    method = get_method(config.method)
    sets = block_sets(model_blocks(model), config.gqa)
    total = sum(s.heads * s.width for s in sets)
    budget = resolve_budget(sets, config, method.default_step(total), _stepwise(method, config))
    return sets, budget


def plan_prune(
    model: nn.Module, calibration: CalibrationLike, config: PruneConfig,
    eval_calibration: Calibration | None = None, progress: PruneProgress | None = None,
    metric: Metric | None = None,
) -> PruneResult:
    """Decide which heads to keep; the model is left unchanged.

    ``calibration``: the scoring data (a Calibration or a sequence of batches; None for the data-free
    scorers). ``eval_calibration``: data for the metric of ``--max-drop``/``trajectory`` and the
    metric before/after (:func:`eval_metric`); ``metric`` replaces it with any :class:`Metric`.
    ``progress(phase, done, total)``: see :data:`PruneProgress`. Refusals (HeadcutError) come before
    any scoring."""
    sets, budget = check_budget(model, config)
    method = get_method(config.method)
    batches = batches_of(calibration)
    if needs_data(method) and not batches:
        raise HeadcutError(f"method {method.name} needs calibration data (its scorer is {method.scorer})")
    if metric is None and eval_calibration is not None:
        metric = eval_metric(model, eval_calibration, progress)
    if metric is None and config.max_drop is not None:
        raise HeadcutError("--max-drop needs evaluation data (--eval-data)")
    if metric is None and config.trajectory:
        raise HeadcutError("a trajectory needs evaluation data (--eval-data)")
    blocks = model_blocks(model)
    ranker = method.make(method, config, batches)
    result = run_search(model, blocks, sets, budget, ranker, config, metric, progress)
    result.score_config = method.score_config(config)
    plan_cuts(result.mask, blocks, config.gqa)  # realisable, by construction
    return result


def prune(
    model: nn.Module, calibration: CalibrationLike, config: PruneConfig,
    eval_calibration: Calibration | None = None, progress: PruneProgress | None = None,
    metric: Metric | None = None,
) -> PruneResult:
    """:func:`plan_prune`, then remove the heads with :func:`headcut.slim` (in place, with the
    ``config.gqa`` policy); ``result.slim`` is the :class:`~headcut.surgery.SlimResult`."""
    result = plan_prune(model, calibration, config, eval_calibration, progress, metric)
    result.slim = slim(model, result.mask, gqa=config.gqa)
    return result


__all__ = [
    "METHODS", "Budget", "BlockSet", "Method", "Metric", "PruneConfig", "PruneProgress", "PruneResult",
    "TrajectoryPoint", "block_sets", "check_budget", "eval_metric", "get_method", "keep_from_sparsity",
    "needs_data", "plan_prune", "prune", "within_drop",
]
