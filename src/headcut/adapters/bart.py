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

from .base import Adapter, Block, BlockCut, EmptyStyle, make_block

#: (block kind, stack attribute, attention attribute, block name prefix), in block order
_ATTENTIONS = (
    ("encoder", "encoder", "self_attn", "encoder"),
    ("decoder", "decoder", "self_attn", "decoder"),
    ("cross", "decoder", "encoder_attn", "cross"),
)


class BartAdapter(Adapter):
    family = "bart"
    model_types = ("bart", "marian")
    cached_kinds = ("decoder",)

    def blocks(self, base: nn.Module) -> list[Block]:
        out = []
        for kind, stack_name, attn_name, prefix in _ATTENTIONS:
            stack = getattr(base, stack_name, None)
            if stack is None:
                continue
            for i, layer in enumerate(stack.layers):
                attn = getattr(layer, attn_name, None)
                if attn is None:
                    continue
                p = f"{stack_name}.layers.{i}.{attn_name}"
                out.append(make_block(
                    base, f"{prefix}.{i}", kind, i, attn.head_dim,
                    attn=p, q=f"{p}.q_proj", k=f"{p}.k_proj", v=f"{p}.v_proj", o=f"{p}.out_proj",
                ))
        return out

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        return {"num_heads": len(cut.q)}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="out_proj", cache=block.kind in self.cached_kinds, outputs=2)
