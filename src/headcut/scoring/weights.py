"""Per-head slices of a block's projection weights (or of their gradients), family-agnostic.

A projection is an ``nn.Linear`` (weight: out x in) or a transposed one such as GPT-2's ``Conv1D``
(weight: in x out), told apart as in :func:`headcut.adapters.base.out_features`. Head ``h`` owns
``head_dim`` consecutive output features of the q, k and v projections (in each of the three
sections of a fused q|k|v projection) and the same input features of the output projection.
With grouped-query attention the k and v features are per KV head; query head ``h`` reads KV head
``h // group_size``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..adapters import Block


def out_major(mod: nn.Module, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (the module's weight or its gradient) as (out features, in features)."""
    return tensor if isinstance(mod, nn.Linear) else tensor.t()


def qkv_slots(block: Block) -> dict[str, tuple[str, int, int, int]]:
    """``"q"|"k"|"v"`` -> (module path, section, sections, heads in that projection)."""
    sections = 3 if block.fused_qkv else 1
    return {
        "q": (block.q, 0, sections, block.heads),
        "k": (block.k, 1 if block.fused_qkv else 0, sections, block.kv_heads),
        "v": (block.v, 2 if block.fused_qkv else 0, sections, block.kv_heads),
    }


def head_rows(
    mod: nn.Module, tensor: torch.Tensor, heads: int, head_dim: int, section: int = 0, sections: int = 1,
) -> torch.Tensor:
    """(heads, head_dim * in): each head's output-feature block of a q, k or v projection tensor."""
    t = out_major(mod, tensor)
    width = t.shape[0] // sections
    start = section * width
    return t[start:start + heads * head_dim].reshape(heads, head_dim * t.shape[1])


def head_cols(mod: nn.Module, tensor: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """(heads, head_dim * out): each head's input-feature block of the output projection tensor."""
    t = out_major(mod, tensor).t()  # (in, out): a head is head_dim consecutive rows
    return t[: heads * head_dim].reshape(heads, head_dim * t.shape[1])


def to_query_heads(block: Block, per_kv: torch.Tensor) -> torch.Tensor:
    """Expand a per-KV-head vector to the block's query heads (h reads KV head h // group_size)."""
    if block.heads == 0:
        return per_kv.new_zeros(0)
    index = torch.arange(block.heads, device=per_kv.device) // block.group_size
    return per_kv[index]


def block_rows(base: nn.Module, block: Block, part: str, tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Head blocks of the ``part`` (q, k or v) projection weight of ``block`` (or of ``tensor``, a
    tensor shaped like that weight, e.g. its gradient): (heads in that projection, head_dim * in)."""
    path, section, sections, count = qkv_slots(block)[part]
    mod = base.get_submodule(path)
    return head_rows(mod, mod.weight if tensor is None else tensor, count, block.head_dim, section, sections)
