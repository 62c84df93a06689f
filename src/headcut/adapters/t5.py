"""T5 encoder-decoders (and T5's encoder-only models).

Paths relative to ``model.base_model`` (``T5ForConditionalGeneration`` and ``T5EncoderModel`` are
their own base model; ``T5ForSequenceClassification`` wraps a ``T5Model`` as ``transformer``):

* encoder layer ``i``: ``encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}`` -> block ``encoder.{i}``;
* decoder layer ``i``: ``decoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}`` -> block ``decoder.{i}``;
* decoder layer ``i``: ``decoder.block.{i}.layer.1.EncDecAttention.{q,k,v,o}`` -> block ``cross.{i}``.

Blocks are listed encoder, decoder, cross (as for BART). Head size: ``d_kv`` (the module's
``key_value_proj_dim``), which need not be ``d_model / num_heads``. No projection has a bias.

Quirks:

* Relative position bias. Layer 0 of each stack owns ``relative_attention_bias`` (an embedding
  buckets x heads) and computes the bias for ALL heads; every later layer of the stack reuses it
  (``position_bias`` is passed along). Cross-attention has no learned bias: its layer 0 makes a
  zero bias of its own head count and passes that on. A cut block therefore gets
  :class:`HeadcutT5Attention`: it takes the kept heads' planes from the full bias, runs the original
  forward on them and passes the FULL bias on, so later layers (cut or not) still get every head.
  The bias embedding of layer 0 stays full width. Kept heads are stored as *original* indices, so
  a second cut composes with the first.
* The attention mask is separate from the bias in transformers 5 (``mask`` broadcasts over heads
  and is added next to ``position_bias``), so selecting bias planes is all a cut needs.
* A block without heads outputs zeros (``o`` has no bias), still computes and passes on the full
  bias when it is layer 0, and, for decoder self-attention, writes a cache placeholder.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import Adapter, Block, BlockCut, Stack, cols_op, mixin_op, rows_op, same_heads, set_op, stack_blocks
from .runtime import passed_cache, write_cache_placeholder

#: (block kind, layer stack, attention inside a T5Block), in block order
_ATTENTIONS = (
    ("encoder", "encoder.block", "layer.0.SelfAttention"),
    ("decoder", "decoder.block", "layer.0.SelfAttention"),
    ("cross", "decoder.block", "layer.1.EncDecAttention"),
)


class HeadcutT5Attention:
    """Runtime mixin for a T5 attention module that lost some (or all) of its heads.

    Attributes set by the op: ``_hc_heads`` (original indices of the kept heads, in order),
    ``_hc_total`` (heads of the full position bias, i.e. of the uncut model) and ``_hc_cache``
    (decoder self-attention: a headless module writes a cache placeholder)."""

    _hc_heads: list[int] | None = None
    _hc_total: int = 0
    _hc_cache: bool = False

    def _hc_select(self, bias: torch.Tensor) -> torch.Tensor:
        """The kept heads' planes of a full-width bias (a bias of another width is passed as is)."""
        if self._hc_heads is None or bias.shape[1] != self._hc_total:
            return bias
        return bias[:, self._hc_heads]

    def _hc_full_bias(self, query_length: int, key_length: int, like: torch.Tensor, past_seen: Any) -> torch.Tensor:
        """The bias of every original head, as the uncut module would make it."""
        if self.has_relative_attention_bias:
            return super().compute_bias(query_length, key_length, device=like.device, past_seen_tokens=past_seen)
        return torch.zeros((1, self._hc_total, query_length, key_length), device=like.device, dtype=like.dtype)

    def compute_bias(
        self, query_length: int, key_length: int, device: Any = None, past_seen_tokens: Any = 0
    ) -> torch.Tensor:
        return self._hc_select(super().compute_bias(query_length, key_length, device, past_seen_tokens))

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple:
        # the cache comes as ``cache`` (transformers >= 5.24) or ``past_key_values``; passed on as it came
        past_key_values = passed_cache(kwargs)
        batch, length = hidden_states.shape[0], hidden_states.shape[1]
        past_seen = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
        if isinstance(past_seen, torch.Tensor):
            past_seen = past_seen.clone()
        if self._hc_heads:
            selected = None if position_bias is None else self._hc_select(position_bias)
            out, used, weights = super().forward(
                hidden_states,
                mask=mask,
                key_value_states=key_value_states,
                position_bias=selected,
                **kwargs,
            )
            if position_bias is None:
                position_bias = self._hc_full_bias(used.shape[-2], used.shape[-1], used, past_seen)
            return out, position_bias, weights
        # no heads left: the output projection (no bias in T5) of an empty context is zero
        if key_value_states is not None:
            key_length = key_value_states.shape[1]
        elif mask is not None:
            key_length = mask.shape[-1]
        else:
            key_length = past_seen + length
        if self._hc_cache and key_value_states is None:
            write_cache_placeholder(self, past_key_values, length, hidden_states)
        if position_bias is None:
            position_bias = self._hc_full_bias(length, key_length, hidden_states, past_seen)
        out = self.o(hidden_states.new_zeros(batch, length, 0))
        weights = hidden_states.new_zeros(batch, 0, length, key_length)
        return out, position_bias, weights


class T5Adapter(Adapter):
    family = "t5"
    model_types = ("t5",)
    no_stock = (
        "every layer reuses layer 0's relative position bias per head, which a stock T5 config holds only "
        "for the same heads in every layer; headcut does not write that form yet"
    )
    stacks = (
        Stack(("num_layers",), "d_model", "num_heads", "d_kv", kind="encoder"),
        Stack(("num_decoder_layers",), "d_model", "num_heads", "d_kv", kind="decoder"),
    )
    count_fields = ("d_ff", "vocab_size", "relative_attention_num_buckets", "relative_attention_max_distance")
    optional_fields = {"num_decoder_layers": "num_layers"}
    runtime_mixins = (HeadcutT5Attention,)
    cached_kinds = ("decoder",)

    def blocks(self, base: nn.Module) -> list[Block]:
        out: list[Block] = []
        for kind, stack, attn in _ATTENTIONS:
            out += stack_blocks(
                base,
                stack,
                attn=attn,
                q=f"{attn}.q",
                k=f"{attn}.k",
                v=f"{attn}.v",
                o=f"{attn}.o",
                head_dim="key_value_proj_dim",
                kind=kind,
            )
        return out

    def built_stacks(self, cls_name: str) -> tuple[Stack, ...]:
        if cls_name.endswith(("EncoderModel", "ForTokenClassification")):  # the encoder alone
            return tuple(s for s in self.stacks if s.kind == "encoder")
        return self.stacks

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        n = len(cut.q)
        return {"n_heads": n, "inner_dim": n * block.head_dim}

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        same_heads(cut, "T5")
        attn = base.get_submodule(block.attn)
        # original indices of the current heads: stored by an earlier cut, else the identity
        current = getattr(attn, "_hc_heads", None)
        if current is None:
            current = list(range(block.heads))
        total = getattr(attn, "_hc_total", 0) or attn.config.num_heads
        q, d = list(cut.q), block.head_dim
        attrs = {
            "_hc_heads": [int(current[h]) for h in q],
            "_hc_total": int(total),
            "_hc_cache": block.kind in self.cached_kinds,
        }
        return [
            rows_op(block.q, q, d),
            rows_op(block.k, q, d),
            rows_op(block.v, q, d),
            cols_op(block.o, q, d),
            set_op(block.attn, **self.head_attrs(block, cut)),
            mixin_op(block.attn, "HeadcutT5Attention", attrs),
        ]
