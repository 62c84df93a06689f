"""Per-head slices of a block's projection weights (or of their gradients), family-agnostic.

A projection is an ``nn.Linear`` (weight: out x in) or a transposed one such as GPT-2's ``Conv1D``
(weight: in x out), told apart as in :func:`headcut.adapters.base.out_features`. Head ``h`` owns
``head_dim`` output features of the q, k and v projections (where: :meth:`Block.rows`) and the same
input features of the output projection.
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


def head_rows(
    mod: nn.Module,
    tensor: torch.Tensor,
    heads: int,
    head_dim: int,
    offset: int = 0,
    stride: int = 0,
    order: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """(heads, head_dim * in): each head's output-feature block of a q, k or v projection tensor; head
    ``h`` starts at row ``offset + order[h] * stride`` (``stride`` 0: ``head_dim``; no ``order``: h)."""
    t = out_major(mod, tensor)
    stride = stride or head_dim
    which = (
        torch.arange(heads, device=t.device)
        if order is None
        else torch.tensor(order, dtype=torch.long, device=t.device)
    )
    index = offset + which[:, None] * stride + torch.arange(head_dim, device=t.device)
    return t[index.reshape(-1)].reshape(heads, head_dim * t.shape[1])


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
    rows = block.rows(part)
    count = block.heads if part == "q" else block.kv_heads
    mod = base.get_submodule(rows.path)
    return head_rows(
        mod, mod.weight if tensor is None else tensor, count, block.head_dim, rows.offset, rows.stride, rows.order
    )
