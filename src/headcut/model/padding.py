"""Zero query heads: a cut with the same KV heads but different query heads per KV group in different blocks,
padded to one count so that a stock config (one head count for every layer) holds it.

In grouped-query attention query head ``j`` of a block reads KV head ``j // group`` (``group``: the block's query
heads per KV head). A cut that keeps ``kv`` KV heads in every block but ``g_b`` query heads per KV head in block
``b`` (``--gqa uniform``; Gemma 3 270M's 4 query heads on 1 KV head cut to 1-4 per layer) is padded to
``G >= max_b g_b`` per KV head (:mod:`headcut.model.stock` takes the max, or more up to the uncut count where
the stock config refuses it): in every block, each KV head's real query heads, then ``G - g_b`` zero ones. A zero
head has zero rows in the query projection (and a zero query bias) and zero columns in the output projection:
its query is zero (a per-head q norm keeps it zero: RMSNorm of 0 is 0), so it attends uniformly, and its output
is multiplied by zero columns, so it adds nothing. The padded model computes exactly what the cut one does; the
K/V projections and the KV cache keep their savings, only the zero heads' q/o weights and compute come back.

:func:`padded_counts` says whether the blocks can be padded (and to what), :func:`pad_tensors` builds the new q
and o tensors (every other tensor stays the cut model's own); :mod:`headcut.model.stock` puts them into the stock
model and checks its outputs as for any stock form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters.base import Block


@dataclass(frozen=True)
class Padding:
    """What padding a cut to ``groups`` query heads per KV head costs: ``per_block`` the zero query heads added
    to each block that needed some, ``params`` the parameters they add (q rows, q bias, o columns)."""

    groups: int
    kv_heads: int
    per_block: dict[str, int] = field(default_factory=dict)
    params: int = 0

    @property
    def heads_added(self) -> int:
        return sum(self.per_block.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "query_heads_added": self.heads_added,
            "params_added": self.params,
            "query_heads_per_kv_head": self.groups,
            "kv_heads": self.kv_heads,
            "per_block": dict(self.per_block),
        }


def padded_counts(blocks: list[Block]) -> tuple[int, int, int] | None:
    """The (query heads, KV heads, head size) every block has once padded, where the blocks keep the same
    non-zero number of KV heads and the same head size (only their query heads per KV head differ); else None."""
    shapes = {(b.kv_heads, b.head_dim) for b in blocks}
    if len(shapes) != 1:
        return None
    kv_heads, head_dim = shapes.pop()
    if kv_heads == 0 or any(b.heads % b.kv_heads for b in blocks):
        return None
    groups = max(b.group_size for b in blocks)
    return groups * kv_heads, kv_heads, head_dim


def _linear(base: nn.Module, path: str) -> nn.Linear | None:
    try:
        mod = base.get_submodule(path)
    except AttributeError:
        return None
    return mod if isinstance(mod, nn.Linear) else None


def why_not_paddable(base: nn.Module, blocks: list[Block]) -> str | None:
    """Why the query heads of ``blocks`` cannot be padded (a fused or otherwise laid out q projection, a shared
    module, a projection that is not a Linear of the block's width), or None. Where the weights are on the meta
    device the caller must not pad: there is nothing to copy."""
    for b in blocks:
        if b.fused_qkv or b.layout is not None or b.shared is not None:
            return f"block {b.name}'s query projection is not a separate one"
        q, o = _linear(base, b.q), _linear(base, b.o)
        width = b.heads * b.head_dim
        if q is None or o is None or q.weight.shape[0] != width or o.weight.shape[1] != width:
            return f"block {b.name}'s q or o projection is not a Linear of its {b.heads} heads"
    return None


def _pad_heads(t: torch.Tensor, kv_heads: int, group: int, groups: int) -> torch.Tensor:
    """``t`` (first dimension: ``kv_heads`` groups of ``group`` heads, one after another) with each group padded
    to ``groups`` heads by zeros after its own."""
    parts = t.reshape(kv_heads, group, *t.shape[1:])
    out = t.new_zeros(kv_heads, groups, *t.shape[1:])
    out[:, :group] = parts
    return out.reshape(kv_heads * groups, *t.shape[1:])


def pad_tensors(model: nn.Module, blocks: list[Block], groups: int) -> tuple[dict[str, torch.Tensor], Padding]:
    """New q weights (and biases) and o weights of ``model``'s blocks padded to ``groups`` query heads per KV
    head, by their names in ``model.state_dict()``, and what the padding costs. Blocks already at ``groups``
    are left out (their tensors stay the model's own)."""
    base = model.base_model
    names = {id(m): n for n, m in model.named_modules()}
    tensors: dict[str, torch.Tensor] = {}
    per_block: dict[str, int] = {}
    params = 0
    kv_heads = blocks[0].kv_heads if blocks else 0
    for b in blocks:
        group, d = b.group_size, b.head_dim
        if group == groups:
            continue
        q, o = base.get_submodule(b.q), base.get_submodule(b.o)
        assert isinstance(q, nn.Linear) and isinstance(o, nn.Linear)
        with torch.no_grad():
            qname, oname = names[id(q)], names[id(o)]
            weight = q.weight.detach().reshape(b.heads, d, q.in_features)
            tensors[f"{qname}.weight"] = _pad_heads(weight, b.kv_heads, group, groups).reshape(-1, q.in_features)
            if q.bias is not None:
                bias = q.bias.detach().reshape(b.heads, d)
                tensors[f"{qname}.bias"] = _pad_heads(bias, b.kv_heads, group, groups).reshape(-1)
            cols = o.weight.detach().reshape(o.out_features, b.heads, d).transpose(0, 1)  # the heads are columns
            padded = _pad_heads(cols, b.kv_heads, group, groups).transpose(0, 1)
            tensors[f"{oname}.weight"] = padded.reshape(o.out_features, -1).contiguous()
        added = b.kv_heads * (groups - group)
        per_block[b.name] = added
        params += added * d * (q.in_features + (1 if q.bias is not None else 0) + o.out_features)
    return tensors, Padding(groups, kv_heads, per_block, params)


__all__ = ["Padding", "pad_tensors", "padded_counts", "why_not_paddable"]
