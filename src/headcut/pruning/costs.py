"""A budget in KV-cache bytes, and the heads it removes placed by what they cost (``--kv-budget F``,
``--context N``, ``--allocation``).

**The budget.** The cache of one sequence of N tokens (:mod:`headcut.model.kv_cache`: each layer counted as its
kind holds it: sliding windows capped, a layer that reads another's keys and values holding none, a layer whose
keys and values others read holding them whatever its heads, a linear-attention layer its states) may keep at
most ``floor(F x its bytes now)``. A move of the search (:mod:`.units`) saves the bytes its blocks hold less
after it; a move that saves nothing (a query head of a group that keeps others; a layer whose cache stays) is never
taken for this budget. The budget is refused before any scoring where even removing every unit that saves bytes
(down to ``--min-heads-per-block``) cannot meet it. With ``--uniform`` it becomes the most heads per block whose
cache fits (whole KV groups or single heads only: their bytes do not depend on which ones go).

**Count allocation** (``count``): the method's order, lowest score first, as a budget in heads would remove the
units, until the bytes fit: the plain allocation, which counts every head alike.

**Cost allocation** (``cost``, the default): remove units saving at least ``B_now - B_target`` bytes at the least
total score, a covering knapsack, as Puzzle and ModelOpt allocate per layer under a memory budget. The
scores are the method's (the total importance of a unit's heads); the candidates are

1. *ratio*: the greedy knapsack rule, the unit of least score per byte saved first, until the bytes fit (a global
   layer's KV head at 32k tokens saves 64 times a 512-token sliding layer's, so it must be 64 times less
   important to go first), then *fill-back*: the removed units put back, the most important first, wherever the
   bytes still fit;
2. *count*: the count allocation's units, then the same fill-back;
3. *knapsack*: the exact minimum of the summed scores, by dynamic programming over the bytes saved in steps of the
   savings' greatest common divisor (where that makes at most 20,000 steps; else in 2,000 steps of the bytes to
   save, each unit's saving rounded down and the bytes to save rounded up, so that every solution fits),
   where each unit saves the same bytes whatever else goes (whole KV groups or single heads) and no
   ``--min-heads-per-block`` bounds a layer.

The summed scores are a proxy; the *refinement* measures what matters: each distinct candidate's calibration loss
(the method's calibration data, the heads gated off) and keeps the lowest. Without data to measure (layer-wise
pruning, where the weights are never all in memory) the ratio candidate is kept. A method that scores again before
every step removes ``--step`` heads at a time in the ratio order and allocates as above on its last step.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from torch import nn

from ..config import PruneConfig
from ..data import Calibration
from ..errors import HeadcutError, label
from ..model.kv_cache import CacheAccount
from ..model.masks import HeadMask, block_cut
from .base import PruneProgress, eval_metric
from .units import BlockSet, Move, UnitState, set_moves, uniform_levels

#: the knapsack's bytes axis: in steps of the savings' greatest common divisor where the bytes to save are at most
#: this many of them (exact), else in this many steps (each saving rounded down: every solution fits)
EXACT_STEPS = 20000
KNAPSACK_STEPS = 2000

#: ``judge(mask)``: the calibration loss of the model with only ``mask``'s heads (lower is better)
Judge = Callable[[HeadMask], float]


def loss_judge(model: nn.Module, calibration: Calibration, progress: PruneProgress | None = None) -> Judge:
    """The refinement's measure: the calibration data's primary metric with only a mask's heads (gated), oriented
    so that lower is better."""
    metric = eval_metric(model, calibration, progress)
    sign = -1.0 if metric.higher_is_better else 1.0
    return lambda mask: sign * metric.measure(mask)


@dataclass
class ByteBudget:
    """The bytes the cache may keep: ``target`` (at most) of ``before`` now, ``fraction`` asked for, at
    ``account.context`` tokens; ``least``: the fewest bytes the units can reach; ``allocation``: ``cost`` or
    ``count``; ``by_heads``: ``--uniform`` turned it into a number of heads per block (``level``)."""

    account: CacheAccount
    gqa: str
    fraction: float
    allocation: str
    before: int
    target: int
    least: int
    by_heads: bool = False
    level: int | None = None
    memo: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict, repr=False)

    def set_bytes(self, s: BlockSet, i: int, kept: tuple[int, ...]) -> int:
        """Bytes set ``s`` (number ``i``) holds with heads ``kept`` in each of its blocks."""
        key = (i, kept)
        if key not in self.memo:
            total = 0
            for b in s.blocks:
                cut = block_cut(b, list(kept), self.gqa)
                if cut is None:
                    raise HeadcutError(f"internal: heads {list(kept)} of {b.name} are not a cut of --gqa {self.gqa}")
                total += self.account.block_values(b.name, len(cut.q), len(cut.kv))
            self.memo[key] = total * self.account.element_bytes
        return self.memo[key]

    def state_bytes(self, state: UnitState) -> int:
        return sum(self.set_bytes(s, i, k) for i, (s, k) in enumerate(zip(state.sets, state.kept)))

    def saving(self, state: UnitState, move: Move) -> int:
        """Bytes ``move`` saves from ``state``."""
        kept = state.kept[move.index]
        gone = set(move.heads)
        after = tuple(h for h in kept if h not in gone)
        s = state.sets[move.index]
        return self.set_bytes(s, move.index, kept) - self.set_bytes(s, move.index, after)

    def fits(self, state: UnitState) -> bool:
        return self.state_bytes(state) <= self.target


def weight(state: UnitState, move: Move) -> float:
    """A unit's total importance: its heads' mean times the heads it removes from the model."""
    return move.score * len(move.heads) * state.sets[move.index].width


def saving_moves(state: UnitState, importance: dict[str, list[float]], budget: ByteBudget, floor: int) -> list[Move]:
    """Every move from ``state`` that saves bytes and keeps its blocks at ``floor`` heads or more."""
    out = []
    for i in range(len(state.sets)):
        for move in set_moves(state, i, importance):
            if state.count(i) - len(move.heads) < min(floor, state.count(i)):
                continue
            if budget.saving(state, move) > 0:
                out.append(move)
    return out


def least_bytes(sets: list[BlockSet], budget: ByteBudget, floor: int) -> int:
    """The fewest bytes the units can reach (every unit that saves removed, no block below ``floor``)."""
    state = UnitState.full(sets)
    flat = {b.name: [0.0] * b.heads for s in sets for b in s.blocks}
    while True:
        moves = saving_moves(state, flat, budget, floor)
        if not moves:
            return budget.state_bytes(state)
        state.apply(moves[0])


def resolve_bytes(sets: list[BlockSet], config: PruneConfig, account: CacheAccount) -> ByteBudget:
    """The byte budget of ``config`` (its ``kv_budget``) on the model whose cache ``account`` counts; refused
    where the units cannot meet it (naming the least fraction they can)."""
    assert config.kv_budget is not None
    state = UnitState.full(sets)
    budget = ByteBudget(account, config.gqa, config.kv_budget, config.allocation, 0, 0, 0)
    before = budget.state_bytes(state)
    share = Fraction(repr(float(config.kv_budget)))
    budget.before = before
    budget.target = math.floor(share * before)
    budget.least = least_bytes(sets, budget, config.min_heads_per_block)
    what = f"{label('kv_budget')} {config.kv_budget:g} at {account.context:,} tokens"
    if budget.least > budget.target:
        floor = (
            f" above {label('min_heads_per_block')} {config.min_heads_per_block}" if config.min_heads_per_block else ""
        )
        raise HeadcutError(
            f"{what} cannot be met: removing every head whose removal shrinks the cache{floor} leaves "
            f"{budget.least / before:.4g} of its {before:,} bytes (--gqa {config.gqa}; a layer whose keys and values "
            "other layers read keeps them)"
        )
    if config.uniform:
        _uniform(sets, budget, config, what)
    return budget


def _uniform(sets: list[BlockSet], budget: ByteBudget, config: PruneConfig, what: str) -> None:
    """``--uniform``: the most heads per block whose cache fits (sets whose bytes do not depend on which units
    go: whole KV groups or single heads)."""
    if any(s.mode == "uniform" for s in sets):
        raise HeadcutError(
            f"{what} with {label('uniform')}: under --gqa uniform a block's cache depends on how its heads are "
            "spread over its KV groups; use --gqa group, or no --uniform"
        )
    state = UnitState.full(sets)
    for level in sorted(uniform_levels(state, config.min_heads_per_block), reverse=True):
        trial = UnitState(sets, [tuple(range(level)) for _ in sets])
        if budget.fits(trial):
            budget.by_heads, budget.level = True, level
            return
    raise HeadcutError(f"{what} cannot be met with the same number of heads in every block ({label('uniform')})")


# ---- the allocations ---------------------------------------------------------------------------------------


def _greedy(
    state: UnitState,
    importance: dict[str, list[float]],
    budget: ByteBudget,
    floor: int,
    key: Callable[[UnitState, Move], tuple],
    most: int | None = None,
) -> list[Move]:
    """Remove units from ``state`` (in place) in ``key`` order until the bytes fit, or (``most``) until that many
    heads went; the moves taken."""
    taken: list[Move] = []
    removed = 0
    while not budget.fits(state) and (most is None or removed < most):
        moves = saving_moves(state, importance, budget, floor)
        if not moves:
            break
        chosen = min(moves, key=lambda m: key(state, m))
        state.apply(chosen)
        taken.append(chosen)
        removed += len(chosen.heads) * state.sets[chosen.index].width
    return taken


def by_ratio(budget: ByteBudget) -> Callable[[UnitState, Move], tuple]:
    """The ratio rule's order: score per byte saved, then score, then position."""
    return lambda state, m: (weight(state, m) / budget.saving(state, m), m.score, m.index, m.heads)


