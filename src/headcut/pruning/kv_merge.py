"""Merging KV heads in a model, the blocks chosen by measurement (issue 70's protection by measurement).

Every block whose KV heads can be merged into ``to`` heads is merged alone, on calibration statistics
(:func:`headcut.model.kv_merge.merge_block`: keys aligned by complex scalars that commute with RoPE, values merged
with least-squares compensation through the output projection), and the calibration metric of the model with
that one block merged is its *cost* (relative to the unmerged model's). The ``layers`` cheapest blocks are then
merged together; a block whose cost alone exceeds ``max_cost`` is kept whole unless fewer than ``layers`` blocks
are under it (the result then names each such block with its cost). The first layers of a decoder are where
cutting costs most (LLM-Pruner leaves them uncut by rule; here the measurement decides).

The merged blocks are written at their original shape first (every merged model is measured that way, so the
costs are exact), then cut structurally (:func:`headcut.model.surgery.reshape` with
:func:`headcut.model.kv_merge.merge_cut`): one KV head per cluster of groups, every query head kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters import Block, adapter_for
from ..data.tasks import Calibration
from ..errors import HeadcutError
from ..model import compensation
from ..model.kv_merge import (
    InputMoments,
    MergedBlock,
    cholesky,
    merge_block,
    merge_cut,
    merge_keys,
    read_block,
    write_block,
)
from ..model.masks import HeadMask
from ..model.surgery import model_blocks, reshape
from ..scoring.attention_maps import real_queries
from ..scoring.base import calibration as calibration_batches
from ..scoring.base import model_device, scoring_mode
from .base import eval_metric
from .layer_costs import relative

Progress = Callable[[str, int, int | None], None]


@dataclass
class LayerCost:
    """One block's merge: the calibration metric's relative change with it merged alone, the least-squares errors
    left in its keys and values, whether it was merged, and whether its cost put it over the threshold."""

    block: str
    kv_heads: int
    to: int
    cost: float
    key_error: float
    value_error: float
    clusters: list[list[int]]
    merged: bool = False
    over_threshold: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "kv_heads": self.kv_heads,
            "to": self.to,
            "cost": self.cost,
            "key_error": self.key_error,
            "value_error": self.value_error,
            "clusters": self.clusters,
            "merged": self.merged,
            "over_threshold": self.over_threshold,
        }


@dataclass
class MergeResult:
    """What :func:`merge_kv_heads` did: every candidate block's measured cost, the blocks merged, the KV heads
    before and after, the calibration metric before and after (the probe's), and notes."""

    metric: str
    metric_before: float
    metric_after: float
    max_cost: float
    bias_field: str | None
    layers: list[LayerCost] = field(default_factory=list)
    kv_heads_before: int = 0
    kv_heads_after: int = 0
    notes: list[str] = field(default_factory=list)
    #: the KV cache of one sequence before and after the merge (the job fills it in): context, before, after
    kv_bytes: dict[str, int | None] | None = None

    @property
    def merged(self) -> list[str]:
        return [layer.block for layer in self.layers if layer.merged]

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "metric_before": self.metric_before,
            "metric_after": self.metric_after,
            "max_cost": self.max_cost,
            "bias_compensation": self.bias_field is not None or None,
            "blocks": self.merged,
            "kv_heads": {"before": self.kv_heads_before, "after": self.kv_heads_after},
            "kv_bytes": self.kv_bytes,
            "layers": [layer.to_json() for layer in self.layers],
            "notes": self.notes,
        }


def refusal(model: nn.Module) -> str | None:
    """Why ``model``'s KV heads cannot be merged, or None."""
    return adapter_for(model).kv_merge_refusal(model.config)


def candidates(model: nn.Module, to: int) -> list[Block]:
    """The blocks whose KV heads can be merged into ``to`` heads: more than ``to`` KV heads, a multiple of it,
    not shared with another block."""
    why = refusal(model)
    if why is not None:
        family = getattr(model.config, "model_type", "this family")
        raise HeadcutError(f"cannot merge {family}'s KV heads: {why}")
    return [b for b in model_blocks(model) if b.shared is None and b.kv_heads > to and b.kv_heads % to == 0]


def collect_moments(
    model: nn.Module, blocks: list[Block], cal: Calibration, progress: Progress | None = None
) -> dict[str, InputMoments]:
    """One forward per calibration batch: the second moments of each block's input (what its key projection
    reads) over the real tokens."""
    base = model.base_model
    moments = {b.name: InputMoments(int(base.get_submodule(b.k).weight.shape[1])) for b in blocks}
    current: dict[str, Any] = {}

    def hook_for(block: Block) -> Any:
        def hook(_m: nn.Module, args: Any) -> None:
            x = args[0]
            real = real_queries(current, block.kind, x.shape[0], x.shape[1], x.device) if x.dim() == 3 else None
            moments[block.name].add(x[real] if real is not None else x)

        return hook

    handles = [base.get_submodule(b.k).register_forward_pre_hook(hook_for(b)) for b in blocks]
    on_batch = None if progress is None else (lambda d, t: progress("score", d, t))
    try:
        with scoring_mode(model), torch.no_grad():
            for batch in calibration_batches(cal.batches, "kv merge", model_device(model), on_batch):
                current.clear()
                current.update(batch)
                model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return moments


