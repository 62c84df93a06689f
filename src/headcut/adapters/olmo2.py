"""OLMo 2 decoders: q and k RMSNorms that span every head.

Layer ``i``: ``layers.{i}.self_attn.{q,k,v,o}_proj`` as in Llama, but ``q_norm`` normalises the whole
query projection output (width ``heads * head_dim``) and ``k_norm`` the whole key output, *before* the
split into heads:

    q = RMSNorm(W_q x) = W_q x / rms(W_q x) * g,    rms(y) = sqrt(mean_j y_j^2 + eps)

The mean runs over every head, so a kept head's normalised query depends on the removed heads' rows of
``W_q``: slicing ``q_proj`` would change it. The exact form used here keeps ``q_proj`` and ``k_proj``
whole and drops the removed heads *after* the norms (:class:`HeadcutNormThenSelect` on ``q_norm`` and
``k_norm``), while ``v_proj`` loses its rows and ``o_proj`` its columns as in Llama. What is saved: the
attention itself (scores, softmax, values) of the removed heads, the key/value cache of removed KV
heads, and the v and o projections' weights; what is not: the q and k projection weights and their
cost (``notes`` says how many values). A layer without heads loses its q and k rows too (no norm runs:
the empty-attention mixin replaces the forward).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import Block, BlockCut, EmptyStyle, Rows, cols_op, mixin_op, rows_op, set_op
from .llama import LlamaAdapter


class HeadcutNormThenSelect:
    """Runtime mixin for a norm over all heads whose output keeps only some heads: the norm runs on the
    full width, then head ``_hc_heads[i]`` (``_hc_head_dim`` features) becomes head ``i``."""

    _hc_heads: list[int] = []
    _hc_head_dim: int = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        d = self._hc_head_dim
        heads = torch.tensor(self._hc_heads, dtype=torch.long, device=out.device)
        index = (heads[:, None] * d + torch.arange(d, device=out.device)).reshape(-1)
        return out.index_select(-1, index)


def _selected(norm: nn.Module) -> list[int] | None:
    heads = getattr(norm, "_hc_heads", None)
    return list(heads) if isinstance(norm, HeadcutNormThenSelect) else None


class Olmo2Adapter(LlamaAdapter):
    """Llama's config numbers and GQA; its own blocks and cut."""

    family = "olmo2"
    model_types = ("olmo2",)
    no_decilm = (
        "its q/k RMSNorms over all heads and its norms after attention and MLP, which DeciLM's Llama blocks do not have"
    )
    no_stock = (
        "its q/k norms run over all heads, so the cut keeps every q_proj/k_proj row, which a stock config "
        "cannot describe"
    )
    runtime_mixins = (HeadcutNormThenSelect,)

    def stock_spec(self, model_type: str) -> None:
        return None

    def blocks(self, base: nn.Module) -> list[Block]:
        out = []
        for i, layer in enumerate(base.layers):
            attn = layer.self_attn
            d = attn.head_dim
            p = f"layers.{i}.self_attn"
            q_order, k_order = _selected(attn.q_norm), _selected(attn.k_norm)
            out.append(
                Block(
                    name=f"self.{i}",
                    kind="self",
                    layer=i,
                    heads=attn.o_proj.in_features // d,
                    kv_heads=attn.v_proj.out_features // d,
                    head_dim=d,
                    attn=p,
                    q=f"{p}.q_proj",
                    k=f"{p}.k_proj",
                    v=f"{p}.v_proj",
                    o=f"{p}.o_proj",
                    layout=(
                        Rows(f"{p}.q_proj", order=None if q_order is None else tuple(q_order)),
                        Rows(f"{p}.k_proj", order=None if k_order is None else tuple(k_order)),
                        Rows(f"{p}.v_proj"),
                    ),
                )
            )
        return out

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        d = block.head_dim
        if not cut.q:  # no attention runs at all: the q and k rows can go too
            return [
                rows_op(block.q, [], d),
                rows_op(block.k, [], d),
                rows_op(block.v, [], d),
                cols_op(block.o, [], d),
                set_op(block.attn, num_key_value_groups=cut.groups),
                mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()),
            ]
        attn = base.get_submodule(block.attn)
        # the norms' current selections (a model cut before) compose with this cut
        q_now = _selected(attn.q_norm) or list(range(block.heads))
        k_now = _selected(attn.k_norm) or list(range(block.kv_heads))
        ops = [
            mixin_op(
                f"{block.attn}.q_norm",
                "HeadcutNormThenSelect",
                {"_hc_heads": [q_now[h] for h in cut.q], "_hc_head_dim": d},
            ),
            mixin_op(
                f"{block.attn}.k_norm",
                "HeadcutNormThenSelect",
                {"_hc_heads": [k_now[h] for h in cut.kv], "_hc_head_dim": d},
            ),
            rows_op(block.v, list(cut.kv), d),
            cols_op(block.o, list(cut.q), d),
            set_op(block.attn, num_key_value_groups=cut.groups),
        ]
        return ops

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="o_proj", cache=True)

    def notes(self, base: nn.Module, blocks: list[Block]) -> list[str]:
        kept = 0  # values of q_proj / k_proj rows whose heads the block no longer uses
        for b in blocks:
            attn = base.get_submodule(b.attn)
            for proj, norm, count in ((attn.q_proj, attn.q_norm, b.heads), (attn.k_proj, attn.k_norm, b.kv_heads)):
                held = proj.out_features // b.head_dim
                used = len(set(_selected(norm) or range(held))) if count else 0
                kept += (held - used) * b.head_dim * proj.in_features
        if not kept:
            return []
        return [
            f"OLMo 2 normalises q and k over all heads together: q_proj and k_proj keep the rows of removed "
            f"heads ({kept:,} values) so the kept heads are normalised exactly as before; the attention, the "
            "KV cache and the v/o projections of removed heads are gone"
        ]
