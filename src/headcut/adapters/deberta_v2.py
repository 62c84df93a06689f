"""DeBERTa-v2 and DeBERTa-v3 (``model_type`` ``deberta-v2``).

Layer ``i``: ``encoder.layer.{i}.attention.self.{query_proj,key_proj,value_proj}`` and the output
projection ``encoder.layer.{i}.attention.output.dense`` (outside the ``self`` module; dropout, the
residual and the LayerNorm follow in ``attention.output``). Head size:
``attention.self.attention_head_size`` (``config.attention_head_size`` or
``hidden_size // num_attention_heads``).

Quirks:

* The forward reshapes with ``self.num_attention_heads`` (``view(B, T, heads, -1)``), so that
  attribute must follow the cut; a stale count gives silently wrong outputs, not an error.
* Disentangled (relative) attention projects the shared relative embeddings per head. With
  ``share_att_key`` it reuses ``query_proj``/``key_proj`` (already cut); without it, ``c2p`` uses
  ``pos_key_proj`` and ``p2c`` uses ``pos_query_proj``, whose output rows are cut like q and k.
  ``encoder.rel_embeddings`` is hidden-size wide and stays whole.
* With zero heads the reshape raises, so the ``self`` module becomes a stub that returns an empty
  context (the output projection adds its bias) and an empty attention map, which is what
  ``DebertaV2Attention`` unpacks from ``self.self(...)``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, Stack, StockSpec, rows_op, stack_blocks


class DebertaV2Adapter(Adapter):
    family = "deberta-v2"
    model_types = ("deberta-v2",)
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads", "attention_head_size"),)
    count_fields = ("intermediate_size", "vocab_size", "max_position_embeddings")
    optional_fields = {"attention_head_size": None}
    cached_kinds = ()

    def blocks(self, base: nn.Module) -> list[Block]:
        return stack_blocks(
            base,
            "encoder.layer",
            attn="attention.self",
            q="attention.self.query_proj",
            k="attention.self.key_proj",
            v="attention.self.value_proj",
            o="attention.output.dense",
            head_dim="attention_head_size",
        )

    def stock_spec(self, model_type: str) -> StockSpec:
        return StockSpec(kv_heads=None, head_dim="attention_head_size")  # the modules read config.attention_head_size

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        n = len(cut.q)
        return {"num_attention_heads": n, "all_head_size": n * block.head_dim}

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        ops = super().cut_ops(base, block, cut)
        attn = base.get_submodule(block.attn)
        # present only for relative attention without share_att_key (c2p: key side, p2c: query side)
        extra = [
            rows_op(f"{block.attn}.{name}", list(heads), block.head_dim)
            for name, heads in (("pos_key_proj", cut.kv), ("pos_query_proj", cut.q))
            if isinstance(getattr(attn, name, None), nn.Module)
        ]
        return extra + ops
