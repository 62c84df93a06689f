"""The ``choose`` stage: the method chooses the heads to keep on the model as the round finds it (scoring them, or
training gates), to the round's budget; the model itself is unchanged (the ``cut`` stage removes them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ....options import option
from ....pruning import plan_prune
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun


@dataclass
class Choose(PruneStage):
    """``method`` (a name of :data:`headcut.catalog.METHODS`; ``--method`` on the command line) and its own
    options (``options``: the method's options object, or a dict of them; checked by the request)."""

    kind: ClassVar[str] = "choose"
    summary: ClassVar[str] = "the method chooses the heads to keep (scoring them, or training gates)"

    method: str = option("gradient", cli=False, help="The method that chooses the heads (headcut methods).")
    method_options: Any = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Choose:
        return cls(method=str(options["method"]), method_options={k: v for k, v in options.items() if k != "method"})

    def options(self) -> dict[str, Any]:
        given = self.method_options
        if isinstance(given, Mapping) or given is None:
            return {"method": self.method, **dict(given or {})}
        from ....options import specs

        return {"method": self.method, **{s.name: getattr(given, s.name) for s in specs(type(given))}}

    def run(self, state: PruneState, run: RoundRun) -> None:
        method = state.config.method
        if run.index:  # the earlier round left the model on the CPU
            move(state.model, state.device)
        name = method if run.rounds == 1 else f"{method}, round {run.index + 1}"
        bars = Bars(state.progress, name, state.metric, train=state.train_label)
        try:
            result = plan_prune(
                state.model,
                state.cal,
                run.round.config,
                state.options,
                eval_calibration=state.eval_cal,
                progress=bars,
                on_step=bars.on_step,
                dist=state.dist,
                checked=True,  # the request's config and options (jobs/prune/request.py), checked there
                **state.training,
            )
        finally:
            bars.close()
        state.model.to("cpu")
        run.result = result
        run.pruned_metric = run.metric = result.metric_after
        training = result.training
        if training is not None:
            last_open = training.history[-1].get("open") if training.history else None
            if training.moved is None and last_open is not None and last_open != result.target:
                state.notes.append(
                    f"training ended with {last_open:g} heads open, not {result.target}: the gates had "
                    "not converged, so keeping the top heads changed the trained model; more steps "
                    "(--epochs, --max-steps) let them settle"
                )
            if training.moved is not None:
                state.notes.append(
                    f"{method} kept {training.own_kept:g} heads by its own rule (gate > 0.5); the "
                    f"adjustment to --keep {result.target} moved {training.moved} head(s)"
                )
