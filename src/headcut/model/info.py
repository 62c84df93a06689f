"""``headcut info``: the attention blocks of a model and its size."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..adapters import Block, adapter_for
from .surgery import count_params


@dataclass
class ModelInfo:
    """Blocks (in a stable order), head totals and parameter count of a model."""

    family: str
    model_type: str
    architecture: str
    blocks: list[Block] = field(default_factory=list)
    params: int = 0
    cut: bool = False
    #: how the family is cut where that is not plain slicing (parts kept whole, blocks not prunable)
    notes: list[str] = field(default_factory=list)

    @property
    def total_heads(self) -> int:
        return sum(b.heads for b in self.blocks)

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "model_type": self.model_type,
            "architecture": self.architecture,
            "blocks": [b.to_json() for b in self.blocks],
            "total_heads": self.total_heads,
            "params": self.params,
            "slimmed": self.cut,
            "notes": self.notes,
        }


def info(model: nn.Module) -> ModelInfo:
    """Describe ``model``'s attention blocks as they are now."""
    adapter = adapter_for(model)
    arch = type(model).__name__.removeprefix("Headcut")
    blocks = adapter.blocks(model.base_model)
    return ModelInfo(
        family=adapter.family,
        model_type=model.config.model_type,
        architecture=arch,
        blocks=blocks,
        params=count_params(model),
        cut=bool(getattr(model.config, "headcut", None)),
        notes=adapter.notes(model.base_model, blocks),
    )
