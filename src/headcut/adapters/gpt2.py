"""GPT-2 decoders.

Layer ``i`` (paths relative to ``GPT2Model``): ``h.{i}.attn.c_attn`` is ONE fused ``Conv1D``
(weight: in x out) whose output columns are ``q | k | v``, each ``num_heads * head_dim`` wide; the
output projection is ``h.{i}.attn.c_proj`` (``Conv1D``, a head is a block of ``head_dim`` input
rows). Head size: ``attn.head_dim`` (``n_embd // n_head``), unchanged by a cut.

Quirks:

* the forward splits the fused output with ``split(self.split_size, dim=2)``, so ``split_size``
  must become ``kept * head_dim`` (``num_heads`` is kept in step; ``embed_dim`` is the model width
  and stays). The attention scale is precomputed from ``head_dim`` and does not change.
* with zero heads ``split(0)`` raises, so the block gets the generic empty-attention mixin: it
  returns ``c_proj``'s bias (``GPT2Block`` unpacks ``(output, weights)``) and writes a one-column
  placeholder into the KV cache so cached positions stay right. ``Conv1D`` itself cannot take a
  zero-width input (it flattens with ``view(-1, 0)``), so the emptied ``c_proj`` also gets
  :class:`HeadcutEmptyConv1D`, which returns its bias for such an input.
* models with cross-attention (``add_cross_attention``) are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import (
    Adapter,
    Block,
    BlockCut,
    EmptyStyle,
    Stack,
    cols_op,
    mixin_op,
    rows_op,
    same_heads,
    set_op,
    stack_blocks,
)


class HeadcutEmptyConv1D:
    """Runtime mixin for a ``Conv1D`` projection (weight: in x out) whose input features were all
    removed: for a zero-width input it returns its bias (a sum over no inputs), where ``Conv1D``'s
    own forward fails to flatten the empty input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 0:
            return x.new_zeros(*x.shape[:-1], self.weight.shape[1]) + self.bias
        return super().forward(x)


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    stacks = (Stack(("n_layer",), "n_embd", "n_head"),)
    count_fields = ("n_inner", "vocab_size", "n_positions")
    optional_fields = {"n_inner": None}
    runtime_mixins = (HeadcutEmptyConv1D,)

    def blocks(self, base: nn.Module) -> list[Block]:
        qkv = "attn.c_attn"  # fused: q, k and v are thirds of one projection
        return stack_blocks(base, "h", attn="attn", q=qkv, k=qkv, v=qkv, o="attn.c_proj", head_dim="head_dim")

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        n = len(cut.q)
        return {"num_heads": n, "split_size": n * block.head_dim}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="c_proj", cache=True, outputs=2)

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        same_heads(cut, "GPT-2")
        q, d = list(cut.q), block.head_dim
        ops = [
            rows_op(block.q, q, d, sections=3),
            cols_op(block.o, q, d),
            set_op(block.attn, **self.head_attrs(block, cut)),
        ]
        if not q:
            ops.append(mixin_op(block.o, "HeadcutEmptyConv1D", {}))
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()))
        return ops

    def check_config(self, config: Any) -> None:
        if getattr(config, "add_cross_attention", False):
            raise ValueError("GPT-2 models with cross-attention (add_cross_attention) are not supported")
