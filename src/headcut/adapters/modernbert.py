"""ModernBERT encoders: a fused ``Wqkv`` and alternating local / global attention.

Layer ``i``: ``layers.{i}.attn.Wqkv`` (Linear) whose rows are three equal sections ``q | k | v``
(the forward views the output as (..., 3, heads, head_dim)), so a cut keeps the same heads in each
section; the output projection is ``attn.Wo``, followed by ``attn.out_drop``. Local (sliding-window)
and global layers differ only in their mask; rotary embeddings act per head. The forward reads the
head count off the projection width. Unpadded (varlen) inputs under flash attention run the same
module on packed tokens: the per-head slices do not depend on how tokens are packed.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, EmptyStyle, Stack, cols_op, mixin_op, rows_op, same_heads, stack_blocks


class ModernBertAdapter(Adapter):
    family = "modernbert"
    model_types = ("modernbert",)
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads"),)
    count_fields = ("intermediate_size", "vocab_size", "max_position_embeddings")

    def blocks(self, base: nn.Module) -> list[Block]:
        qkv = "attn.Wqkv"  # fused: q, k and v are thirds of one projection
        return stack_blocks(base, "layers", attn="attn", q=qkv, k=qkv, v=qkv, o="attn.Wo", head_dim="head_dim")

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        same_heads(cut, "ModernBERT")
        q, d = list(cut.q), block.head_dim
        ops = [rows_op(block.q, q, d, sections=3), cols_op(block.o, q, d)]
        if not q:
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()))
        return ops

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="Wo", dropout="out_drop")
