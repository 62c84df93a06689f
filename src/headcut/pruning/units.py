"""Prune units: which heads are removed together, derived from the blocks (never from a model family).

* **Block sets.** Blocks that share weights (``Block.shared``: ALBERT's layers) form one set; a
  removal takes the same head index from every block of the set, so the sharing survives. Greedy-Gnorm
  (arXiv:2602.04491 sec. 4.1) prunes ALBERT this way: "one mask position simultaneously affects 12 heads".
  Every other block is a set of its own.
* **Granularity in a set** (``mode``), from the block's KV groups and the ``--gqa`` policy of
  :mod:`headcut.model.masks`:

  - ``head``: any single head (no grouped-query attention, or ``--gqa duplicate``);
  - ``group``: a whole KV group (``--gqa group`` and ``auto``);
  - ``uniform``: a whole KV group, or one head from *every* remaining group, so that all remaining
    groups keep the same number of query heads (``--gqa uniform``; exact, see ``masks._cut``).

A *move* removes one unit (a set of head indices, from every block of its set). Its score is the mean
importance of the heads it removes, over the set's blocks; for a whole KV group of one block that is
the mean importance of the group's query heads (the ``kv_groups`` of :class:`HeadScores`).

Budgets are exact: :func:`reachable_totals` is the set of head totals the remaining moves can still
reach (a bounded subset sum over the sets, as a Python-int bitset), so a search can refuse a move
that would make the budget unreachable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..adapters import Block
from ..errors import HeadcutError
from ..model.masks import GQA_POLICIES, HeadMask


@dataclass(frozen=True)
class BlockSet:
    """Blocks pruned together (the same head indices in each), with their granularity ``mode``
    (``head``, ``group`` or ``uniform``, see the module's doc)."""

    blocks: tuple[Block, ...]
    mode: str
    heads: int
    group_size: int

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.blocks]

    @property
    def width(self) -> int:
        """Heads one removed head index takes from the model (one per block of the set)."""
        return len(self.blocks)

    def group(self, head: int) -> int:
        return head // self.group_size


