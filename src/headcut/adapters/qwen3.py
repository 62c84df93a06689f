"""Qwen3 decoders: Llama's layout plus a per-head q/k RMSNorm.

``layers.{i}.self_attn.{q,k,v,o}_proj`` as in Llama; ``q_norm`` and ``k_norm`` are RMSNorms of width
``head_dim`` applied to every head alike (one weight shared by the heads), so a cut slices nothing of
them: each kept head is normalised exactly as before. Sliding-window layers (``layer_types``) only
change the mask.
"""

from __future__ import annotations

from .llama import LlamaAdapter


class Qwen3Adapter(LlamaAdapter):
    family = "qwen3"
    model_types = ("qwen3",)
    no_decilm = "per-head q/k RMSNorms (q_norm, k_norm), which DeciLM's Llama attention does not have"
