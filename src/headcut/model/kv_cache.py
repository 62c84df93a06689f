"""The KV cache a generating model holds, counted exactly from its layers (the currency of ``--kv-budget``).

One sequence of ``context`` tokens: each block holds keys and values of ``head_dim`` for every cached position
and KV head it keeps (the positions of a sliding or chunked layer capped by its window, as transformers'
dynamic cache keeps them), nothing where it reads another layer's keys and values, every KV head where other
layers read its own, and a linear-attention layer its fixed recurrent and convolution states per kept head.
What a layer holds is the adapter's (:meth:`headcut.adapters.Adapter.cache_costs`); this module adds it up for
the model as it is and for any mask, in values and in bytes of the model's own element size. A block without
heads holds nothing here (headcut's own runtime writes a one-value placeholder per position there, so that
transformers counts positions right; an engine loading a stock or DeciLM form holds none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..adapters import Block, CacheCost, adapter_for
from ..data.tasks import max_positions
from ..errors import HeadcutError, label, shown
from .masks import HeadMask, plan_cuts
from .surgery import model_blocks


def generates(model: nn.Module) -> str | None:
    """Why ``model`` has no KV cache to budget (None: it generates from a decoder-only stack)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "an encoder-decoder's cache also holds the source's keys and values, which the context does not set"
    can = getattr(model, "can_generate", None)
    if can is None or not can():
        return f"{type(model).__name__} does not generate text, so it keeps no KV cache"
    return None


@dataclass
class CacheAccount:
    """The cache of one sequence of ``context`` tokens: ``costs`` per cached block (the model's blocks in
    ``blocks``), ``element_bytes`` per value."""

    blocks: list[Block]
    costs: dict[str, CacheCost]
    context: int
    element_bytes: int

    def block_values(self, block: str, heads: int, kv_heads: int) -> int:
        """Values block ``block`` holds with ``heads`` query and ``kv_heads`` KV heads (0: not cached)."""
        cost = self.costs.get(block)
        return 0 if cost is None else cost.values(heads, kv_heads, self.context)

    def values(self, kept: Mapping[str, tuple[int, int]]) -> int:
        """Values the whole cache holds with ``kept[block] = (query heads, KV heads)``."""
        return sum(self.block_values(name, *kept[name]) for name in self.costs)

    def bytes(self, kept: Mapping[str, tuple[int, int]]) -> int:
        return self.values(kept) * self.element_bytes

    def current(self) -> dict[str, tuple[int, int]]:
        """Every block's heads as the model has them now."""
        return {b.name: (b.heads, b.kv_heads) for b in self.blocks}

    def kept(self, mask: HeadMask, gqa: str) -> dict[str, tuple[int, int]]:
        """The heads each block keeps under ``mask`` as ``--gqa gqa`` realises it (KV slots as written)."""
        cuts = plan_cuts(mask, self.blocks, gqa)
        return {name: (len(cut.q), len(cut.kv)) for name, cut in cuts.items()}

    def per_block(self, kept: Mapping[str, tuple[int, int]]) -> dict[str, int]:
        """Bytes per cached block."""
        return {name: self.block_values(name, *kept[name]) * self.element_bytes for name in self.costs}


def element_bytes(model: nn.Module) -> int:
    """Bytes of one cached value: the element size of the model's floating-point weights."""
    for p in model.parameters():
        if p.dtype.is_floating_point:
            return torch.empty((), dtype=p.dtype, device="meta").element_size()
    return 4


def check_context(model: nn.Module, context: int | None) -> None:
    """Refuse a ``context`` (a budget's ``--context``) longer than the positions ``model``'s config says it reads:
    the model cannot decode there, and the cache counted or timed there (:func:`cache_account` counts any length)
    would be one no run holds."""
    limit = max_positions(model.config.get_text_config())
    if context is not None and limit is not None and context > limit:
        raise HeadcutError(
            f"{label('context')} {shown(context)} is longer than the {limit:,} positions this model reads (its "
            f"config's maximum length): give {label('context')} {limit} at most"
        )


def cache_account(model: nn.Module, context: int | None = None) -> CacheAccount:
    """The cache account of ``model`` at ``context`` tokens (None: the longest its positions allow); a
    HeadcutError where the model keeps no cache or a layer's cache is not one headcut can count."""
    why = generates(model)
    if why is not None:
        raise HeadcutError(f"no KV cache to budget: {why}")
    if context is None:
        context = max_positions(model.config.get_text_config())
        if context is None:
            raise HeadcutError("the model's config gives no maximum length: give the context length (--context N)")
    if context < 1:
        raise HeadcutError(f"the context must be at least one token, not {context}")
    blocks = model_blocks(model)
    try:
        costs = adapter_for(model).cache_costs(model.base_model, blocks)
    except ValueError as exc:
        raise HeadcutError(f"cannot count the KV cache: {exc}") from None
    if not costs:
        raise HeadcutError("no KV cache to budget: the model has no block that caches keys and values")
    return CacheAccount(blocks=blocks, costs=costs, context=context, element_bytes=element_bytes(model))
