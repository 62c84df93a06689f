"""The ``recover`` stage: recovery fine-tuning of the cut model, distilled from the unpruned model
(:func:`headcut.training.finetuning.finetune`, ``finetune``'s loss and defaults: lr 5e-5, alpha 0.5, temperature 2),
optionally matching its hidden states and averaging the weights of the last steps; with ``--recover-data``
(unlabelled inputs) on ``--data``'s batches and those, from the teacher alone (alpha 1). Data-parallel over the
run's processes (engine ``auto``: FSDP under ``accelerate launch --use_fsdp``, else DDP)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ....config import FinetuneConfig
from ....errors import HeadcutError, label
from ....options import check_fields, option
from ....pruning.schedule import Round
from ....training import finetuning  # finetuning.finetune looked up when called (tests stand in for it)
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun

#: the --help section of the recovery's options
R = "Recovery"


@dataclass
class Recover(PruneStage):
    """``recover_steps`` steps of distilled fine-tuning (0: none), ``recover_hidden_weight`` (hidden-state matching)
    and ``recover_average`` (stochastic weight averaging over that fraction of the last steps, at a constant
    learning rate; 0: linear decay, the last step's weights). A schedule's round may set each for itself."""

    kind: ClassVar[str] = "recover"
    summary: ClassVar[str] = "recovery fine-tuning of the cut model, distilled from the unpruned one"
    after: ClassVar[tuple[str, ...]] = ("cut", "refit", "merge", "distill")
    switch: ClassVar[str | None] = "recover_steps"

    recover_steps: int = option(0, low=0, metavar="N", panel=R, help="Distilled recovery steps after the cut.")
    recover_hidden_weight: float = option(
        0.0, low=0, metavar="W", panel=R, help="Hidden-state matching weight (0: off)."
    )
    recover_average: float = option(
        0.0, low=0, high=1, metavar="F", panel=R, help="SWA: last F averaged, constant LR (0: off)."
    )

    def check(self, request: Any) -> None:
        """The recovery's refusals, in the order their messages have always been given."""
        steps = self.recover_steps
        check_fields(self, ("recover_steps",))
        if steps and request.sources.data is None:
            raise HeadcutError(
                f"{label('recover_steps')} trains the pruned model: it needs {label('data')} (training data with labels)"
            )
        check_fields(self, ("recover_hidden_weight",))
        if self.recover_hidden_weight and not steps:
            raise HeadcutError(
                f"{label('recover_hidden_weight')} weighs a term of the recovery fine-tuning: it needs "
                f"{label('recover_steps')} N"
            )
        check_fields(self, ("recover_average",))
        if self.recover_average and not steps:
            raise HeadcutError(
                f"{label('recover_average')} averages the weights of the recovery fine-tuning: it needs "
                f"{label('recover_steps')} N"
            )

    def keeps_unpruned(self, rounds: Sequence[Round]) -> bool:
        return any(self.in_round(r.options).active() for r in rounds)

    def run(self, state: PruneState, run: RoundRun) -> None:
        steps = self.recover_steps
        model, teacher, cal, extra = state.model, state.unpruned, state.cal, state.extra
        assert teacher is not None  # kept whenever a round recovers
        if cal is None:
            raise HeadcutError(f"{label('recover_steps')} needs training data with labels ({label('data')})")
        config = self.finetune_config(state.config.seed)
        if extra is not None:
            cal = dataclasses.replace(cal, batches=cal.batches + extra.batches, examples=cal.examples + extra.examples)
            config = dataclasses.replace(config, alpha=1.0)
        bars = Bars(state.progress, "recovery", state.metric, train=f"recovery fine-tuning (distilled, {steps} steps)")
        move(model, state.device)
        move(teacher, state.device)
        try:
            recovered = finetuning.finetune(
                model,
                cal,
                config,
                teacher=teacher,
                eval_calibration=state.eval_cal,
                progress=lambda d, t: bars("train", d, t),
                eval_progress=lambda d, t: bars("eval", d, t),
                on_step=bars.on_step,
                dist=state.dist,
            )
        finally:
            bars.close()
        model.to("cpu")
        run.outputs[self.kind] = recovered
        run.metric = recovered.metric_after

    def finetune_config(self, seed: int) -> FinetuneConfig:
        """The recovery's :class:`FinetuneConfig`: ``finetune``'s defaults with the steps, the hidden-state weight
        and the averaging (> 0: a constant learning rate, and the weights at the end the mean over that fraction
        of the last steps); no resume checkpoints."""
        average = float(self.recover_average)
        averaged: dict[str, Any] = {"average_last": average, "schedule": "constant"} if average else {}
        return FinetuneConfig(
            max_steps=self.recover_steps,
            seed=seed,
            checkpoint_every=None,
            hidden_weight=float(self.recover_hidden_weight),
            **averaged,
        )

    def record(self, run: RoundRun, record: dict[str, Any]) -> None:
        recovered = run.outputs[self.kind]
        record["metric"]["after"] = recovered.metric_after
        record["recovery"] = {
            "steps": recovered.steps,
            "seconds": recovered.seconds,
            "history_summary": recovered.summary(),
        }

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        recovered = run.outputs.get(self.kind)
        if recovered is None:
            return
        report["recovery"] = {
            "steps": recovered.steps,
            "distilled_from": "the unpruned model",
            "config": recovered.config.to_json(),
            "seconds": recovered.seconds,
            "history_summary": recovered.summary(),
            "curve": recovered.history,
        }
        if state.extra is not None:
            report["recovery"]["recover_data"] = state.extra.to_json()
        if report.get("metric") is not None:
            report["metric"]["after_pruning"] = run.pruned_metric
