"""``confidence``: attention confidence (Voita et al. 2019; Behnke & Heafield, EMNLP 2020, §4.2
"Attention confidence").

    confidence = max_s attention(s)

the largest weight a head's softmax assigns for one query token, "averaged over all times the head
appears": the mean over every real (non-pad) query token of the calibration set (token-weighted,
not per example). Padded keys get ~0 weight, so they never hold the maximum. A confident head
(high score) is important. Forward passes only, with eager attention maps.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..adapters import Block
from .attention_maps import for_each_map
from .base import Batch, Progress, RawScores, ScoreConfig, Scorer


def confidence(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    sums = {b.name: torch.zeros(b.heads, dtype=torch.float64) for b in blocks}
    counts = {b.name: 0 for b in blocks}

    def add(block: Block, attn: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> None:
        top = attn.amax(dim=-1)  # (B, H, T): max_s attention(s) per query
        real = query[:, None, :]
        # torch.where, not a product: rows of padded queries may be NaN in some models
        sums[block.name] += torch.where(real, top, 0.0).sum(dim=(0, 2)).double().cpu()
        counts[block.name] += int(query.sum())

    examples = for_each_map(model, blocks, batches, "confidence", progress, add)
    return RawScores({n: s / max(counts[n], 1) for n, s in sums.items()}, examples)


SCORER = Scorer(
    name="confidence",
    fn=confidence,
    needs_data=True,
    higher_is_important=True,
)
