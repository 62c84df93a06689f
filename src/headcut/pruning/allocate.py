"""One allocation over every action (issue 70, point 4): for each block, keep it whole, merge its KV heads into
fewer (every query head kept), or remove some of its KV groups, chosen under one budget in KV-cache bytes by the
calibration loss each action was measured to cost, and the combined cut measured.

**Actions.** For a block of ``G`` KV groups: remove its ``g`` least important groups (``g = 1 .. G``; past
:data:`FINE_GROUPS` groups only the counts that leave a divisor of ``G``), importance being the method's score of
the group's query heads summed; and, where the family allows it (:func:`headcut.pruning.kv_merge.refusal`), merge
its groups into ``K`` KV heads for each ``K`` dividing ``G`` below it (:func:`headcut.model.kv_merge.merge_block`:
keys aligned by complex scalars that commute with RoPE, values merged with least-squares compensation through the
output projection). An action saves the bytes of the KV heads it drops at the budget's context
(:class:`headcut.model.kv_cache.CacheAccount`; a sliding layer's heads hold its window).

**Costs.** Each action is measured alone: the calibration metric on the probe with that one action applied (a
removal gated, a merge written at the block's original shape), relative to the model before it (cf. Michel et al.
2019 §3.3, the loss with heads masked, here for every kind of action). A measure runs from the changed block's layer
on (:class:`headcut.model.replay.LayerReplay`), half a forward on average.

**Choice.** The least total cost at which the chosen actions save at least the bytes needed, at most one action a
block: a multiple-choice knapsack, solved exactly over the frontier of (bytes saved, cost) pairs (Sinha and
Zoltners 1979: for every saving, only the cheapest way to it is kept).

**Compounding.** Costs measured alone add up to less than the whole cut costs (twelve cheap merges together cost
more than the sum of each alone). The allocation runs in ``rounds``: round ``r`` saves ``r/R`` of the bytes, its
costs measured on the model as the rounds before left it, and every round's combined cut is measured and reported
beside the sum of its actions' costs alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..adapters import Block
from ..data.tasks import Calibration
from ..errors import HeadcutError
from ..model.gating import gated
from ..model.kv_cache import CacheAccount
from ..model.kv_merge import MergedBlock, merge_block, merge_cut, read_block, write_block
from ..model.masks import HeadMask
from ..model.replay import LayerReplay
from ..model.surgery import model_blocks
from .base import eval_metric
from .kv_merge import clusters_for, collect_moments, merged_in, refusal
from .layer_costs import relative

#: a block with more KV groups than this is offered only the removals that leave a divisor of its group count
FINE_GROUPS = 8

Progress = Callable[[str, int, int | None], None]


@dataclass
class Action:
    """One change of one block: ``remove`` its KV ``groups[0]``, or ``merge`` them into one KV head per cluster of
    ``groups``; the query and KV heads it leaves, the bytes it saves, its measured cost alone (relative change of
    the calibration metric) and the round that measured it."""

    block: str
    kind: str
    groups: list[list[int]]
    heads_after: int
    kv_after: int
    saved: int
    cost: float = 0.0
    round: int = 0
    merged: MergedBlock | None = field(default=None, repr=False)

    def label(self) -> str:
        if self.kind == "merge":
            return f"merge to {self.kv_after} KV head{'s' if self.kv_after != 1 else ''}"
        removed = len(self.groups[0])
        return f"remove {removed} KV group{'s' if removed != 1 else ''}"

    def to_json(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "action": self.kind,
            "groups": self.groups,
            "heads_after": self.heads_after,
            "kv_heads_after": self.kv_after,
            "bytes_saved": self.saved,
            "cost": self.cost,
            "round": self.round,
        }


@dataclass
class RoundCheck:
    """A round of the allocation: the bytes it had to reach, the actions it chose, the sum of their costs alone,
    and the measured cost of the whole cut so far (relative to the uncut model)."""

    round: int
    bytes_saved: int
    bytes_needed: int
    chosen: list[str]
    predicted: float
    measured: float

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "bytes_saved": self.bytes_saved,
            "bytes_needed": self.bytes_needed,
            "chosen": self.chosen,
            "sum_of_costs_alone": self.predicted,
            "measured": self.measured,
        }


@dataclass
class Allocation:
    """What :func:`allocate` chose: every action measured, the one chosen per block, each round's check, the cache
    bytes before, needed and after (one sequence at ``context`` tokens), and the metric before and after."""

    metric: str
    metric_before: float
    metric_after: float
    context: int
    bytes_before: int
    bytes_needed: int
    bytes_after: int
    measured: list[Action] = field(default_factory=list)
    chosen: dict[str, Action] = field(default_factory=dict)
    rounds: list[RoundCheck] = field(default_factory=list)
    replayed: bool = False
    notes: list[str] = field(default_factory=list)

    def mask(self, blocks: list[Block]) -> HeadMask:
        """The heads kept: every block whole but those a removal takes groups from."""
        return removal_mask(blocks, self.chosen)

    def merges(self) -> dict[str, Action]:
        return {name: a for name, a in self.chosen.items() if a.kind == "merge"}

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "metric_before": self.metric_before,
            "metric_after": self.metric_after,
            "context": self.context,
            "bytes_before": self.bytes_before,
            "bytes_needed": self.bytes_needed,
            "bytes_after": self.bytes_after,
            "replayed": self.replayed,
            "chosen": [a.to_json() for a in self.chosen.values()],
            "measured": [a.to_json() for a in self.measured],
            "rounds": [r.to_json() for r in self.rounds],
            "notes": self.notes,
        }


def group_order(block: Block, importance: dict[str, list[float]]) -> list[int]:
    """``block``'s KV groups, least important first (the method's scores of each group's query heads, summed)."""
    scores = importance.get(block.name)
    if scores is None or len(scores) != block.heads:
        raise HeadcutError(f"internal: no importance for each of {block.name}'s {block.heads} heads")
    size = block.group_size
    sums = [sum(scores[g * size : (g + 1) * size]) for g in range(block.kv_heads)]
    return sorted(range(block.kv_heads), key=lambda g: (sums[g], g))


