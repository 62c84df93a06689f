"""``magnitude``: weight-magnitude baseline (data-free).

Score of head h = sqrt(||W_Q^h||_F^2 + ||W_K^g||_F^2 + ||W_V^g||_F^2 + ||W_O^h||_F^2): the L2 norm
of every weight the head owns, i.e. its head_dim rows of the q, k and v projections (with
grouped-query attention the k and v rows of its KV group g = h // group_size) and its head_dim input
columns of the output projection. Biases are excluded. The calibration batches are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..adapters import Block
from .base import Batch, Progress, RawScores, ScoreConfig, Scorer
from .weights import block_rows, head_cols, to_query_heads


def magnitude(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    base = model.base_model
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for block in blocks:
            sq = block_rows(base, block, "q").float().pow(2).sum(dim=1)
            for part in ("k", "v"):
                sq = sq + to_query_heads(block, block_rows(base, block, part).float().pow(2).sum(dim=1))
            o = base.get_submodule(block.o)
            sq = sq + head_cols(o, o.weight, block.heads, block.head_dim).float().pow(2).sum(dim=1)
            out[block.name] = sq.sqrt()
    return RawScores(out, examples=0)


SCORER = Scorer(
    name="magnitude",
    fn=magnitude,
    needs_data=False,
    higher_is_important=True,
)
