"""Budgets and the removal loop shared by every method.

**Budget.** ``--keep K`` heads, or ``--sparsity s`` with K = floor((1 - s) * H) (the papers' rounding;
s is read as the decimal it is written as, so 0.9 of 10 heads keeps 1). K must be reachable in whole
units (:mod:`headcut.pruning.units`) without taking a block below ``--min-heads-per-block``, and with
``--uniform`` be the same per-block count in every block; otherwise it is refused, naming the nearest
valid budgets, before any scoring. ``--max-drop`` searches down to a floor: K when given, else the
fewest heads the units and ``--min-heads-per-block`` allow.

**Steps.** Before each step the method's ranker gives the importance of the heads (re-scored on the
masked model for the iterative methods); the step then removes the lowest-scoring units, in score
order, at most ``--step`` heads (with ``--rounds R``: the heads left to remove divided by the steps
left, rounded up, so R steps reach the target, the larger ones first) but at least one unit, never a
unit that would make the target unreachable (only units of different sizes can do that). With
``--uniform`` a step moves every block to the next per-block count instead (each block keeps its top
units; at most a step's heads away). One-shot methods without ``--max-drop`` or ``--trajectory`` go
to K in one step (the same mask: their ranking is fixed).

**Quality stop** (``--max-drop D``; Greedy-Gnorm's accuracy rule, arXiv:2602.04491 sec. 3.1.2): after each
step the metric is measured; the first step that takes it more than D from the input model's (in the
metric's own units; a lower-is-better metric may rise by at most D) ends the search, and the result is
the step before it.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, replace
from fractions import Fraction

from torch import nn

from ..adapters import Block
from ..config import PruneConfig
from ..errors import HeadcutError, label
from ..model.kv_cache import CacheAccount
from .base import Metric, PruneProgress, PruneResult, Ranker, TrajectoryPoint, within_drop
from .costs import ByteBudget, Judge, byte_step, kv_record, resolve_bytes
from .units import (
    BlockSet,
    Move,
    UnitState,
    bits_to_list,
    counts_from,
    nearest,
    reachable_totals,
    set_moves,
    uniform_levels,
)


def keep_from_sparsity(sparsity: float, total: int) -> int:
    """K = floor((1 - s) * H), with s taken as the decimal it is written as (no binary rounding)."""
    s = Fraction(repr(float(sparsity)))
    return math.floor((1 - s) * total)


@dataclass
class Budget:
    """The resolved budget: ``total`` heads now, the search's ``target`` (K, or the --max-drop floor),
    ``exact`` (K must be met: no --max-drop), heads per ``step`` (or, with ``rounds``, the number of
    steps to the target instead), ``levels`` (--uniform: the valid per-block counts, else None) and the
    per-block ``floor``."""

    total: int
    target: int
    exact: bool
    step: int
    floor: int
    levels: list[int] | None
    valid: list[int]
    rounds: int | None = None
    #: a budget in KV-cache bytes (``--kv-budget``; :mod:`.costs`): the search stops when they fit
    bytes: ByteBudget | None = None

    @property
    def by_bytes(self) -> bool:
        """Whether the search removes units until the bytes fit (not a number of heads)."""
        return self.bytes is not None and not self.bytes.by_heads

    def step_at(self, heads: int, steps_done: int) -> Budget:
        """This step's budget: with ``rounds``, the heads left to remove split over the steps left
        (rounded up: the larger steps first), else this budget."""
        if self.rounds is None:
            return self
        left = max(self.rounds - steps_done, 1)
        return replace(self, step=max(math.ceil((heads - self.target) / left), 1))


def _why(sets: list[BlockSet], config: PruneConfig, blocks: int) -> str:
    reasons = []
    widths = sorted({s.width for s in sets if s.width > 1})
    if widths:
        reasons.append(
            f"blocks that share weights lose a head in each of their {'/'.join(map(str, widths))} blocks at once"
        )
    if any(s.mode == "group" for s in sets):
        sizes = sorted({s.group_size for s in sets if s.mode == "group"})
        reasons.append(
            f"{label('gqa')} {config.gqa} removes whole KV groups of {'/'.join(map(str, sizes))} query heads"
        )
    if any(s.mode == "uniform" for s in sets):
        reasons.append(f"{label('gqa')} uniform keeps the same number of query heads in every remaining KV group")
    if config.min_heads_per_block:
        reasons.append(f"{label('min_heads_per_block')} {config.min_heads_per_block}")
    if config.uniform:
        reasons.append(f"{label('uniform')} keeps the same number of heads in each of the {blocks} blocks")
    return "; ".join(reasons) or "heads are removed one at a time"


def _fmt_valid(options: list[int], total: int, sparsity: bool) -> str:
    parts = []
    for k in options:
        parts.append(f"{k} ({label('sparsity')} {1 - k / total:.4g})" if sparsity and total else str(k))
    return " or ".join(parts)


def uniform_budgets(sets: list[BlockSet], floor: int = 0) -> list[int]:
    """Head totals a cut with the same number of heads in every block (``--uniform``) can keep."""
    n_blocks = sum(s.width for s in sets)
    return [k * n_blocks for k in uniform_levels(UnitState.full(sets), floor)]


def resolve_budget(
    sets: list[BlockSet], config: PruneConfig, step: int, stepwise: bool, account: CacheAccount | None = None
) -> Budget:
    """Check the budget against the units (HeadcutError naming the nearest valid budgets). ``step``:
    heads per step; ``stepwise``: whether the search goes step by step (else to K at once); ``account``: the
    model's cache, for a ``kv_budget``."""
    if config.kv_budget is not None:
        if account is None:
            raise HeadcutError(f"internal: {label('kv_budget')} without the model's cache account")
        in_bytes = resolve_bytes(sets, config, account)
        n_blocks = sum(s.width for s in sets)
        keep = in_bytes.level * n_blocks if in_bytes.level is not None else None
        budget = resolve_budget(sets, replace(config, kv_budget=None, context=None, keep=keep), step, stepwise)
        budget.bytes = in_bytes
        return budget
    state = UnitState.full(sets)
    total = state.total()
    n_blocks = sum(s.width for s in sets)
    floor = config.min_heads_per_block
    if config.uniform:
        levels = uniform_levels(state, floor)
        valid = [k * n_blocks for k in levels]
    else:
        levels = None
        valid = bits_to_list(reachable_totals(state, floor))
    wanted: int | None = None
    if config.keep is not None:
        wanted, what = config.keep, f"{label('keep')} {config.keep}"
    elif config.sparsity is not None:
        wanted = keep_from_sparsity(config.sparsity, total)
        kept_share = float(1 - Fraction(repr(float(config.sparsity))))
        what = f"{label('sparsity')} {config.sparsity:g} (keep floor({kept_share:g} x {total}) = {wanted} heads)"
    if wanted is not None:
        if wanted > total:
            raise HeadcutError(f"{what} is more than the model's {total} heads")
        if not valid:
            raise HeadcutError(f"{what} cannot be met: {_why(sets, config, n_blocks)} leave no valid budget")
        if wanted not in valid:
            if wanted < valid[0] and floor:
                raise HeadcutError(
                    f"{what} is below the {label('min_heads_per_block')} {floor} floor: at least {valid[0]} heads stay "
                    f"(nearest valid budget: {_fmt_valid([valid[0]], total, config.sparsity is not None)})"
                )
            near = _fmt_valid(nearest(valid, wanted), total, config.sparsity is not None)
            raise HeadcutError(
                f"{what} cannot be met exactly: {_why(sets, config, n_blocks)}; nearest valid budgets: {near}"
            )
        target = wanted
    else:
        target = valid[0] if valid else total
    exact = config.max_drop is None
    if not stepwise:
        step = max(total, 1)
    return Budget(total=total, target=target, exact=exact, step=step, floor=floor, levels=levels, valid=valid)


