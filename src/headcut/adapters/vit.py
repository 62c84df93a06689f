"""ViT (transformers 5 layout).

Layer ``i`` of the ``ViTModel`` (``model.base_model``): ``layers.{i}.attention.{q,k,v}_proj`` and
the output projection ``layers.{i}.attention.o_proj``, all inside the attention module. Head size:
``attention.head_dim`` (``config.head_dim`` or ``hidden_size // num_attention_heads``). The forward
infers the head count from the projection width (``view(..., -1, head_dim)``);
``num_attention_heads`` is kept in step. q/k/v may have no bias (``qkv_bias=False``). The residual,
dropout and norms follow outside the attention module (pre-norm), so a block without heads returns
``o_proj``'s bias and an empty attention map.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, EmptyStyle, Stack, stack_blocks


class ViTAdapter(Adapter):
    family = "vit"
    model_types = ("vit",)
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads", "head_dim"),)
    count_fields = ("intermediate_size", "num_channels")
    optional_fields = {"head_dim": None}
    cached_kinds = ()

    def blocks(self, base: nn.Module) -> list[Block]:
        return stack_blocks(
            base,
            "layers",
            attn="attention",
            q="attention.q_proj",
            k="attention.k_proj",
            v="attention.v_proj",
            o="attention.o_proj",
            head_dim="head_dim",
        )

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"num_attention_heads": len(cut.q)}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="o_proj")
