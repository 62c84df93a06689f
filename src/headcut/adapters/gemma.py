"""Gemma 2 and Gemma 3 text decoders.

Llama's projections (``layers.{i}.self_attn.{q,k,v,o}_proj``) with:

* Gemma 3's ``q_norm``/``k_norm``: RMSNorms of width ``head_dim`` shared by all heads (nothing to slice);
* the attention scale ``query_pre_attn_scalar ** -0.5`` and the attention-logit soft-capping (Gemma 2):
  per score, so independent of the head count;
* sliding-window and global layers (``layer_types``): a mask, not a head count;
* Gemma 3 270M has one KV head per layer: removing it removes every query head, and the layer becomes
  attention-free (its output projection has no bias, so it adds zero).
"""

from __future__ import annotations

from .llama import LlamaAdapter


class GemmaAdapter(LlamaAdapter):
    family = "gemma"
    model_types = ("gemma2", "gemma3_text")
    no_decilm = (
        "Gemma's blocks (scaled embeddings, 1 + w RMSNorms, norms after attention and MLP, a GELU MLP, Gemma 3's "
        "q/k norms, Gemma 2's soft-capping) are not DeciLM's Llama blocks"
    )
