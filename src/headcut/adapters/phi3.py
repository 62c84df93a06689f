"""Phi-3 decoders: one fused ``qkv_proj`` with grouped-query attention.

Layer ``i``: ``layers.{i}.self_attn.qkv_proj`` (Linear) whose output rows are ``q | k | v``: ``heads *
head_dim`` query rows, then ``kv_heads * head_dim`` key rows, then as many value rows (the parts are
not of equal size under GQA, so the block's :class:`Rows` layout says where each starts); the output
projection is ``o_proj``. Numbered as heads of ``head_dim`` rows, the fused projection holds
``heads + 2 * kv_heads`` of them, so one ``rows`` op keeps query heads ``q``, key heads ``heads + kv``
and value heads ``heads + kv_heads + kv``.

Quirk: the forward finds the end of the query rows at ``self.config.num_attention_heads * head_dim``,
a count shared by every layer. A cut layer therefore gets :class:`HeadcutConfigHeads`, a per-module view
of the config with its own query-head count; ``num_key_value_heads`` (a module attribute) and
``num_key_value_groups`` follow the cut.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Block, BlockCut, EmptyStyle, Rows, cols_op, mixin_op, rows_op, set_op
from .llama import LlamaAdapter


class Phi3Adapter(LlamaAdapter):
    """Llama's config numbers and GQA; its own blocks and cut."""

    family = "phi3"
    model_types = ("phi3",)
    no_decilm = "its fused qkv_proj and gate_up_proj, which DeciLM's Llama blocks hold as separate projections"

    def blocks(self, base: nn.Module) -> list[Block]:
        out = []
        for i, layer in enumerate(base.layers):
            attn = layer.self_attn
            d = attn.head_dim
            heads = attn.o_proj.in_features // d
            kv = (attn.qkv_proj.out_features // d - heads) // 2
            qkv = f"layers.{i}.self_attn.qkv_proj"
            layout = (Rows(qkv), Rows(qkv, offset=heads * d), Rows(qkv, offset=(heads + kv) * d))
            out.append(
                Block(
                    name=f"self.{i}",
                    kind="self",
                    layer=i,
                    heads=heads,
                    kv_heads=kv,
                    head_dim=d,
                    attn=f"layers.{i}.self_attn",
                    q=qkv,
                    k=qkv,
                    v=qkv,
                    o=f"layers.{i}.self_attn.o_proj",
                    fused_qkv=True,
                    layout=layout,
                )
            )
        return out

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        h, kv = block.heads, block.kv_heads
        rows = list(cut.q) + [h + j for j in cut.kv] + [h + kv + j for j in cut.kv]
        ops = [
            rows_op(block.q, rows, block.head_dim),
            cols_op(block.o, list(cut.q), block.head_dim),
            set_op(block.attn, num_key_value_groups=cut.groups, num_key_value_heads=len(cut.kv)),
            mixin_op(block.attn, "HeadcutConfigHeads", {"_hc_heads": len(cut.q)}),
        ]
        if not cut.q:
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()))
        return ops

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="o_proj", cache=True)
