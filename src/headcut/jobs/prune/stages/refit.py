"""The ``refit`` stage: after the cut, each kept block's output projection is refitted by least squares to the
outputs of the model the round cut, on ``--data`` (:mod:`headcut.pruning.refit`), and the refitted model's metric
measured on the eval data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ....config.prune import B
from ....errors import HeadcutError, label
from ....model.masks import HeadMask
from ....model.surgery import model_blocks
from ....options import option
from ....pruning import eval_metric
from ....pruning.refit import refit_outputs
from ....pruning.schedule import Round
from ....training.finetuning import frozen_teacher
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun


@dataclass
class Refit(PruneStage):
    """``refit``: True runs the stage (``--refit`` adds it to a recipe; a recipe lists it as ``- refit: {}``)."""

    kind: ClassVar[str] = "refit"
    summary: ClassVar[str] = "the kept heads' output projections refitted by least squares to the uncut model's"
    after: ClassVar[tuple[str, ...]] = ("cut",)
    switch: ClassVar[str | None] = "refit"

    refit: bool = option(True, panel=B, help="Refit the output projections on --data after the cut.")

    def options(self) -> dict[str, Any]:
        return {}  # a recipe lists the stage, which is its one option

    def check(self, request: Any) -> None:
        super().check(request)
        if request.sources.data is None:
            raise HeadcutError(
                f"{label('refit')} fits the kept heads' output projections to the unpruned model's outputs "
                f"on data: it needs {label('data')}"
            )

    def keeps_unpruned(self, rounds: Sequence[Round]) -> bool:
        return True

    def prepare(self, state: PruneState, run: RoundRun) -> None:
        # the refit fits the outputs of the model this round cuts: the unpruned model, or the earlier round's cut
        run.teacher = state.unpruned if run.index == 0 else frozen_teacher(state.model)

    def run(self, state: PruneState, run: RoundRun) -> None:
        teacher, run.teacher = run.teacher, None
        assert teacher is not None
        model, eval_cal = state.model, state.eval_cal
        if state.cal is None:
            raise HeadcutError(f"{label('refit')} needs data ({label('data')})")
        bars = Bars(state.progress, "refit", state.metric)
        move(model, state.device)
        move(teacher, state.device)
        try:
            refitted = refit_outputs(model, teacher, state.cal, progress=lambda d, t: bars("refit", d, t))
            metric = (
                eval_metric(model, eval_cal, bars).measure(HeadMask.full(model_blocks(model))) if eval_cal else None
            )
        finally:
            bars.close()
            teacher.to("cpu")
        model.to("cpu")
        run.outputs[self.kind] = (refitted, metric)
        run.metric = metric

    def record(self, run: RoundRun, record: dict[str, Any]) -> None:
        refitted, metric = run.outputs[self.kind]
        record["metric"]["after_refit"] = metric
        record["refit"] = refitted.to_json()

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        refitted, metric = run.outputs[self.kind]
        report["refit"] = refitted.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = run.pruned_metric
            report["metric"]["after_refit"] = metric
