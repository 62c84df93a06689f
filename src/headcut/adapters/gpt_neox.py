"""GPT-NeoX / Pythia decoders: a fused ``query_key_value`` laid out head by head.

Layer ``i``: ``layers.{i}.attention.query_key_value`` (Linear, ``3 * hidden`` outputs) whose rows are
grouped per head: head ``h`` owns rows ``3*d*h .. 3*d*(h+1)``, its query, key and value (``d`` rows
each; the forward views the output as (..., heads, 3*d) and chunks the last axis). One ``rows`` op with
a head size of ``3*d`` keeps a head's q, k and v together. The output projection is ``attention.dense``;
the head size ``head_size`` and the partial rotary width (``rotary_ndims``) are per head and do not
change; the forward reads the head count off the projection width. No grouped-query attention.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, EmptyStyle, Rows, Stack, cols_op, mixin_op, rows_op, same_heads


class GPTNeoXAdapter(Adapter):
    family = "gpt-neox"
    model_types = ("gpt_neox",)
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads"),)
    count_fields = ("intermediate_size", "vocab_size", "max_position_embeddings")

    def blocks(self, base: nn.Module) -> list[Block]:
        out = []
        for i, layer in enumerate(base.layers):
            d = layer.attention.head_size
            qkv = f"layers.{i}.attention.query_key_value"
            heads = layer.attention.query_key_value.out_features // (3 * d)
            out.append(
                Block(
                    name=f"self.{i}",
                    kind="self",
                    layer=i,
                    heads=heads,
                    kv_heads=heads,
                    head_dim=d,
                    attn=f"layers.{i}.attention",
                    q=qkv,
                    k=qkv,
                    v=qkv,
                    o=f"layers.{i}.attention.dense",
                    fused_qkv=True,
                    layout=(Rows(qkv, 0, 3 * d), Rows(qkv, d, 3 * d), Rows(qkv, 2 * d, 3 * d)),
                )
            )
        return out

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        same_heads(cut, "GPT-NeoX")
        q, d = list(cut.q), block.head_dim
        ops = [rows_op(block.q, q, 3 * d), cols_op(block.o, q, d)]
        if not q:
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()))
        return ops

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="dense", cache=True)
