"""Llama-style decoders with grouped-query attention: Llama, Qwen2, Mistral.

Layer ``i``: ``layers.{i}.self_attn.{q,k,v,o}_proj``; query head ``h`` reads KV head
``h // num_key_value_groups``. The forward infers head counts from the projection widths; only
``num_key_value_groups`` (used to repeat KV heads) must follow the cut.
"""

from __future__ import annotations

from typing import Any, ClassVar

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

    #: the model types whose KV heads :mod:`headcut.model.kv_merge` merges exactly
    kv_merge_types: ClassVar[tuple[str, ...]] = ("llama", "mistral", "qwen2")

    def kv_merge_refusal(self, config: Any) -> str | None:
        # Llama, Qwen2 and Mistral rotate whole heads in the rotate_half layout and do not normalise keys; a family
        # subclassing this adapter (SmolLM3: layers without RoPE; Qwen3, Gemma 3, OLMo 2: normed keys) is refused
        # unless listed
        if getattr(config, "model_type", None) not in self.kv_merge_types:
            return self.no_kv_merge
        rope = getattr(config, "rope_parameters", None) or {}
        partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
        if partial is not None and float(partial) != 1.0:
            return f"partial_rotary_factor {partial}: the merge aligns keys on whole rotated heads"
        return None

    #: why another family built on this adapter is not written as DeciLM (each sets its own reason)
    no_decilm = "its blocks are not Llama's"
    #: the model types whose blocks vLLM's DeciLM (Llama attention and MLP, ``nemotron_nas.py`` over
    #: ``llama.py``) computes exactly; a family subclassing this adapter is refused unless listed here
    decilm_types: ClassVar[tuple[str, ...]] = ("llama", "mistral", "qwen2")

    def decilm_spec(self, config: Any) -> DecilmSpec | None:
        # DeciLM's blocks are Llama's: Mistral's without a window; Qwen2's with q/k/v biases and none on o_proj
        # (vLLM's DeciLM reads ``qkv_bias`` for the first and ``attention_bias`` for the second). Fields the
        # family's modelling ignores but vLLM's DeciLM reads are set to what the family computes.
        if self._decilm_refusal(config) is not None:
            return None
        if config.model_type == "qwen2":
            return DecilmSpec(sets=(("qkv_bias", True), ("attention_bias", False), ("mlp_bias", False)))
        if config.model_type == "mistral":
            return DecilmSpec(sets=(("attention_bias", False), ("mlp_bias", False)))
        return DecilmSpec()

    def no_decilm_reason(self, config: Any) -> str:
        return self._decilm_refusal(config) or self.no_decilm

    def _decilm_refusal(self, config: Any) -> str | None:
        """Why vLLM's DeciLM would not compute what this model computes, or None: another family, a sliding
        window, another activation than SiLU, a RoPE that vLLM computes otherwise, a partial rotary."""
        if getattr(config, "model_type", None) not in self.decilm_types:
            return self.no_decilm
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        if window and (layer_types is None or "sliding_attention" in layer_types):
            return f"a sliding window of {window} (DeciLM's Llama attention attends to every position)"
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            return f"hidden_act {act!r} (vLLM's DeciLM MLP runs SiLU only)"
        rope = getattr(config, "rope_parameters", None) or {}
        kind = str(rope.get("rope_type", "default"))
        if kind not in DECILM_ROPE:
            why = ROPE_DIFFERS.get(kind, "not one whose vLLM rotary embedding is known to be transformers'")
            return f"rope_type {kind!r}: {why}"
        partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
        if partial is not None and float(partial) != 1.0:
            return (
                f"partial_rotary_factor {partial} (transformers' {config.model_type} rotates whole heads here, "
                "vLLM's DeciLM that part of them)"
            )
        return None


#: the RoPE types whose rotary embedding in vLLM's DeciLM (``get_rope`` on the config's ``rope_parameters``)
#: gives transformers' rotated queries and keys at every position the engine serves
DECILM_ROPE = ("default", "linear", "llama3", "yarn")
#: why the others differ
ROPE_DIFFERS = {
    "dynamic": (
        "transformers rescales its frequencies with the sequence past max_position_embeddings, vLLM's DeciLM keeps "
        "them fixed (its table ends there while it serves factor times longer)"
    ),
    "longrope": (
        "transformers picks the short or long factors by each sequence's length, vLLM by the engine's max_model_len"
    ),
}