def block_sets(blocks: list[Block], gqa: str = "auto") -> list[BlockSet]:
    """The block sets of a model (in the order of its first block), for a ``--gqa`` policy."""
    if gqa not in GQA_POLICIES:
        raise HeadcutError(f"unknown --gqa policy {gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
    grouped: dict[str, list[Block]] = {}
    for block in blocks:
        key = f"shared:{block.kind}:{block.shared}" if block.shared is not None else f"block:{block.name}"
        grouped.setdefault(key, []).append(block)
    sets = []
    for members in grouped.values():
        first = members[0]
        if any((b.heads, b.kv_heads, b.head_dim) != (first.heads, first.kv_heads, first.head_dim) for b in members):
            raise HeadcutError(f"blocks {', '.join(b.name for b in members)} share weights but differ in shape")
        g = first.group_size
        if g <= 1 or gqa == "duplicate" or first.heads == 0:
            mode, g = "head", 1
        elif gqa == "uniform":
            mode = "uniform"
        else:  # group and auto: whole KV groups
            mode = "group"
        sets.append(BlockSet(tuple(members), mode, first.heads, g))
    return sets


@dataclass(frozen=True)
class Move:
    """Remove ``heads`` (indices in the set's blocks) from every block of set ``index``."""

    index: int
    heads: tuple[int, ...]
    score: float
    kind: str = "unit"  # "unit" (a head or a whole group) or "thin" (a head of every group)


@dataclass
class UnitState:
    """Kept heads of every block set (the same indices in each block of a set)."""

    sets: list[BlockSet]
    kept: list[tuple[int, ...]] = field(default_factory=list)

    @classmethod
    def full(cls, sets: list[BlockSet]) -> UnitState:
        return cls(sets, [tuple(range(s.heads)) for s in sets])

    def copy(self) -> UnitState:
        return UnitState(self.sets, list(self.kept))

    def count(self, i: int) -> int:
        return len(self.kept[i])

    def total(self) -> int:
        return sum(len(k) * s.width for s, k in zip(self.sets, self.kept))

    def per_block(self) -> dict[str, int]:
        return {b.name: len(k) for s, k in zip(self.sets, self.kept) for b in s.blocks}

    def mask(self, order: Iterable[Block]) -> HeadMask:
        """The mask of this state, blocks in ``order`` (the model's)."""
        by_name = {b.name: list(k) for s, k in zip(self.sets, self.kept) for b in s.blocks}
        return HeadMask({b.name: by_name[b.name] for b in order})

    def apply(self, move: Move) -> None:
        gone = set(move.heads)
        self.kept[move.index] = tuple(h for h in self.kept[move.index] if h not in gone)

    def groups(self, i: int) -> dict[int, list[int]]:
        """Kept heads per KV group (groups with a kept head only)."""
        out: dict[int, list[int]] = {}
        for h in self.kept[i]:
            out.setdefault(self.sets[i].group(h), []).append(h)
        return out


def head_scores(s: BlockSet, importance: dict[str, list[float]]) -> list[float]:
    """Per head index of a set: the mean importance over its blocks."""
    return [sum(importance[b.name][h] for b in s.blocks) / s.width for h in range(s.heads)]


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def set_moves(state: UnitState, i: int, importance: dict[str, list[float]]) -> list[Move]:
    """The moves of set ``i`` from ``state``; a move's score is the mean importance of its heads."""
    s = state.sets[i]
    kept = state.kept[i]
    if not kept:
        return []
    per_head = head_scores(s, importance)
    if s.mode == "head":
        return [Move(i, (h,), per_head[h]) for h in kept]
    groups = state.groups(i)
    moves = [Move(i, tuple(hs), _mean([per_head[h] for h in hs])) for hs in groups.values()]
    if s.mode == "uniform":
        m = len(next(iter(groups.values())))
        if len(groups) > 1 or m > 1:  # else thinning = removing the last group
            lowest = tuple(min(hs, key=lambda h: (per_head[h], h)) for hs in groups.values())
            moves.append(Move(i, lowest, _mean([per_head[h] for h in lowest]), kind="thin"))
    return moves


def counts_from(state: UnitState, i: int, floor: int) -> list[int]:
    """Per-block head counts set ``i`` can still reach (its current count included), never below
    ``floor`` (a block already below it keeps what it has)."""
    s = state.sets[i]
    n = state.count(i)
    if s.mode == "head":
        reach = set(range(n + 1))
    elif s.mode == "group":
        reach = {s.group_size * c for c in range(len(state.groups(i)) + 1)}
    else:  # uniform: c groups of m heads each (c, m no larger than now), or nothing
        groups = state.groups(i)
        m = len(next(iter(groups.values()))) if groups else 0
        reach = {c * k for c in range(1, len(groups) + 1) for k in range(1, m + 1)} | {0}
    return sorted({c for c in reach if c >= floor} | {n})


def reachable_totals(state: UnitState, floor: int) -> int:
    """Bitset (bit t set <=> a total of t heads is reachable) of the totals the model can reach
    from ``state``: a bounded subset sum over the sets."""
    bits = 1
    for i, s in enumerate(state.sets):
        step = 0
        for c in counts_from(state, i, floor):
            step |= bits << (c * s.width)
        bits = step
    return bits


def uniform_levels(state: UnitState, floor: int) -> list[int]:
    """Per-block counts every set can reach (``--uniform``: the same count in every block)."""
    common: set[int] | None = None
    for i in range(len(state.sets)):
        counts = set(counts_from(state, i, floor))
        common = counts if common is None else common & counts
    return sorted(common or set())


def bits_to_list(bits: int) -> list[int]:
    out = []
    t = 0
    while bits:
        if bits & 1:
            out.append(t)
        bits >>= 1
        t += 1
    return out


def nearest(valid: list[int], wanted: int) -> list[int]:
    """The valid values just below and just above ``wanted`` (one of them if the other is missing)."""
    below = [v for v in valid if v < wanted]
    above = [v for v in valid if v > wanted]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])