def _order(move: Move) -> tuple:
    return (move.score, move.index, move.heads)


def _names(state: UnitState, move: Move) -> list[str]:
    return [f"{b.name}:{h}" for b in state.sets[move.index].blocks for h in move.heads]


def _global_step(state: UnitState, importance: dict[str, list[float]], budget: Budget) -> list[Move]:
    """Remove the lowest-scoring units: at most ``step`` heads, at least one unit, target reachable."""
    stop = max(state.total() - budget.step, budget.target)
    ordered = sorted((m for i in range(len(state.sets)) for m in set_moves(state, i, importance)), key=_order)
    taken: list[Move] = []
    while state.total() > stop:
        chosen = None
        for move in ordered:
            trial = state.copy()
            trial.apply(move)
            if trial.count(move.index) < min(budget.floor, state.count(move.index)):
                continue  # below --min-heads-per-block
            if not (reachable_totals(trial, budget.floor) >> budget.target) & 1:
                continue  # the target could no longer be met exactly
            chosen = move
            break
        if chosen is None:
            break
        size = len(chosen.heads) * state.sets[chosen.index].width
        if taken and state.total() - size < stop:
            break  # the step is full: the next unit would overshoot it
        state.apply(chosen)
        taken.append(chosen)
        # the moves of the changed set, again (the others stand): merged in score order
        fresh = set_moves(state, chosen.index, importance)
        ordered = [m for m in ordered if m.index != chosen.index]
        for m in fresh:
            bisect.insort(ordered, m, key=_order)
    return taken


def _to_level(
    state: UnitState,
    importance: dict[str, list[float]],
    level: int,
    keep_reachable: list[int],
) -> list[Move] | None:
    """Move every set down to ``level`` heads per block, each set keeping its top units (applied to
    ``state``); None (``state`` partly changed) if some set cannot get there."""
    taken: list[Move] = []
    for i in range(len(state.sets)):
        while state.count(i) > level:
            chosen = None
            for move in sorted(set_moves(state, i, importance), key=_order):
                trial = state.copy()
                trial.apply(move)
                counts = counts_from(trial, i, 0)
                if all(c in counts for c in keep_reachable):
                    chosen = move
                    break
            if chosen is None:
                return None
            state.apply(chosen)
            taken.append(chosen)
    return taken


