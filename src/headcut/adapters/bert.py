"""BERT-style encoders: BERT, RoBERTa, XLM-RoBERTa, ELECTRA.

Layer ``i``: ``encoder.layer.{i}.attention.self.{query,key,value}`` and the output projection
``encoder.layer.{i}.attention.output.dense`` (outside the ``self`` module, so a block without heads
just returns an empty context and the projection adds its bias). The forward infers the head count
from the projection width (``view(..., -1, head_size)``); the count attributes are kept in step.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, Stack, stack_blocks


class BertAdapter(Adapter):
    family = "bert"
    model_types = ("bert", "roberta", "xlm-roberta", "electra")
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads"),)
    count_fields = ("intermediate_size", "vocab_size", "max_position_embeddings", "embedding_size")

    def blocks(self, base: nn.Module) -> list[Block]:
        return stack_blocks(
            base,
            "encoder.layer",
            attn="attention.self",
            q="attention.self.query",
            k="attention.self.key",
            v="attention.self.value",
            o="attention.output.dense",
            head_dim="attention_head_size",
        )

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        n = len(cut.q)
        return {"num_attention_heads": n, "all_head_size": n * block.head_dim}

    def check_config(self, config: Any) -> None:
        if getattr(config, "add_cross_attention", False):
            raise ValueError("BERT-style models with cross-attention are not supported")