def by_score(state: UnitState, m: Move) -> tuple:
    """The count order: the method's own (score, then position)."""
    return (m.score, m.index, m.heads)


def _realisable(state: UnitState, i: int, gqa: str) -> bool:
    return all(block_cut(b, list(state.kept[i]), gqa) is not None for b in state.sets[i].blocks)


def fill_back(state: UnitState, taken: list[Move], budget: ByteBudget) -> None:
    """Put removed units back (in place), the most important first, wherever the bytes still fit and the block
    stays a valid cut."""
    for move in sorted(taken, key=lambda m: (-m.score, m.index, m.heads)):
        trial = state.copy()
        trial.kept[move.index] = tuple(sorted(set(trial.kept[move.index]) | set(move.heads)))
        if _realisable(trial, move.index, budget.gqa) and budget.fits(trial):
            state.kept = trial.kept


def knapsack(state: UnitState, importance: dict[str, list[float]], budget: ByteBudget, floor: int) -> UnitState | None:
    """The exact minimum of the summed scores of the units removed from ``state`` so that the bytes fit (see the
    module's doc); None where the units' savings depend on each other or on a floor."""
    if floor or any(s.mode == "uniform" for s in state.sets):
        return None
    units = saving_moves(state, importance, budget, 0)
    need = budget.state_bytes(state) - budget.target
    if not units or need <= 0:
        return None
    savings = [budget.saving(state, move) for move in units]
    exact = math.gcd(*savings)  # every saving a whole number of these: the knapsack is exact in steps of it
    step = float(exact) if need / exact <= EXACT_STEPS else need / KNAPSACK_STEPS
    goal = math.ceil(need / step)
    best = [0.0] + [math.inf] * goal  # best[b]: the least summed score of units saving b steps (goal: or more)
    came: list[array] = []  # came[j][t]: the b unit j was added to, to reach t (-1: not added)
    for move, saving in zip(units, savings):
        w, size = weight(state, move), int(saving // step)
        new = best[:]
        back = array("i", [-1]) * (goal + 1)
        for b in range(goal + 1):
            if best[b] == math.inf:
                continue
            t = min(goal, b + size)
            if best[b] + w < new[t]:
                new[t], back[t] = best[b] + w, b
        came.append(back)
        best = new
    if best[goal] == math.inf:
        return None
    out = state.copy()
    t = goal
    for move, back in zip(reversed(units), reversed(came)):
        if back[t] >= 0:
            out.apply(move)
            t = back[t]
    return out if budget.fits(out) else None


@dataclass
class Candidate:
    """One allocation considered: its ``name``, the state it leaves, its bytes and its calibration loss."""

    name: str
    state: UnitState
    bytes: int
    loss: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "heads": self.state.total(), "bytes": self.bytes, "loss": self.loss}


