"""The output projections of attention blocks: each projection with the blocks that call it, and its weight read
and written as (out features, in features) whatever the module's layout."""

from __future__ import annotations

import torch
from torch import nn

from ..adapters.base import Block
from ..adapters.runtime import _is_transposed
from ..errors import HeadcutError


def weight_out_in(mod: nn.Module) -> torch.Tensor:
    """The projection's weight as (out features, in features)."""
    return mod.weight.t() if _is_transposed(mod) else mod.weight


def set_weight(mod: nn.Module, w_out_in: torch.Tensor, bias: torch.Tensor | None) -> None:
    with torch.no_grad():
        mod.weight.copy_((w_out_in.t() if _is_transposed(mod) else w_out_in).to(mod.weight.dtype))
        if bias is not None and getattr(mod, "bias", None) is not None:
            mod.bias.copy_(bias.to(mod.bias.dtype))


def output_projections(model: nn.Module, blocks: list[Block]) -> list[tuple[nn.Module, list[Block]]]:
    """The output projections of ``blocks`` with the blocks that call each (several where shared)."""
    base = model.base_model
    out: dict[int, tuple[nn.Module, list[Block]]] = {}
    for block in blocks:
        mod = base.get_submodule(block.o)
        if not hasattr(mod, "weight"):
            raise HeadcutError(f"the output projection {block.o!r} of block {block.name} has no weight")
        out.setdefault(id(mod), (mod, []))[1].append(block)
    return list(out.values())