def clusters_for(model: nn.Module, block: Block, to: int, moments: InputMoments) -> list[list[int]]:
    """Which of ``block``'s KV groups become each of its ``to`` KV heads: all of them into one, or greedily, the
    groups whose keys merge with the least error (pairwise, :func:`headcut.model.kv_merge.merge_keys`) together."""
    groups = block.kv_heads
    if to == 1:
        return [list(range(groups))]
    w = read_block(model.base_model, block)
    bias = w.k_bias is not None
    c = moments.second(bias)
    chol = cholesky(c)
    pair = {(a, b): merge_keys(w, block, [a, b], c, chol, bias)[2] for a in range(groups) for b in range(a + 1, groups)}
    size = groups // to
    left = list(range(groups))
    clusters: list[list[int]] = []
    while left:
        first = left.pop(0)
        near = sorted(left, key=lambda g: pair[(min(first, g), max(first, g))])[: size - 1]
        clusters.append([first, *near])
        left = [g for g in left if g not in near]
    return clusters


@contextmanager
def _with_delta(model: nn.Module, block: Block, delta: torch.Tensor | None) -> Iterator[None]:
    """The output projection adds ``delta`` to its output while inside (the bias compensation, measured before any
    projection is given a bias)."""
    if delta is None:
        yield
        return
    mod = model.base_model.get_submodule(block.o)

    def add(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
        return out + delta.to(out.device, out.dtype)

    handle = mod.register_forward_hook(add)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def merged_in(model: nn.Module, block: Block, merged: MergedBlock) -> Iterator[None]:
    """Inside: ``block`` computes its ``merged`` form (written at its original shape, the bias compensation added to
    its output where there is one); its own weights are written back on leaving."""
    base = model.base_model
    original = read_block(base, block)
    write_block(base, block, merged.weights)
    try:
        with _with_delta(model, block, merged.o_bias_delta):
            yield
    finally:
        write_block(base, block, original)


def merge_kv_heads(
    model: nn.Module,
    cal: Calibration,
    probe: Calibration,
    *,
    layers: int,
    to: int = 1,
    max_cost: float = 0.05,
    centered: bool = False,
    progress: Progress | None = None,
) -> MergeResult:
    """Merge the KV heads of the ``layers`` blocks of ``model`` whose merge into ``to`` KV heads costs least on
    ``probe`` (see the module's doc), in place, on the second moments of ``cal``. ``centered``: fit the values
    around the mean input and fold the error at the mean into the output projections' biases (FLAP's bias
    compensation, refused for a family whose stock config cannot give them one)."""
    if layers < 1 or to < 1:
        raise HeadcutError(f"merging KV heads needs layers >= 1 and to >= 1 (got {layers} and {to})")
    blocks = candidates(model, to)
    if not blocks:
        raise HeadcutError(f"no block of this model has more than {to} KV heads in a multiple of {to} to merge")
    field_name = compensation.bias_field(model, blocks) if centered else None
    base = model.base_model
    metric = eval_metric(model, probe)
    before = metric.measure(HeadMask.full(model_blocks(model)))
    moments = collect_moments(model, blocks, cal, progress)
    merged: dict[str, MergedBlock] = {}
    costs: list[LayerCost] = []
    for i, block in enumerate(blocks):
        clusters = clusters_for(model, block, to, moments[block.name])
        result = merge_block(read_block(base, block), block, clusters, moments[block.name], centered)
        with merged_in(model, block, result):
            value = metric.measure(HeadMask.full(model_blocks(model)))
        change = relative(before, value, metric.higher_is_better)
        merged[block.name] = result
        costs.append(
            LayerCost(block.name, block.kv_heads, to, change, result.error["keys"], result.error["values"], clusters)
        )
        if progress is not None:
            progress("merge", i + 1, len(blocks))
    out = MergeResult(metric.name, before, before, max_cost, field_name, costs)
    out.kv_heads_before = sum(b.kv_heads for b in model_blocks(model))
    ranked = sorted(costs, key=lambda c: c.cost)
    for c in ranked:
        c.over_threshold = c.cost > max_cost
    chosen = [c for c in ranked if not c.over_threshold][:layers]
    if len(chosen) < layers:
        extra = [c for c in ranked if c.over_threshold][: layers - len(chosen)]
        chosen += extra
        if extra:
            out.notes.append(
                f"merged {len(extra)} block{'s' if len(extra) != 1 else ''} whose merge alone cost more than "
                f"{max_cost:.1%} ({', '.join(f'{c.block}: {c.cost:+.1%}' for c in extra)}): only "
                f"{len(chosen) - len(extra)} of {layers} were under it"
            )
    if len(chosen) < layers:
        out.notes.append(f"{layers} blocks asked, {len(chosen)} can be merged into {to} KV heads")
    for c in chosen:
        c.merged = True
    by_name = {b.name: b for b in blocks}
    with torch.no_grad():
        for c in chosen:
            write_block(base, by_name[c.block], merged[c.block].weights)
        if centered:
            deltas = {c.block: merged[c.block].o_bias_delta for c in chosen}
            compensation.apply(
                model, model_blocks(model), {k: v for k, v in deltas.items() if v is not None}, field_name
            )
    reshape(model, {c.block: merge_cut(by_name[c.block], c.clusters) for c in chosen})
    out.kv_heads_after = sum(b.kv_heads for b in model_blocks(model))
    out.metric_after = metric_for(model, probe)
    return out


def metric_for(model: nn.Module, probe: Calibration) -> float:
    """The probe's metric of ``model`` as it is."""
    return eval_metric(model, probe).measure(HeadMask.full(model_blocks(model)))
