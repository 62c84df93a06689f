"""The ``cut`` stage: the heads the round chose are removed from the weights (:func:`headcut.model.surgery.slim`),
with FLAP's bias compensation where the method asks for it (``bias_compensation``: the removed heads' mean output,
measured on the uncut model, folded into the output projections' biases; An et al. 2024, §3.4). Its options say
which cuts a budget may make: the same heads in every block, a floor per block, the grouped-query policy, and how a
budget in bytes places the heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from ....adapters import adapter_for
from ....catalog import ALLOCATIONS, GQA_POLICIES
from ....config import PruneConfig
from ....data import Calibration
from ....errors import HeadcutError, label
from ....model import compensation
from ....model.masks import HeadMask
from ....model.surgery import model_blocks, slim
from ....options import option
from ....progress import Reporter
from ....pruning import eval_metric
from ....pruning.search import uniform_budgets
from ....pruning.units import block_sets, nearest
from ....scoring.fluctuation import input_moments
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun

#: the --help section of the budget and cut options
B = "Budget and cut"


@dataclass
class Cut(PruneStage):
    """The cut's options (``prune``'s keywords and flags of the same names): see the fields' help."""

    kind: ClassVar[str] = "cut"
    summary: ClassVar[str] = "the chosen heads removed from the weights (FLAP's bias compensation when asked)"
    after: ClassVar[tuple[str, ...]] = ("choose", "protect", "allocate")

    uniform: bool = option(
        False,
        panel=B,
        help="The same heads in every block (a stock checkpoint).",
    )
    gqa: str = option(
        "auto",
        choices=GQA_POLICIES,
        metavar="POLICY",
        panel=B,
        help="GQA: group/auto (whole KV groups), uniform (equal query heads a group), duplicate (KV copied).",
    )
    min_heads_per_block: int = option(0, low=0, metavar="M", panel=B, help="Never take a block below M heads.")
    allocation: str = option(
        "cost",
        choices=ALLOCATIONS,
        panel=B,
        methods="score",
        help="--kv-budget: by score per byte saved (cost) or by score (count).",
    )

    def run(self, state: PruneState, run: RoundRun) -> None:
        """Remove the heads the round chose; with ``bias_compensation``, fold the removed heads' mean output into the
        output projections' biases (measured on the uncut model) and measure the compensated model."""
        result = run.result
        if run.rounds == 1:  # the --uniform budgets nearest this cut, offered for a stock checkpoint
            run.outputs["uniform_budgets"] = _uniform_alternatives(state.model, state.config, result.target)
        compensate = bool(getattr(state.options, "bias_compensation", False))
        if compensate:
            bias_field = compensation.bias_field(state.model, model_blocks(state.model))
            added = _compensation(state.model, result.mask, state.cal, state.progress, state.device)
        slimmed = slim(state.model, result.mask, gqa=state.config.gqa, planned=run.planned_cuts)
        result.slim = run.slimmed = slimmed
        state.notes += slimmed.notes
        if compensate:
            compensation.apply(state.model, model_blocks(state.model), added, bias_field)
            compensation.check_names(state.model, bias_field)
            state.notes.append(_compensation_note(len(added), bias_field))
            run.outputs["bias_compensation"] = {
                "blocks": sorted(added),
                "field": bias_field,
                "metric_uncompensated": result.metric_after,
            }
            if state.eval_cal is not None:
                move(state.model, state.device)
                result.metric_after = eval_metric(state.model, state.eval_cal).measure(
                    HeadMask.full(model_blocks(state.model))
                )
                state.model.to("cpu")
            run.pruned_metric = run.metric = result.metric_after

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        near = run.outputs.get("uniform_budgets")
        if near and len({(b.heads, b.kv_heads) for b in model_blocks(state.model)}) > 1:
            report["uniform_budgets"] = near
        if run.outputs.get("bias_compensation") is not None:
            report["bias_compensation"] = run.outputs["bias_compensation"]


def _uniform_alternatives(model: nn.Module, config: PruneConfig, target: int | None) -> list[int]:
    """The ``--uniform`` budgets nearest ``target`` for a run without ``--uniform`` on a family whose stock config
    could hold a uniform cut (an empty list otherwise): what the summary offers for a stock checkpoint."""

    if config.uniform or adapter_for(model).stock_spec(str(model.config.model_type)) is None or target is None:
        return []
    sets = block_sets(model_blocks(model), config.gqa)
    total = sum(s.heads * s.width for s in sets)  # the uncut model: not a cut to offer
    valid = [k for k in uniform_budgets(sets, config.min_heads_per_block) if 0 < k < total]
    return [target] if target in valid else nearest(valid, target)


def _compensation(model: nn.Module, mask: HeadMask, cal: Calibration | None, progress: Reporter, device: Any) -> Any:
    """FLAP's bias compensation for ``mask`` (:mod:`headcut.model.compensation`): the output projections' mean
    inputs over ``cal`` on the unpruned ``model`` (one more forward pass), and each block's bias increment."""

    if cal is None:
        raise HeadcutError(f"{label('bias_compensation')} needs calibration data ({label('data')})")
    blocks = model_blocks(model)
    bars = Bars(progress, "bias compensation", None)
    move(model, device)
    try:
        moments, _ = input_moments(model, blocks, cal.batches, "bias compensation", lambda d, t: bars("score", d, t))
    finally:
        bars.close()
    model.to("cpu")
    return compensation.deltas(model, blocks, mask.keep, {name: m.mean() for name, m in moments.items()})


def _compensation_note(blocks: int, field: str | None) -> str:
    turned = f"; {field} turned on (zero biases on the other projections)" if field else ""
    return (
        f"bias compensation (FLAP §3.4): the removed heads' mean output folded into the output projection's "
        f"bias of {blocks} block{'s' if blocks != 1 else ''}{turned}"
    )
