"""The ``protect`` stage: protection by measurement (issue 70, point 2). After the method chose the heads, the cut it
chose in each block is measured alone (:func:`headcut.pruning.layer_costs.cut_costs`: the calibration metric with
only that block's heads gated off, relative to the uncut model's); a block whose cut alone costs more than
``protect`` is kept whole, and the method chooses again with its heads ranked above every other head
(:attr:`headcut.pruning.method.Problem.protected`), so they go only when the budget cannot be met otherwise (the
report and a note then name them with their cost). The newly cut blocks are measured in turn, up to
:data:`ROUNDS` times. Score-based methods; the first layers of a decoder are where a first-order score misleads
most (a first layer's attention rated cheap by the gradient broke a model when removed: docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ....errors import HeadcutError, label
from ....model.surgery import model_blocks
from ....options import option
from ....pruning import plan_prune
from ....pruning.layer_costs import cut_costs, probe_of
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun

#: the --help section of the budget and cut options
B = "Budget and cut"
#: how many times the blocks newly cut are measured and the heads chosen again
ROUNDS = 3


@dataclass
class Protect(PruneStage):
    """``protect``: the most a block's cut alone may cost (relative calibration metric; 0: off)."""

    kind: ClassVar[str] = "protect"
    summary: ClassVar[str] = "each block's cut measured alone; a block costing more kept whole, the heads chosen again"
    after: ClassVar[tuple[str, ...]] = ("choose",)
    switch: ClassVar[str | None] = "protect"

    protect: float = option(
        0.0,
        low=0,
        metavar="C",
        panel=B,
        methods="score",
        help="Keep whole a block whose cut alone costs more (0: off).",
    )

    def check(self, request: Any) -> None:
        super().check(request)
        if not self.protect:
            return
        if request.sources.data is None:
            raise HeadcutError(
                f"{label('protect')} measures each block's cut on calibration data: it needs {label('data')}"
            )
        if request.method_kind != "score":
            raise HeadcutError(
                f"{label('protect')} ranks the protected blocks' heads above the others: it applies to score-based "
                f"methods, not {request.method} ({request.method_kind})"
            )

    def run(self, state: PruneState, run: RoundRun) -> None:
        cal = state.cal
        if cal is None:
            raise HeadcutError(f"{label('protect')} needs calibration data ({label('data')})")
        probe = probe_of(cal)
        bars = Bars(state.progress, state.config.method, state.metric)
        protected: dict[str, float] = {}
        measured: list[dict[str, float]] = []
        move(state.model, state.device)
        try:
            for _ in range(ROUNDS):
                name, before, costs = cut_costs(state.model, run.result.mask, probe, lambda d, t: bars("protect", d, t))
                measured.append(costs)
                newly = {b: c for b, c in costs.items() if c > self.protect and b not in protected}
                if not newly:
                    break
                protected.update(newly)
                run.result = plan_prune(
                    state.model,
                    cal,
                    run.round.config,
                    state.options,
                    eval_calibration=state.eval_cal,
                    progress=bars,
                    dist=state.dist,
                    checked=True,
                    protected=protected,
                )
        finally:
            bars.close()
        state.model.to("cpu")
        run.pruned_metric = run.metric = run.result.metric_after
        mask = run.result.mask
        heads = {b.name: b.heads for b in model_blocks(state.model)}
        cut_anyway = {b: c for b, c in protected.items() if len(mask.keep[b]) < heads[b]}
        if cut_anyway:
            state.notes.append(
                f"--protect {self.protect:g}: the budget cannot be met without cutting "
                + ", ".join(f"{b} (its cut alone {c:+.1%})" for b, c in cut_anyway.items())
            )
        run.outputs[self.kind] = {
            "threshold": self.protect,
            "metric": name,
            "metric_before": before,
            "measured": measured,
            "protected": sorted(protected),
            "cut_anyway": sorted(cut_anyway),
        }

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        if self.kind in run.outputs:
            report["protect"] = run.outputs[self.kind]
