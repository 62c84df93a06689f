"""What the training loop (:class:`headcut.training.engine.Trainer`) calls and gives back, step by step: the
signatures of its hooks, the default loss, the learning-rate factor of each step, how a step's micro-batch logs
are merged, the result of a run and the error of a run that diverged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import HeadcutError

LossFn = Callable[[nn.Module, dict[str, Any], int], tuple[torch.Tensor, dict[str, Any]]]
EvalFn = Callable[[int], dict[str, Any]]
ProgressFn = Callable[[int, "int | None"], None]
AfterStepFn = Callable[[int], "dict[str, Any] | None"]
StepFn = Callable[[dict[str, Any]], None]


class TrainingDiverged(HeadcutError):
    """A run whose loss, gradients or weights became non-finite (nan or inf). ``step``: the optimizer step
    (1-based) it happened at; ``checkpoint``: the folder keeping the last good resume checkpoint, or None
    when none was written."""

    def __init__(self, message: str, step: int, checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.checkpoint = checkpoint


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """The LR multiplier of optimizer step ``step`` (1-based) of ``total``.

    Warmup: ``step / warmup`` for ``step <= warmup`` (the full LR at the warmup's last step). Then
    ``constant``: 1; ``linear``: ``(total - step + 1) / (total - warmup)``, from 1 at the first step
    after warmup down to ``1 / (total - warmup)`` at the last step (0 would be the step after it).
    """
    if step <= warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    return max(0.0, (total - step + 1) / max(1, total - warmup))


@dataclass
class TrainResult:
    """``steps``: optimizer steps done (in all, counting those before a resume); ``history``: one dict
    per step; ``seconds``: wall time of this call to :meth:`.engine.Trainer.train`."""

    steps: int
    history: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def default_loss(model: nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The model's own loss (``model(**batch).loss``; the batch carries ``labels``)."""
    out = model(**batch)
    loss = getattr(out, "loss", None)
    if loss is None:
        raise HeadcutError("the model returned no loss: the batches need labels, or give a loss_fn")
    return loss, {}


def merge_logs(logs: list[dict[str, Any]]) -> dict[str, Any]:
    """Numbers averaged over the micro-batches of a step; anything else: the last micro-batch's value."""
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(k for entry in logs for k in entry):
        values = [entry[key] for entry in logs if key in entry]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = sum(values) / len(values)
        else:
            merged[key] = values[-1]
    return merged
