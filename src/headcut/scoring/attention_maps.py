"""Attention maps per block, for the attention scorers (confidence, entropy).

The model runs with eager attention (the only implementation that returns maps) and
``output_attentions=True``; the previous implementation is restored afterwards, also on error. The
returned tuples are mapped to blocks by kind, in layer order:

* ``self``    <- ``outputs.attentions``
* ``encoder`` <- ``outputs.encoder_attentions`` (``outputs.attentions`` for encoder-only stacks of
  encoder-decoder families, e.g. a T5 encoder model)
* ``decoder`` <- ``outputs.decoder_attentions``
* ``cross``   <- ``outputs.cross_attentions``

Every map is (B, heads, T queries, S keys); a block without heads gives (B, 0, ., .).

Only real query tokens count: ``attention_mask`` for self/encoder queries; for decoder self- and
cross-attention queries ``decoder_attention_mask`` if the batch has one, else ``labels != -100``
when the labels are per decoder token, else every decoder query. The same masks mark the real keys
(keys of self/encoder/cross attention are the input tokens, keys of decoder self-attention the
decoder tokens); padded keys already get ~0 weight from the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from ..errors import HeadcutError
from .base import Batch, Progress, batch_size, calibration, model_device, scoring_mode

#: block kind -> output fields holding its maps (first present and non-empty wins)
FIELDS: dict[str, tuple[str, ...]] = {
    "self": ("attentions",),
    "encoder": ("encoder_attentions", "attentions"),
    "decoder": ("decoder_attentions",),
    "cross": ("cross_attentions",),
}

#: ``fn(block, attention (B, H, T, S) float32, query mask (B, T) bool, key mask (B, S) bool)``
MapFn = Callable[[Block, torch.Tensor, torch.Tensor, torch.Tensor], None]


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Switch ``model`` to eager attention for the block; restore the previous one afterwards."""
    previous = getattr(model.config, "_attn_implementation", None)
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if previous is not None and getattr(model.config, "_attn_implementation", None) != previous:
            model.set_attn_implementation(previous)


def maps_by_block(out: Any, blocks: list[Block]) -> dict[str, torch.Tensor]:
    """Map the attention tuples of a forward's output to block names (by kind, in layer order)."""
    by_kind: dict[str, list[Block]] = {}
    for block in blocks:
        by_kind.setdefault(block.kind, []).append(block)
    maps: dict[str, torch.Tensor] = {}
    for kind, kind_blocks in by_kind.items():
        kind_blocks = sorted(kind_blocks, key=lambda b: b.layer)
        found: tuple | None = None
        for name in FIELDS[kind]:
            value = getattr(out, name, None)
            if value:
                found = tuple(value)
                break
        if found is None or len(found) != len(kind_blocks):
            got = 0 if found is None else len(found)
            raise HeadcutError(
                f"the model returned {got} attention maps for its {len(kind_blocks)} {kind} blocks under eager "
                "attention with output_attentions=True; attention scorers cannot read this model"
            )
        for block, attn in zip(kind_blocks, found):
            if attn is None or attn.dim() != 4 or attn.shape[1] != block.heads:
                shape = None if attn is None else tuple(attn.shape)
                raise HeadcutError(
                    f"attention map of block {block.name} has shape {shape}, expected (B, {block.heads}, T, S)"
                )
            maps[block.name] = attn
    return maps


def _fit(mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and tuple(mask.shape) == (batch, length):
        return mask.to(device) != 0
    return torch.ones(batch, length, dtype=torch.bool, device=device)


def decoder_mask(batch: Batch) -> torch.Tensor | None:
    """Real decoder tokens: ``decoder_attention_mask``, else ``labels != -100`` (token labels)."""
    mask = batch.get("decoder_attention_mask")
    if isinstance(mask, torch.Tensor):
        return mask
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() == 2 and not labels.is_floating_point():
        return labels != -100
    return None


def real_queries(batch: Batch, kind: str, size: int, length: int, device: torch.device) -> torch.Tensor:
    """(B, T) real query tokens of a block of ``kind``: the decoder's for decoder and cross blocks, else the
    attention mask (every position when no mask fits)."""
    mask = decoder_mask(batch) if kind in ("decoder", "cross") else batch.get("attention_mask")
    return _fit(mask, size, length, device)


def query_key_masks(batch: Batch, kind: str, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) real queries and (B, S) real keys of an attention map of a block of ``kind``."""
    b, _, t, s = attn.shape
    query = real_queries(batch, kind, b, t, attn.device)
    key = _fit(decoder_mask(batch) if kind == "decoder" else batch.get("attention_mask"), b, s, attn.device)
    return query, key


def for_each_map(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    scorer: str,
    progress: Progress | None,
    fn: MapFn,
) -> int:
    """One forward per calibration batch (eval mode, eager attention, no gradients); call ``fn``
    for every block's map. Returns the number of examples seen."""
    mapless = [b for b in blocks if b.mixer != "attention"]
    if mapless:  # no softmax, no map: confidence and entropy are undefined there
        names = ", ".join(b.name for b in mapless[:4]) + (", ..." if len(mapless) > 4 else "")
        raise HeadcutError(
            f"{scorer} reads attention maps, and blocks {names} are {mapless[0].mixer} without any; "
            "score this model with gradient, gnorm, value-l1, magnitude or random"
        )
    examples = 0
    with scoring_mode(model), eager_attention(model), torch.no_grad():
        for batch in calibration(batches, scorer, model_device(model), progress):
            kwargs = dict(batch)
            kwargs["output_attentions"] = True
            out = model(**kwargs)
            maps = maps_by_block(out, blocks)
            for block in blocks:
                attn = maps[block.name].float()
                query, key = query_key_masks(batch, block.kind, attn)
                fn(block, attn, query, key)
            examples += batch_size(batch)
    return examples