def _uniform_step(state: UnitState, importance: dict[str, list[float]], budget: Budget) -> list[Move]:
    """``--uniform``: the next per-block count (at most ``step`` heads away, at least one level)."""
    n_blocks = sum(s.width for s in state.sets)
    total = state.total()
    target_level = budget.target // n_blocks if n_blocks else 0
    levels = [k for k in (budget.levels or []) if target_level <= k and k * n_blocks < total]
    near = [k for k in levels if k * n_blocks >= total - budget.step]
    candidates = sorted(near) + sorted((k for k in levels if k not in near), reverse=True)
    for level in candidates:
        trial = state.copy()
        taken = _to_level(trial, importance, level, sorted({level, target_level}))
        if taken is not None:
            state.kept = trial.kept
            return taken
    return []


def remove_step(state: UnitState, importance: dict[str, list[float]], budget: Budget, uniform: bool) -> list[str]:
    """One step of the removal loop on ``state`` (in place): the lowest-scoring units, or with
    ``uniform`` the next per-block count (see the module's doc). Returns the heads removed
    (``block:head``); none when nothing may go."""
    taken = (_uniform_step if uniform else _global_step)(state, importance, budget)
    return [n for move in taken for n in _names(state, move)]


def run_search(
    model: nn.Module,
    blocks: list[Block],
    sets: list[BlockSet],
    budget: Budget,
    ranker: Ranker,
    config: PruneConfig,
    metric: Metric | None,
    progress: PruneProgress | None = None,
    judge: Judge | None = None,
) -> PruneResult:
    """The removal loop (see the module's doc). The model is only gated, never changed. ``judge``: a byte
    budget's refinement measure (:mod:`.costs`)."""
    start = time.perf_counter()
    state = UnitState.full(sets)
    first = state.copy()
    heads_before = state.per_block()
    most: int | None = budget.total - budget.target
    in_bytes = budget.bytes if budget.by_bytes else None
    if in_bytes is not None:
        most = None  # the heads a byte budget removes are known at its end
    candidates: list = []
    chosen: str | None = None
    if progress is not None:
        progress("prune", 0, most)
    before = metric.measure(state.mask(blocks)) if metric is not None else None
    evaluate_steps = metric is not None and (config.max_drop is not None or config.trajectory)
    points = [TrajectoryPoint(step=0, heads=budget.total, metric=before)]
    best = state.copy()
    best_metric = before
    stopped = "budget" if budget.exact else "floor"
    while (not in_bytes.fits(state)) if in_bytes is not None else state.total() > budget.target:
        importance = ranker.importance(model, state.mask(blocks), progress)
        rescored = ranker.rescoring or len(points) == 1
        if in_bytes is not None:
            kept_before = state.copy()
            found, pick = byte_step(
                state, importance, in_bytes, budget.floor, budget.step, judge, lambda st: st.mask(blocks)
            )
            if found:
                candidates, chosen = found, pick
            removed = [
                f"{b.name}:{h}"
                for i, s in enumerate(state.sets)
                for b in s.blocks
                for h in kept_before.kept[i]
                if h not in state.kept[i]
            ]
        else:
            removed = remove_step(state, importance, budget.step_at(state.total(), len(points) - 1), config.uniform)
        if not removed:
            break  # nothing left that may go (units, floors)
        value = metric.measure(state.mask(blocks)) if evaluate_steps and metric is not None else None
        within = None
        if config.max_drop is not None and metric is not None and before is not None and value is not None:
            within = within_drop(before, value, config.max_drop, metric.higher_is_better)
        points.append(
            TrajectoryPoint(
                step=len(points),
                heads=state.total(),
                metric=value,
                removed=removed,
                rescored=rescored,
                within=within,
            )
        )
        if progress is not None:
            progress("prune", budget.total - state.total(), most)
        if within is False:
            stopped = "max-drop"
            state = best
            break
        best = state.copy()
        best_metric = value
    if metric is not None and stopped != "max-drop" and not evaluate_steps:
        best_metric = metric.measure(state.mask(blocks))
    mask = state.mask(blocks)
    record = None
    if budget.bytes is not None:
        record = kv_record(budget.bytes, first, state)
        record.candidates, record.chosen = candidates, chosen
    return PruneResult(
        method=config.method,
        mask=mask,
        heads_before=heads_before,
        heads_after=state.per_block(),
        trajectory=points,
        stopped=stopped,
        scorings=ranker.scorings,
        seconds=time.perf_counter() - start,
        config=config,
        metric=metric.name if metric is not None else None,
        higher_is_better=metric.higher_is_better if metric is not None else None,
        metric_before=before,
        metric_after=best_metric,
        target=state.total() if in_bytes is not None else budget.target,
        kv=record,
    )
