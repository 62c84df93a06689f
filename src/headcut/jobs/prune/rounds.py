"""The rounds of a prune as one cut: an earlier round's record for the report (:func:`round_record`), a round's
mask in the input model's numbering (:func:`in_input_numbering`), and the rounds' results made one
(:func:`as_one_cut`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...config import PruneConfig
from ...model.masks import HeadMask
from .stages.base import PruneStage, RoundRun


def round_record(run: RoundRun, mask: HeadMask, stages: Sequence[PruneStage]) -> dict[str, Any]:
    """An earlier round's record for the report's ``rounds``: its head count, its ``mask`` (the input model's
    numbering), its metric after the cut, and each of its ``stages``' own entries (the metric after it too)."""
    record: dict[str, Any] = {
        "keep": run.round.config.keep,
        "mask": mask.to_json(),
        "metric": {"after_pruning": run.result.metric_after},
    }
    for stage in stages:
        stage.record(run, record)
    return record


def in_input_numbering(earlier: HeadMask | None, mask: HeadMask) -> HeadMask:
    """``mask`` (kept heads in the numbering of the model a round cut) in the input model's numbering, given the
    rounds before as ``earlier`` (None: the first round)."""
    if earlier is None:
        return mask
    return HeadMask({b: [earlier.keep[b][i] for i in kept] for b, kept in mask.keep.items()})


def as_one_cut(runs: list[RoundRun], mask: HeadMask, config: PruneConfig) -> tuple[Any, Any]:
    """The last round's result and slimming made the rounds' one cut of the input model: the composed ``mask``,
    the first round's heads, parameters and metric before, every round's scorings and seconds."""
    first, last = runs[0], runs[-1]
    result = last.result
    if len(runs) == 1:
        return result, last.slimmed
    result.mask = mask
    result.heads_before, result.metric_before = first.result.heads_before, first.result.metric_before
    result.config = config
    for run in runs[:-1]:
        result.scorings += run.result.scorings
        result.seconds += run.result.seconds
    slimmed = result.slim = replace(
        last.slimmed, heads_before=first.slimmed.heads_before, params_before=first.slimmed.params_before
    )
    return result, slimmed