def allocate(
    state: UnitState,
    importance: dict[str, list[float]],
    budget: ByteBudget,
    floor: int,
    judge: Judge | None,
    mask_of: Callable[[UnitState], HeadMask],
) -> tuple[UnitState, list[Candidate], str]:
    """The state the budget's allocation leaves from ``state``, the candidates considered and the one chosen."""
    if budget.allocation == "count":
        count = state.copy()
        _greedy(count, importance, budget, floor, by_score)
        return count, [Candidate("count", count, budget.state_bytes(count))], "count"
    candidates: list[Candidate] = []
    ratio = state.copy()
    fill_back(ratio, _greedy(ratio, importance, budget, floor, by_ratio(budget)), budget)
    candidates.append(Candidate("ratio", ratio, budget.state_bytes(ratio)))
    count = state.copy()
    fill_back(count, _greedy(count, importance, budget, floor, by_score), budget)
    candidates.append(Candidate("count", count, budget.state_bytes(count)))
    exact = knapsack(state, importance, budget, floor)
    if exact is not None:
        candidates.append(Candidate("knapsack", exact, budget.state_bytes(exact)))
    distinct: dict[tuple, Candidate] = {}
    for c in candidates:
        distinct.setdefault(tuple(c.state.kept), c)
    chosen = candidates[0]
    if judge is not None and len(distinct) > 1:
        for c in distinct.values():
            c.loss = judge(mask_of(c.state))
        for c in candidates:  # a duplicate gets its twin's loss
            c.loss = distinct[tuple(c.state.kept)].loss
        chosen = min(distinct.values(), key=lambda c: math.inf if c.loss is None or math.isnan(c.loss) else c.loss)
    return chosen.state, candidates, chosen.name


