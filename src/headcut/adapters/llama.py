"""Llama-style decoders with grouped-query attention: Llama, Qwen2, Mistral.

Layer ``i``: ``layers.{i}.self_attn.{q,k,v,o}_proj``; query head ``h`` reads KV head
``h // num_key_value_groups``. The forward infers head counts from the projection widths; only
``num_key_value_groups`` (used to repeat KV heads) must follow the cut.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, DecilmSpec, EmptyStyle, Stack, StockSpec, stack_blocks


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = ("llama", "qwen2", "mistral")
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads", "head_dim"),)
    count_fields = ("num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings")
    optional_fields = {"head_dim": None, "num_key_value_heads": "num_attention_heads"}
    multiples = (("num_attention_heads", "num_key_value_heads"),)
    gqa = True

    def blocks(self, base: nn.Module) -> list[Block]:
        return stack_blocks(
            base,
            "layers",
            attn="self_attn",
            q="self_attn.q_proj",
            k="self_attn.k_proj",
            v="self_attn.v_proj",
            o="self_attn.o_proj",
            head_dim="head_dim",
        )

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"num_key_value_groups": cut.groups}

    def stock_spec(self, model_type: str) -> StockSpec | None:
        # LlamaConfig refuses head counts that do not divide hidden_size even with head_dim set
        # (transformers #46082); Mistral's config holds Llama's weights under the same names and computes the
        # same thing when Llama's extras are off and the sliding window is off
        if model_type == "llama":
            return StockSpec(
                fallbacks=("mistral",),
                fallback_fields=(("attention_bias", False), ("mlp_bias", False), ("pretraining_tp", 1)),
                fallback_sets=(("sliding_window", None),),
            )
        return StockSpec()

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="o_proj", cache=True)

    no_decilm = "a sliding window (DeciLM's Llama attention attends to every position)"

    def decilm_spec(self, config: Any) -> DecilmSpec | None:
        # DeciLM's blocks are Llama's: Mistral's without a window; Qwen2's with q/k/v biases and none on o_proj
        # (vLLM's DeciLM reads ``qkv_bias`` for the first and ``attention_bias`` for the second)
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return None
        if config.model_type == "qwen2":
            return DecilmSpec(sets=(("qkv_bias", True), ("attention_bias", False)))
        return DecilmSpec()
