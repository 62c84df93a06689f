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

Learned-gate methods (:data:`LEARNED`), one module each: :mod:`.dsp`, :mod:`.ste`, :mod:`.voita`,
:mod:`.lag`, :mod:`.pass_gates` (``pass``), :mod:`.passconc`; they train gates (and, in ``joint``
mode, the model) on the calibration data with the shared engine (:mod:`.gate_training`)::

    config = PruneConfig(method="pass", keep=16, training=LearnedOptions(max_steps=500))
    result = prune(model, train_calibration, config, eval_calibration=dev)   # model trained in place
    result.training.curve()                                                  # the training curve
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from ..data import Calibration
from ..distributed import Dist
from ..errors import HeadcutError
from ..evaluation import PRIMARY
from ..masks import plan_cuts
from ..scoring import SCORERS
from ..surgery import model_blocks, slim
from . import greedy_gnorm, michel
from .base import (
    NOT_YET_METHODS,
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
from .dsp import DSP
from .gate_training import GateLearner, GateRun, LearnedOptions, metric_of, train_gates
from .lag import LAG
from .oneshot import one_shot_methods
from .pass_gates import PASS
from .passconc import PASSCONC
from .search import Budget, keep_from_sparsity, resolve_budget, run_search
from .ste import STE
from .units import BlockSet, block_sets
from .voita import Voita

#: name -> method, in the order ``headcut prune --help`` lists them
METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        *one_shot_methods(list(SCORERS), no_inverse=("gnorm", "random")),
        michel.METHOD,
        *greedy_gnorm.METHODS,
    ]
}


#: name -> learned-gate method (a :class:`GateLearner` class), in the order ``--help`` lists them
LEARNED: dict[str, type[GateLearner]] = {cls.name: cls for cls in (PASS, PASSCONC, DSP, STE, Voita, LAG)}


def method_names() -> list[str]:
    """Every available method: the score-based ones, then the learned-gate ones."""
    return [*METHODS, *LEARNED]


def get_method(name: str) -> Method | type[GateLearner]:
    """The registered method ``name`` (a :class:`Method`, or a learned-gate :class:`GateLearner` class);
    a HeadcutError listing the real ones (methods of a later release get a "not implemented yet"
    answer)."""
    method = METHODS.get(name) or LEARNED.get(name)
    if method is not None:
        return method
    if name in NOT_YET_METHODS:
        raise HeadcutError(
            f"method {name!r} is not implemented yet; available methods: {', '.join(method_names())}"
        )
    raise HeadcutError(f"unknown method {name!r}; choose one of: {', '.join(method_names())}")


def is_learned(method: Method | type[GateLearner]) -> bool:
    return isinstance(method, type) and issubclass(method, GateLearner)


def needs_data(method: Method | type[GateLearner]) -> bool:
    """Whether the method reads data (its scorer's data, or training data for learned gates)."""
    if is_learned(method):
        return True
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
    if is_learned(method):
        for flag, given in (("--max-drop", config.max_drop is not None), ("--step", config.step is not None),
                            ("--trajectory", config.trajectory)):
            if given:
                raise HeadcutError(
                    f"{flag} applies to the score-based methods; {config.method} learns gates for exactly "
                    "--keep/--sparsity heads (its training curve is in the report)"
                )
        if config.max_drop is None and config.keep is None and config.sparsity is None:
            raise HeadcutError(f"{config.method} needs --keep K or --sparsity S")
        if config.training is not None:
            config.training.validate()
        return sets, resolve_budget(sets, config, 1, False)
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
    if is_learned(method):
        return plan_learned(model, calibration, config, eval_calibration)
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


def plan_learned(
    model: nn.Module, calibration: CalibrationLike, config: PruneConfig, eval_calibration: Calibration | None = None,
    checkpoint_dir: str | Path | None = None, resume: bool = False,
    progress: Callable[[int, int | None], None] | None = None, on_step: Callable[[dict[str, Any]], None] | None = None,
    dist: Dist | None = None, identity: dict[str, Any] | None = None,
) -> PruneResult:
    """Train the gates of the learned-gate method ``config.method`` on ``calibration`` (a Calibration
    with labels) and return the exact-K result; ``result.training`` is the :class:`GateRun` (history,
    curve, hyper-parameters). In ``joint`` mode the model's weights are trained in place; the heads
    are not removed (see :func:`prune`). ``eval_calibration``: metric before and after (with the final
    mask), and every ``training.eval_every`` steps. ``checkpoint_dir`` / ``resume``: the engine's
    checkpoints; ``progress(done, total)`` and ``on_step(history entry)`` after every step;
    ``dist``: this process's place in a data-parallel run; ``identity``: more of the run's identity for
    its checkpoints (e.g. the model's path), so that a checkpoint of another run is not resumed."""
    sets, budget = check_budget(model, config)
    learner = get_method(config.method)
    if not is_learned(learner):
        raise HeadcutError(f"{config.method} is not a learned-gate method")
    if not isinstance(calibration, Calibration):
        raise HeadcutError(f"{config.method} trains on a Calibration (training data with labels)")
    if eval_calibration is not None and eval_calibration.task != calibration.task:
        raise HeadcutError(f"the eval data is for {eval_calibration.task}, the training data for {calibration.task}")
    # copies: the run resolves the method's defaults (gate_lr, mode) without touching the caller's objects
    options = replace(config.training) if config.training is not None else LearnedOptions()
    config = replace(config, training=options)
    start = time.perf_counter()
    before = metric_of(model, eval_calibration) if eval_calibration is not None else None
    blocks = model_blocks(model)
    result, run = train_gates(
        model, learner, sets, blocks, budget, calibration, config, options, eval_calibration=eval_calibration,
        checkpoint_dir=checkpoint_dir, resume=resume, progress=progress, on_step=on_step, dist=dist,
        identity=identity,
    )
    plan_cuts(result.mask, blocks, config.gqa)
    result.training = run
    result.scorings = 0
    result.seconds = time.perf_counter() - start
    if eval_calibration is not None:
        result.metric, result.higher_is_better = PRIMARY[eval_calibration.task]
        result.metric_before = before
        result.metric_after = metric_of(model, eval_calibration, result.mask)
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
    "LEARNED", "METHODS", "Budget", "GateLearner", "GateRun", "LearnedOptions", "is_learned", "method_names",
    "plan_learned", "BlockSet", "Method", "Metric", "PruneConfig", "PruneProgress", "PruneResult",
    "TrajectoryPoint", "block_sets", "check_budget", "eval_metric", "get_method", "keep_from_sparsity",
    "needs_data", "plan_prune", "prune", "within_drop",
]
