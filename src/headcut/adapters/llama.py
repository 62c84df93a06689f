"""Llama-style decoders with grouped-query attention: Llama, Qwen2, Mistral.

Layer ``i``: ``layers.{i}.self_attn.{q,k,v,o}_proj``; query head ``h`` reads KV head
``h // num_key_value_groups``. The forward infers head counts from the projection widths; only
``num_key_value_groups`` (used to repeat KV heads) must follow the cut.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, EmptyStyle, make_block


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = ("llama", "qwen2", "mistral")
    gqa = True

    def blocks(self, base: nn.Module) -> list[Block]:
        out = []
        for i, layer in enumerate(base.layers):
            p = f"layers.{i}.self_attn"
            out.append(make_block(
                base, f"self.{i}", "self", i, layer.self_attn.head_dim,
                attn=p, q=f"{p}.q_proj", k=f"{p}.k_proj", v=f"{p}.v_proj", o=f"{p}.o_proj",
            ))
        return out

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"num_key_value_groups": cut.groups}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="o_proj", cache=True)
