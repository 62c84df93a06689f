"""Early stopping for the training loop (:class:`headcut.training.engine.Trainer`'s ``early_stopping``): the run
stops once the watched metric has not improved for ``patience`` evaluations in a row, and the best evaluation's
weights are put back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import HeadcutError


@dataclass
class EarlyStopping:
    """Stop when ``metric`` (a key of the evaluation's dict) has not improved for ``patience``
    evaluations in a row; keep a copy of the weights of the best evaluation and put it back at the
    end. :meth:`update` may also be called by the caller before training (step 0: the starting
    point then counts as a candidate, so a run that only makes things worse gives back the start)."""

    metric: str
    higher_is_better: bool
    patience: int
    best: float | None = None
    best_step: int | None = None
    evaluations: int = 0
    since_best: int = 0
    stopped_at: int | None = None
    _weights: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.patience, int) or self.patience < 1:
            raise HeadcutError(f"patience must be an integer >= 1, got {self.patience!r}")

    def update(self, model: nn.Module, step: int, metrics: dict[str, Any]) -> bool:
        """Record one evaluation at ``step``; True when the run should stop."""
        if self.metric not in metrics:
            raise HeadcutError(f"early stopping watches {self.metric!r}, which the evaluation does not give")
        value = float(metrics[self.metric])
        self.evaluations += 1
        improved = value == value and (
            self.best is None or (value > self.best if self.higher_is_better else value < self.best)
        )
        if improved:
            self.best, self.best_step, self.since_best = value, step, 0
            self._weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.since_best += 1
        if self.since_best >= self.patience:
            self.stopped_at = step
            return True
        return False

    def restore(self, model: nn.Module) -> bool:
        """Put the best evaluation's weights back; False if there was none."""
        if self._weights is None:
            return False
        model.load_state_dict(self._weights)
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "patience": self.patience,
            "best": self.best,
            "best_step": self.best_step,
            "evaluations": self.evaluations,
            "stopped_at": self.stopped_at,
        }
