"""DistilBERT.

Layer ``i``: ``transformer.layer.{i}.attention.{q_lin,k_lin,v_lin}`` and the output projection
``transformer.layer.{i}.attention.out_lin``, all inside the attention module. Head size:
``attention.attention_head_size`` (``dim // n_heads``, fixed at construction). The forward infers
the head count from the projection width (``view(..., -1, attention_head_size)``); ``n_heads`` is
kept in step. The residual and ``sa_layer_norm`` follow outside the attention module, so a block
without heads returns ``out_lin``'s bias (and an empty attention map); no dropout follows
``out_lin`` inside the module.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, EmptyStyle, Stack, stack_blocks


class DistilBertAdapter(Adapter):
    family = "distilbert"
    model_types = ("distilbert",)
    stacks = (Stack(("n_layers",), "dim", "n_heads"),)
    count_fields = ("hidden_dim", "vocab_size", "max_position_embeddings")
    cached_kinds = ()

    def blocks(self, base: nn.Module) -> list[Block]:
        return stack_blocks(
            base,
            "transformer.layer",
            attn="attention",
            q="attention.q_lin",
            k="attention.k_lin",
            v="attention.v_lin",
            o="attention.out_lin",
            head_dim="attention_head_size",
        )

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"n_heads": len(cut.q)}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="out_lin")
