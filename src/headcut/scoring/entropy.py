"""``entropy``: epsilon-rectified attention entropy (Greedy-Gnorm, arXiv:2602.04491 sec. 2.2.1, 3.3 and
appendix C; the plain text lost the formulas, these follow the authors' reference code).

For one query row p (a probability vector over the keys), eq. 18 is the entropy
H(p) = -sum_j p_j log p_j. Where attention is diffuse over long inputs or degenerate (one-hot), p_j
underflows to 0 and 0 * log 0 gives NaN. Eqs. 19-20 rectify it with a small epsilon; the paper
adopts the variant that shifts the weights too (eq. 20 / eq. 24 of appendix C):

    H_eps(p) = -sum_j (p_j + eps) log(p_j + eps),   eps = 1e-7 (reference: ``e = 0.0000001``)

which is finite for every p (log(p_j + eps) >= log eps) and keeps the heads' order for small eps
(appendix C.2, eqs. 27-37). The sum runs over the real keys only (padded keys would each add the
constant -eps log eps and make the score depend on padding). As in the reference
(``.sum(dim=3).mean(dim=2)`` per sentence, then the mean over sentences), a head's score is the
mean over examples of the mean of H_eps over the example's real query tokens (eq. 3's expected AE).

Low entropy = focused head = important (``higher_is_important`` is False). Forward passes only.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..adapters import Block
from .attention_maps import for_each_map
from .base import Batch, Progress, RawScores, ScoreConfig, Scorer


def rectified_entropy(attn: torch.Tensor, epsilon: float, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """H_eps of every query row of ``attn`` (..., S): -sum_j (p_j + eps) log(p_j + eps) over the
    keys (only where ``key_mask``, broadcastable to ``attn``, is true). Computed in float32 at least."""
    p = attn.float() + epsilon if attn.dtype in (torch.float16, torch.bfloat16) else attn + epsilon
    terms = -p * torch.log(p)
    if key_mask is not None:
        terms = torch.where(key_mask, terms, 0.0)
    return terms.sum(dim=-1)


def entropy(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    eps = float(config.epsilon)
    sums = {b.name: torch.zeros(b.heads, dtype=torch.float64) for b in blocks}
    counts = {b.name: 0 for b in blocks}

    def add(block: Block, attn: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> None:
        h = rectified_entropy(attn, eps, key[:, None, None, :])  # (B, H, T)
        n = query.sum(dim=1)  # real queries per example
        per_example = torch.where(query[:, None, :], h, 0.0).sum(dim=2) / n.clamp(min=1)[:, None]  # (B, H)
        has = n > 0  # an example without real queries (e.g. no target tokens) is skipped
        sums[block.name] += per_example[has].sum(dim=0).double().cpu()
        counts[block.name] += int(has.sum())

    examples = for_each_map(model, blocks, batches, "entropy", progress, add)
    return RawScores({n: s / max(counts[n], 1) for n, s in sums.items()}, examples)


SCORER = Scorer(
    name="entropy",
    fn=entropy,
    needs_data=True,
    higher_is_important=False,
)
