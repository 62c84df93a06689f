"""BART-style encoder-decoders: BART and Marian.

Paths relative to ``BartModel`` / ``MarianModel``:

* encoder layer ``i``: ``encoder.layers.{i}.self_attn.{q,k,v,out}_proj`` -> block ``encoder.{i}``
  (kind ``encoder``);
* decoder layer ``i``: ``decoder.layers.{i}.self_attn.{q,k,v,out}_proj`` -> block ``decoder.{i}``
  (kind ``decoder``, writes the self-attention KV cache);
* decoder layer ``i``: ``decoder.layers.{i}.encoder_attn.{q,k,v,out}_proj`` -> block ``cross.{i}``
  (kind ``cross``: keys and values come from the encoder output).

Blocks are listed in that order: all encoder blocks, then all decoder self-attention blocks, then
all cross-attention blocks. Head size: ``head_dim`` (``d_model // heads``), unchanged by a cut.

Quirks: separate ``nn.Linear`` projections with biases; the forward reshapes with
``view(..., -1, head_dim)`` so the head count follows the weights (``num_heads`` is kept in step).
A block without heads returns ``out_proj``'s bias (generic empty-attention mixin); only decoder
self-attention writes a placeholder into the cache, a headless cross-attention leaves the
cross-attention cache alone.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, Block, BlockCut, EmptyStyle, Stack, stack_blocks

#: (block kind, layer stack, attention inside a layer), in block order
_ATTENTIONS = (
    ("encoder", "encoder.layers", "self_attn"),
    ("decoder", "decoder.layers", "self_attn"),
    ("cross", "decoder.layers", "encoder_attn"),
)


class BartAdapter(Adapter):
    family = "bart"
    model_types = ("bart", "marian")
    stacks = (
        Stack(("encoder_layers",), "d_model", "encoder_attention_heads", kind="encoder"),
        Stack(("decoder_layers",), "d_model", "decoder_attention_heads", kind="decoder"),
    )
    count_fields = ("encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "decoder_vocab_size", "max_position_embeddings")
    optional_fields = {"decoder_vocab_size": "vocab_size"}
    cached_kinds = ("decoder",)

    def blocks(self, base: nn.Module) -> list[Block]:
        out: list[Block] = []
        for kind, stack, attn in _ATTENTIONS:
            out += stack_blocks(
                base,
                stack,
                attn=attn,
                q=f"{attn}.q_proj",
                k=f"{attn}.k_proj",
                v=f"{attn}.v_proj",
                o=f"{attn}.out_proj",
                head_dim="head_dim",
                kind=kind,
            )
        return out

    def built_stacks(self, cls_name: str) -> tuple[Stack, ...]:
        if cls_name.endswith("ForCausalLM"):  # the decoder alone
            return tuple(s for s in self.stacks if s.kind == "decoder")
        return self.stacks

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"num_heads": len(cut.q)}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="out_proj", cache=block.kind in self.cached_kinds, outputs=2)