def byte_step(
    state: UnitState,
    importance: dict[str, list[float]],
    budget: ByteBudget,
    floor: int,
    step: int,
    judge: Judge | None,
    mask_of: Callable[[UnitState], HeadMask],
) -> tuple[list[Candidate], str | None]:
    """One step of a byte budget on ``state`` (in place): up to ``step`` heads in the ratio order, or, where they
    would make the bytes fit, the allocation (see the module's doc). Returns the allocation's candidates and
    choice (none for a plain step)."""
    trial = state.copy()
    _greedy(trial, importance, budget, floor, by_ratio(budget), most=step)
    if not budget.fits(trial):
        state.kept = trial.kept
        return [], None
    final, candidates, chosen = allocate(state, importance, budget, floor, judge, mask_of)
    state.kept = final.kept
    return candidates, chosen


@dataclass
class KvRecord:
    """What a byte budget asked for and reached (the report's ``kv_budget``): the bytes of one sequence at
    ``context`` tokens before, allowed and after, the allocation's candidates and choice, and per cached block its
    cache kind, window, heads and KV heads before and after, and bytes before and after."""

    context: int
    fraction: float
    allocation: str
    element_bytes: int
    before: int
    target: int
    after: int
    least: int
    heads_before: int
    heads_after: int
    uniform_level: int | None = None
    candidates: list[Candidate] = field(default_factory=list)
    chosen: str | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        """Whether every candidate made the same cut (nothing to choose)."""
        return len({tuple(c.state.kept) for c in self.candidates}) <= 1

    @property
    def reached(self) -> float:
        return self.after / self.before if self.before else 1.0

    def restate(self, account: CacheAccount, kept: dict[str, tuple[int, int]], allocation: str) -> None:
        """The record of another cut of the same budget (``kept[block] = (query heads, KV heads)``, made by
        ``allocation``): bytes and heads after, per block and in all; the placements it replaced left out."""
        self.allocation, self.candidates, self.chosen = allocation, [], None
        self.after = account.bytes(kept)
        self.heads_after = sum(h for h, _ in kept.values())
        for row in self.blocks:
            heads, kv = kept[row["block"]]
            row["heads"][1], row["kv_heads"][1] = heads, kv
            row["bytes"][1] = account.block_values(row["block"], heads, kv) * account.element_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "fraction": self.fraction,
            "reached": self.reached,
            "allocation": self.allocation,
            "element_bytes": self.element_bytes,
            "bytes_before": self.before,
            "bytes_target": self.target,
            "bytes_after": self.after,
            "bytes_least": self.least,
            "heads_before": self.heads_before,
            "heads_after": self.heads_after,
            "uniform_level": self.uniform_level,
            "candidates": [c.to_json() for c in self.candidates],
            "chosen": self.chosen,
            "candidates_agree": self.agree,
            "blocks": self.blocks,
        }


def kv_record(budget: ByteBudget, start: UnitState, end: UnitState) -> KvRecord:
    """The record of ``budget`` from ``start`` (the full model) to ``end``."""
    account = budget.account
    rows = []
    by_name = {b.name: (i, b) for i, s in enumerate(start.sets) for b in s.blocks}
    for name, cost in account.costs.items():
        i, block = by_name[name]
        before = block_cut(block, list(start.kept[i]), budget.gqa)
        after = block_cut(block, list(end.kept[i]), budget.gqa)
        assert before is not None and after is not None
        rows.append(
            {
                "block": name,
                "layer": block.layer,
                "kind": cost.kind,
                "window": cost.window,
                "heads": [len(before.q), len(after.q)],
                "kv_heads": [len(before.kv), len(after.kv)],
                "bytes": [
                    account.block_values(name, len(before.q), len(before.kv)) * account.element_bytes,
                    account.block_values(name, len(after.q), len(after.kv)) * account.element_bytes,
                ],
            }
        )
    return KvRecord(
        context=account.context,
        fraction=budget.fraction,
        allocation=budget.allocation,
        element_bytes=account.element_bytes,
        before=budget.before,
        target=budget.target,
        after=budget.state_bytes(end),
        least=budget.least,
        heads_before=start.total(),
        heads_after=end.total(),
        uniform_level=budget.level,
        blocks=rows,
    )
