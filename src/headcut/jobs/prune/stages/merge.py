"""The ``merge`` stage: after the cut, the KV heads of the ``merge_layers`` blocks whose merge costs least are merged
into ``merge_to`` KV heads each, every query head kept (:mod:`headcut.pruning.kv_merge`: each candidate block's
cost measured alone on the calibration data, blocks over ``merge_max_cost`` kept whole unless too few are under
it; keys aligned by complex scalars that commute with RoPE, values merged with least-squares compensation through
the output projection, FLAP's bias compensation with ``merge_bias``). It runs in the last round of a schedule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ....errors import HeadcutError, label
from ....model.kv_cache import cache_account
from ....model.masks import HeadMask
from ....model.surgery import count_params, model_blocks
from ....options import option
from ....pruning import eval_metric
from ....pruning.kv_merge import merge_kv_heads
from ....pruning.layer_costs import probe_of
from ....pruning.schedule import Round
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun

#: the --help section of the budget and cut options
B = "Budget and cut"


@dataclass
class Merge(PruneStage):
    """``merge_layers`` blocks merged into ``merge_to`` KV heads each (0: none)."""

    kind: ClassVar[str] = "merge"
    summary: ClassVar[str] = "the KV heads of the blocks measured cheapest merged into fewer, every query head kept"
    after: ClassVar[tuple[str, ...]] = ("cut", "refit")
    switch: ClassVar[str | None] = "merge_layers"

    merge_layers: int = option(0, low=0, metavar="N", panel=B, help="Blocks whose KV heads are merged (0: none).")
    merge_to: int = option(1, low=1, metavar="K", panel=B, help="KV heads of each merged block.")
    merge_max_cost: float = option(0.05, low=0, metavar="C", panel=B, help="Keep whole a block costing more alone.")
    merge_bias: bool = option(False, panel=B, help="Fold the merge's mean error into o_proj's bias.")

    def check(self, request: Any) -> None:
        super().check(request)
        if self.merge_layers and request.sources.data is None:
            raise HeadcutError(
                f"{label('merge_layers')} merges KV heads on the second moments of calibration data and measures "
                f"each block's cost on it: it needs {label('data')}"
            )

    def keeps_unpruned(self, rounds: Sequence[Round]) -> bool:
        return False

    def run(self, state: PruneState, run: RoundRun) -> None:
        if not run.last:
            return
        cal = state.cal
        if cal is None:
            raise HeadcutError(f"{label('merge_layers')} needs calibration data ({label('data')})")
        bars = Bars(state.progress, "merge", state.metric)
        kv_before = _kv_bytes(state.model, state.config.context)
        move(state.model, state.device)
        try:
            done = merge_kv_heads(
                state.model,
                cal,
                probe_of(cal),
                layers=self.merge_layers,
                to=self.merge_to,
                max_cost=self.merge_max_cost,
                centered=self.merge_bias,
                progress=bars,
            )
            full = HeadMask.full(model_blocks(state.model))
            metric = eval_metric(state.model, state.eval_cal, bars).measure(full) if state.eval_cal else None
        finally:
            bars.close()
        state.model.to("cpu")
        state.notes += done.notes
        if kv_before is not None:
            after = _kv_bytes(state.model, kv_before[1])
            done.kv_bytes = {"context": kv_before[1], "before": kv_before[0], "after": after[0] if after else None}
        run.outputs[self.kind] = (done, metric)
        if state.eval_cal is not None:  # the cut's own metric stays the round's "after pruning"
            run.metric = metric

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        if self.kind not in run.outputs:
            return
        done, metric = run.outputs[self.kind]
        report["merge"] = done.to_json()
        report["params"]["after"] = count_params(state.model)
        if report.get("metric") is not None and metric is not None:
            report["metric"]["after_merge"] = metric


def _kv_bytes(model: Any, context: int | None) -> tuple[int, int] | None:
    """The model's KV-cache bytes for one sequence of ``context`` tokens (None: its longest) and that context; None
    where it keeps no cache headcut counts."""
    try:
        account = cache_account(model, context)
    except HeadcutError:
        return None
    return account.bytes(account.current()), account.context
