"""``value-l1``: AUBER's state feature (Lee, Lee & Kang; AUBER, PLOS ONE 2021, "State representation").

Score of head h = ||W_V^h||_1 = sum_jk |W_V^h[j, k]|, the entry-wise L1 norm of the head's value
matrix (the head_dim rows of the v projection weight that belong to it; bias excluded). Theorem 1
(eqs. 5-19): ||O_h||_1 <= C ||W_V^h||_1 with C = N ||E_V||_1 the same for every head of a layer, so
the value matrix's L1 norm bounds the head's output. With grouped-query attention a head's value
matrix is its KV group's (every head of a group gets the group's norm).

AUBER then standardises the norms of a layer and applies a softmax to build the DQN state; that is
monotone within a layer and not applied here (use ``normalize="layer"`` to compare layers).
Data-free: the calibration batches are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..adapters import Block
from .base import Batch, Progress, RawScores, ScoreConfig, Scorer
from .weights import block_rows, to_query_heads


def value_l1(
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
            per_kv = block_rows(base, block, "v").float().abs().sum(dim=1)  # ||W_V^g||_1 per KV head
            out[block.name] = to_query_heads(block, per_kv)
    return RawScores(out, examples=0)


SCORER = Scorer(
    name="value-l1",
    fn=value_l1,
    needs_data=False,
    higher_is_important=True,
)
