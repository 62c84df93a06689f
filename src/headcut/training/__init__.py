"""The training engine shared by the learned-gate pruning methods and fine-tuning (library only)."""

from .checkpoint import CHECKPOINT_NAME
from .early_stopping import EarlyStopping
from .engine import TrainConfig, Trainer
from .steps import TrainingDiverged, TrainResult, default_loss, lr_factor

__all__ = [
    "CHECKPOINT_NAME",
    "EarlyStopping",
    "TrainConfig",
    "TrainingDiverged",
    "TrainResult",
    "Trainer",
    "default_loss",
    "lr_factor",
]