def removal_counts(groups: int) -> list[int]:
    """How many KV groups a removal may take from a block of ``groups``."""
    if groups <= FINE_GROUPS:
        return list(range(1, groups + 1))
    return sorted({groups - k for k in range(groups) if k and groups % k == 0} | {groups})


def merge_targets(groups: int) -> list[int]:
    """The KV heads a merge may leave in a block of ``groups``: each divisor below it."""
    return [k for k in range(1, groups) if groups % k == 0]


def removal_mask(blocks: list[Block], chosen: dict[str, Action]) -> HeadMask:
    keep: dict[str, list[int]] = {}
    for b in blocks:
        action = chosen.get(b.name)
        gone = set(action.groups[0]) if action is not None and action.kind == "remove" else set()
        keep[b.name] = [h for h in range(b.heads) if h // b.group_size not in gone]
    return HeadMask(keep)


def block_actions(
    block: Block, account: CacheAccount, order: list[int], merges: bool, floor: int, round_: int
) -> list[Action]:
    """The removals (and merges, with ``merges``) of ``block`` that save bytes, not below ``floor`` query heads."""
    before = account.block_values(block.name, block.heads, block.kv_heads)
    out = []
    for g in removal_counts(block.kv_heads):
        heads = block.heads - g * block.group_size
        if heads < min(floor, block.heads):
            continue
        saved = (before - account.block_values(block.name, heads, block.kv_heads - g)) * account.element_bytes
        if saved > 0:
            out.append(
                Action(block.name, "remove", [sorted(order[:g])], heads, block.kv_heads - g, saved, round=round_)
            )
    if merges and block.shared is None:
        for k in merge_targets(block.kv_heads):
            saved = (before - account.block_values(block.name, block.heads, k)) * account.element_bytes
            if saved > 0:
                out.append(Action(block.name, "merge", [], block.heads, k, saved, round=round_))
    return out


def choose(options: dict[str, list[Action]], need: int) -> list[Action] | None:
    """At most one action per block saving at least ``need`` bytes in all at the least summed cost (the
    multiple-choice knapsack, exactly: for each saving up to ``need``, the cheapest way to it); None where every
    action together saves less. A negative cost (an action measured to help) counts as 0: noise does not buy a
    deeper cut than asked."""
    # frontier: capped saving -> (cost, chosen actions as a linked chain)
    frontier: dict[int, tuple[float, Any]] = {0: (0.0, None)}
    for actions in options.values():
        step = dict(frontier)
        for saved, (cost, chain) in frontier.items():
            for a in actions:
                key = min(saved + a.saved, need)
                value = cost + max(a.cost, 0.0)  # measured better than before: free, not a gain to cut more for
                if key not in step or value < step[key][0]:
                    step[key] = (value, (a, chain))
        frontier = step
    if need not in frontier:
        return None
    picked, chain = [], frontier[need][1]
    while chain is not None:
        picked.append(chain[0])
        chain = chain[1]
    return picked[::-1]


def allocate(
    model: nn.Module,
    cal: Calibration,
    probe: Calibration,
    importance: dict[str, list[float]],
    account: CacheAccount,
    need: int,
    *,
    rounds: int = 1,
    merges: bool = True,
    floor: int = 0,
    progress: Progress | None = None,
) -> Allocation:
    """Choose per block among keeping, merging and removing so that the cache of one sequence at
    ``account.context`` tokens shrinks by at least ``need`` bytes at the least measured cost (see the module's doc).
    The chosen merges are written into ``model`` at the blocks' original shapes; the removals are the result's
    :meth:`~Allocation.mask` (gated, not cut: the caller cuts them, and the merges with :func:`merge_cuts`)."""
    if rounds < 1:
        raise HeadcutError(f"the allocation needs at least one round (got {rounds})")
    blocks = model_blocks(model)
    by_name = {b.name: b for b in blocks}
    why = refusal(model) if merges else None
    if why is not None:
        merges = False
    metric = eval_metric(model, probe)
    before_bytes = account.bytes(account.current())
    out = Allocation(metric.name, 0.0, 0.0, account.context, before_bytes, need, before_bytes)
    if why is not None:
        out.notes.append(f"no merges offered: {why}")
    replay = LayerReplay(model, blocks)
    saved = 0
    for r in range(rounds):
        goal = need if r == rounds - 1 else -(-need * (r + 1) // rounds)
        mask = removal_mask(blocks, out.chosen)
        open_blocks = [b for b in blocks if b.name not in out.chosen]
        mergeable = [b for b in open_blocks if merges and merge_targets(b.kv_heads) and b.shared is None]
        with gated(model, mask):
            moments = collect_moments(model, mergeable, cal, progress) if mergeable else {}
        reference = replay.record(lambda: metric.measure(mask))
        out.replayed = replay.usable
        if r == 0:
            out.metric_before = reference
        options: dict[str, list[Action]] = {}
        for b in open_blocks:
            order = group_order(b, importance)
            options[b.name] = block_actions(b, account, order, bool(moments), floor, r)
        total = sum(len(v) for v in options.values())
        done = 0
        for name, actions in options.items():
            block = by_name[name]
            for a in actions:
                with replay.from_layer(name):
                    if a.kind == "remove":
                        value = metric.measure(removal_mask(blocks, {**out.chosen, name: a}))
                    else:
                        clusters = clusters_for(model, block, a.kv_after, moments[name])
                        a.merged = merge_block(
                            read_block(model.base_model, block), block, clusters, moments[name], False
                        )
                        a.groups = clusters
                        with merged_in(model, block, a.merged):
                            value = metric.measure(mask)
                a.cost = relative(reference, value, metric.higher_is_better)
                out.measured.append(a)
                done += 1
                if progress is not None:
                    progress("allocate", done, total)
        picked = choose(options, max(goal - saved, 0))  # an earlier round may have saved this round's share
        if picked is None:
            most = saved + sum(max((a.saved for a in acts), default=0) for acts in options.values())
            raise HeadcutError(
                f"the actions can save at most {most:,} of the {need:,} KV-cache bytes needed "
                f"(of {before_bytes:,} at {account.context:,} tokens)"
            )
        for a in picked:
            out.chosen[a.block] = a
            saved += a.saved
            if a.kind == "merge":
                assert a.merged is not None
                write_block(model.base_model, by_name[a.block], a.merged.weights)
        for a in out.measured:  # the merged weights of actions not chosen are not kept
            if out.chosen.get(a.block) is not a:
                a.merged = None
        value = metric.measure(removal_mask(blocks, out.chosen))
        out.rounds.append(
            RoundCheck(
                r + 1,
                saved,
                goal,
                [f"{a.block}: {a.label()}" for a in picked],
                sum(a.cost for a in out.chosen.values()),
                relative(out.metric_before, value, metric.higher_is_better),
            )
        )
        out.metric_after = value
        if progress is not None:
            progress("allocate", total, total)
    out.bytes_after = before_bytes - saved
    return out


def merge_cuts(blocks: list[Block], allocation: Allocation) -> dict[str, Any]:
    """The structural cuts of the allocation's merges (:func:`headcut.model.kv_merge.merge_cut`), by block."""
    by_name = {b.name: b for b in blocks}
    return {name: merge_cut(by_name[name], a.groups) for name, a in allocation.merges().items()}


def kept_after(blocks: list[Block], allocation: Allocation) -> dict[str, tuple[int, int]]:
    """Every block's query and KV heads after the allocation's cut."""
    return {
        b.name: (allocation.chosen[b.name].heads_after, allocation.chosen[b.name].kv_after)
        if b.name in allocation.chosen
        else (b.heads, b.kv_heads)
        for b in blocks
    }
