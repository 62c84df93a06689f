"""Head pruning: decide which heads to remove (:func:`plan_prune`) and remove them (:func:`prune`).

```python
from headcut.config import PruneConfig
from headcut.pruning import plan_prune, prune

result = plan_prune(model, calibration, PruneConfig(method="greedy-gnorm", keep=48))
result.mask                      # HeadMask in the model's current numbering; the model is unchanged
result = prune(model, train, PruneConfig(method="pass", keep=16), {"max_steps": 500})   # + headcut.slim
```

Every method implements one interface (:mod:`.method`) and is found by name in the registry
(:data:`headcut.catalog.METHODS`); one module each: :mod:`.oneshot`, :mod:`.michel`,
:mod:`.greedy_gnorm` (score-based, :mod:`.ranked`), :mod:`.pass_gates` (``pass``), :mod:`.passconc`,
:mod:`.dsp`, :mod:`.ste`, :mod:`.voita`, :mod:`.lag` (learned gates, :mod:`.gate_training`). Units
and budgets: :mod:`.units`; the removal loop, steps and the ``--max-drop`` rule: :mod:`.search`; a cut in rounds
(``via``): :mod:`.schedule`.
The command-level job (loading, data, report, saving) is :func:`headcut.api.prune`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from ..catalog import METHODS, method_entry
from ..config import PruneConfig
from ..errors import HeadcutError
from ..model.kv_cache import cache_account, check_context
from ..model.masks import plan_cuts
from ..model.surgery import model_blocks, slim
from ..training.distributed import Dist
from .base import CalibrationLike, Metric, PruneProgress, PruneResult, TrajectoryPoint, eval_metric, within_drop
from .method import Method, Problem, StepLog, get_method, make_options
from .search import Budget, keep_from_sparsity, resolve_budget, run_search
from .units import BlockSet, block_sets


def method_names() -> list[str]:
    """Every available method, in the order ``headcut prune --help`` lists them."""
    return list(METHODS)


def needs_data(name: str) -> bool:
    """Whether method ``name`` reads data (calibration data, or labelled training data)."""
    return method_entry(name).data != "none"


def check_budget(
    model: nn.Module, config: PruneConfig, options: Any = None, *, checked: bool = False
) -> tuple[list[BlockSet], Budget, Method, Any]:
    """Validate ``config`` and the method's ``options`` against ``model`` without reading data:
    every refusal of :func:`plan_prune` that comes before scoring or training. Returns the prune
    units, the resolved budget, the method and its validated options. ``checked``: ``config`` is validated and
    ``options`` are the method's Options, made and checked by the method (a prune request's,
    :func:`headcut.jobs.prune.request.prune_request`): only what ``model`` decides is checked here."""
    if not checked:
        config.validate()
    method = get_method(config.method)
    if not checked:
        options = make_options(method, options)
        method.check(config, options)
    sets = block_sets(model_blocks(model), config.gqa)
    total = sum(s.heads * s.width for s in sets)
    step, stepwise = method.step(total, config, options)
    # a method that decides the count itself takes --keep/--sparsity as an upper bound (its own check)
    bound_only = method.entry.budget == "optional"
    account = None
    if config.target_speedup is not None and config.kv_budget is None:
        # checked as a budget in bytes; the job finds the fraction by timing (headcut.jobs.prune.speed_target)
        config = replace(config, kv_budget=1.0)
    if config.kv_budget is not None:
        check_context(model, config.context)
        account = cache_account(model, config.context)
    budget = resolve_budget(
        sets, replace(config, keep=None, sparsity=None) if bound_only else config, step, stepwise, account
    )
    method.check_units(sets, budget, config, options)
    return sets, budget, method, options


def plan_prune(
    model: nn.Module,
    data: CalibrationLike,
    config: PruneConfig,
    options: Any = None,
    *,
    eval_calibration: Any = None,
    metric: Metric | None = None,
    progress: PruneProgress | None = None,
    on_step: StepLog | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    dist: Dist | None = None,
    identity: dict[str, Any] | None = None,
    device: Any = None,
    checked: bool = False,
    protected: Mapping[str, float] | None = None,
) -> PruneResult:
    """Decide which heads to keep with ``config.method``; the heads are not removed (see :func:`prune`).

    ``data``: the scoring data (a Calibration or batches; None for the data-free methods) or, for a
    learned-gate method, labelled training data (a Calibration; in ``joint`` mode the model's weights
    are trained in place). ``options``: the method's options (a dict of its fields or its Options
    dataclass; see each method's module). ``eval_calibration``: data for the metric of
    ``--max-drop``/``trajectory`` and the metric before/after (:func:`eval_metric`); ``metric``
    replaces it with any :class:`Metric`. ``progress(phase, done, total)`` (phases ``prune``, ``score``,
    ``eval``, ``train``), ``on_step`` (training steps), ``checkpoint_dir``/``resume``/``dist``/
    ``identity``/``device`` (training runs), ``protected`` (score-based methods): see
    :class:`headcut.pruning.method.Problem`. Refusals
    (HeadcutError) come before any scoring or training; ``checked``: see :func:`check_budget`."""
    if config.target_speedup is not None:
        raise HeadcutError(
            "target_speedup is found by timing cuts (headcut.prune, headcut.jobs.prune.speed_target): plan_prune takes "
            "the kv_budget it chose"
        )
    sets, budget, method, options = check_budget(model, config, options, checked=checked)
    if metric is None and eval_calibration is not None:
        metric = eval_metric(model, eval_calibration, progress)
    if metric is None and config.max_drop is not None:
        raise HeadcutError("--max-drop needs evaluation data (--eval-data)")
    if metric is None and config.trajectory:
        raise HeadcutError("a trajectory needs evaluation data (--eval-data)")
    blocks = model_blocks(model)
    problem = Problem(
        model=model,
        config=config,
        blocks=blocks,
        sets=sets,
        budget=budget,
        data=data,
        eval_data=eval_calibration,
        metric=metric,
        progress=progress,
        on_step=on_step,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        dist=dist,
        identity=identity,
        device=device,
        protected=dict(protected or {}),
    )
    result = method.run(problem, options)
    result.options = options
    plan_cuts(result.mask, blocks, config.gqa)  # realisable, by construction
    return result


def prune(
    model: nn.Module, data: CalibrationLike, config: PruneConfig, options: Any = None, **kwargs: Any
) -> PruneResult:
    """:func:`plan_prune`, then remove the heads (:func:`headcut.slim`); ``result.slim`` says what changed."""
    result = plan_prune(model, data, config, options, **kwargs)
    result.slim = slim(model, result.mask, gqa=config.gqa)
    return result


__all__ = [
    "Budget",
    "Metric",
    "Method",
    "PruneConfig",
    "PruneResult",
    "Problem",
    "TrajectoryPoint",
    "check_budget",
    "eval_metric",
    "get_method",
    "keep_from_sparsity",
    "make_options",
    "method_names",
    "needs_data",
    "plan_prune",
    "prune",
    "run_search",
    "within_drop",
]
