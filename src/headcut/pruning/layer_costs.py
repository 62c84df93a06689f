"""What one block's change costs, measured: the calibration metric with that block changed alone, relative to the
model before any change (issue 70's protection by measurement: never assume which layers hold the model up).

Measured on the first :data:`PROBE_TOKENS` tokens of the calibration data (:func:`probe_of`), the heads a mask
drops gated off (exact: the slimmed model computes the same), one block at a time (:func:`cut_costs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from torch import nn

from ..data.tasks import Calibration
from ..model.masks import HeadMask
from ..model.surgery import model_blocks
from .base import eval_metric

#: calibration tokens each block's cost is measured on (the first batches holding them)
PROBE_TOKENS = 8192


def probe_of(cal: Calibration, tokens: int = PROBE_TOKENS) -> Calibration:
    """The first batches of ``cal`` holding about ``tokens`` real tokens (at least one batch)."""
    kept, seen = [], 0
    for batch in cal.batches:
        kept.append(batch)
        mask = batch.get("attention_mask")
        seen += int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
        if seen >= tokens:
            break
    return replace(cal, batches=kept, examples=sum(int(b["input_ids"].shape[0]) for b in kept))


def relative(before: float, value: float, higher_is_better: bool) -> float:
    """How much worse ``value`` is than ``before``, relative (0: the same; 0.1: 10 % worse)."""
    scale = abs(before) if before else 1.0
    return (before - value) / scale if higher_is_better else (value - before) / scale


def cut_costs(
    model: nn.Module, mask: HeadMask, probe: Calibration, progress: Callable[[int, int], None] | None = None
) -> tuple[str, float, dict[str, float]]:
    """The metric's name, its value on ``probe`` before any cut, and for each block ``mask`` takes heads from, the
    relative cost of that block's cut alone (every other block whole)."""
    blocks = model_blocks(model)
    metric = eval_metric(model, probe)
    full = HeadMask.full(blocks)
    before = metric.measure(full)
    cut = [b for b in blocks if len(mask.keep.get(b.name, range(b.heads))) < b.heads]
    costs: dict[str, float] = {}
    for i, block in enumerate(cut):
        alone = HeadMask({**full.keep, block.name: list(mask.keep[block.name])})
        costs[block.name] = relative(before, metric.measure(alone), metric.higher_is_better)
        if progress is not None:
            progress(i + 1, len(cut))
    return metric.name, before, costs
