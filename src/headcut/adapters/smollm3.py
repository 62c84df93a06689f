"""SmolLM3 decoders: Llama's layout with layers that skip RoPE.

``config.no_rope_layers[i]`` (1: rotary, 0: none) is read by each attention module at build time and
is not a head count, so a cut leaves it alone: heads of RoPE and NoPE layers are cut alike.
"""

from __future__ import annotations

from .llama import LlamaAdapter


class SmolLM3Adapter(LlamaAdapter):
    family = "smollm3"
    model_types = ("smollm3",)
    no_decilm = (
        "layers that skip the rotary embedding (no_rope_layers), where DeciLM's Llama attention rotates every "
        "layer's queries and keys"
    )
