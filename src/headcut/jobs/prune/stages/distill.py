"""The ``distill`` stage: block-local distillation after the cut (:mod:`headcut.training.block_distill`, NVIDIA
Puzzle's local distillation): every attention block the cut changed is trained alone, for ``distill_steps`` steps,
to reproduce the unpruned model's block on cached inputs of the calibration data (``--data``, in its blocks of
``--seq-len`` tokens: the context the cut is judged at), one block at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ....errors import HeadcutError, label
from ....model.masks import HeadMask
from ....model.surgery import model_blocks
from ....options import option
from ....pruning import eval_metric
from ....pruning.schedule import Round
from ....training.block_distill import INPUTS, TRAINED, distill_blocks
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun

#: the --help section of the stages after the cut that train
R = "Recovery"


@dataclass
class Distill(PruneStage):
    """``distill_steps`` steps per changed block (0: none), at ``distill_lr``, training ``distill_train`` on the
    inputs of ``distill_inputs``. A schedule's round may set each for itself."""

    kind: ClassVar[str] = "distill"
    summary: ClassVar[str] = "each changed attention block trained alone to reproduce the unpruned model's block"
    after: ClassVar[tuple[str, ...]] = ("cut", "refit", "merge")
    switch: ClassVar[str | None] = "distill_steps"

    distill_steps: int = option(0, low=0, metavar="N", panel=R, help="Per-block distillation steps (0: off).")
    distill_lr: float = option(1e-3, low=0, metavar="LR", panel=R, help="Per-block distillation learning rate.")
    distill_train: str = option(
        "attention",
        choices=TRAINED,
        metavar="PART",
        panel=R,
        help="Trained: attention (all) or output.",
    )
    distill_inputs: str = option(
        "unpruned", choices=INPUTS, metavar="FROM", panel=R, help="Inputs of the unpruned or cut model."
    )

    def check(self, request: Any) -> None:
        super().check(request)
        if self.distill_steps and request.sources.data is None:
            raise HeadcutError(
                f"{label('distill_steps')} trains each changed block on cached inputs of calibration data: it needs "
                f"{label('data')}"
            )
        if not self.distill_lr > 0:
            raise HeadcutError(f"{label('distill_lr')} must be > 0 (got {self.distill_lr})")

    def keeps_unpruned(self, rounds: Sequence[Round]) -> bool:
        return any(self.in_round(r.options).active() for r in rounds)

    def run(self, state: PruneState, run: RoundRun) -> None:
        teacher, cal = state.unpruned, state.cal
        assert teacher is not None  # kept whenever a round distils
        if cal is None:
            raise HeadcutError(f"{label('distill_steps')} needs calibration data ({label('data')})")
        steps = self.distill_steps
        bars = Bars(state.progress, "distill", state.metric, train=f"block-local distillation ({steps} steps a block)")
        move(state.model, state.device)
        move(teacher, state.device)
        try:
            done = distill_blocks(
                state.model,
                teacher,
                cal,
                steps=self.distill_steps,
                lr=self.distill_lr,
                train=self.distill_train,
                inputs=self.distill_inputs,
                seed=state.config.seed,
                progress=lambda d, t: bars("train", d, t),
            )
            full = HeadMask.full(model_blocks(state.model))
            metric = eval_metric(state.model, state.eval_cal, bars).measure(full) if state.eval_cal else None
        finally:
            bars.close()
            teacher.to("cpu")
        state.model.to("cpu")
        run.outputs[self.kind] = (done, metric)
        run.metric = metric

    def record(self, run: RoundRun, record: dict[str, Any]) -> None:
        done, metric = run.outputs[self.kind]
        record["metric"]["after_distill"] = metric
        record["distill"] = done.to_json()

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        done, metric = run.outputs[self.kind]
        report["distill"] = done.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = run.pruned_metric
            report["metric"]["after_distill"] = metric
