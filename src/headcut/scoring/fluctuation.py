"""``fluctuation``: FLAP's weighted input feature variance (An et al., Fluctuation-based Adaptive Structured
Pruning for Large Language Models, AAAI 2024, arXiv:2312.11983, §3.2-3.3).

For the output projection W (d_out x d_in) of a block and its input X (the concatenated head outputs) over the
N real calibration tokens, every input channel j gets

    F_j = 1 / (N - 1) * sum_n (X_nj - mean_n X_nj)^2          (§3.2, the fluctuation: the sample variance)
    S_j = F_j * ||W[:, j]||_2^2                                (§3.2, WIFV: weighted by the column's norm)

The reference code squares S_j for the attention modules (``W_metric ** 2`` before the per-head pooling), then
standardises the metric of each layer over its channels (§3.3, "Standardization": ``(S - mean) / std``, the
unbiased std) so that layers can share one global budget, and pools a head's ``head_dim`` channels by their
mean: that is the head's score here, higher = more important (one number per query head; a GQA unit is the mean
of its query heads, as for every scorer). The paper's sample variance is computed exactly over every real token
(float64 sums); the reference code's running update skips its first sample, a difference of estimator only.

FLAP's bias compensation (§3.4: the removed channels' mean input folded into the projection's bias) is a
separate step of the cut (:mod:`headcut.model.compensation`, the method's ``bias_compensation`` option), not of
the scores; it reads the same moments (:meth:`Moments.mean`). Forward passes only, no gradients.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from ..errors import HeadcutError
from ..model.projections import output_projections, weight_out_in
from .attention_maps import real_queries
from .base import Batch, Progress, RawScores, ScoreConfig, Scorer, batch_size, calibration, model_device, scoring_mode


class Moments:
    """Float64 sums of one block's output-projection input over real tokens: count, sum and sum of squares."""

    def __init__(self, width: int) -> None:
        self.n = 0
        self.sum = torch.zeros(width, dtype=torch.float64)
        self.sq = torch.zeros(width, dtype=torch.float64)

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().double()
        self.n += x.shape[0]
        self.sum += x.sum(dim=0).cpu()
        self.sq += x.pow(2).sum(dim=0).cpu()

    def mean(self) -> torch.Tensor:
        """The mean input of each channel (FLAP's baseline, §3.4; 0 without tokens)."""
        return self.sum / self.n if self.n else torch.zeros_like(self.sum)

    def variance(self) -> torch.Tensor:
        """F_j of §3.2: the unbiased sample variance (0 with fewer than two tokens)."""
        if self.n < 2:
            return torch.zeros_like(self.sum)
        return ((self.sq - self.sum.pow(2) / self.n) / (self.n - 1)).clamp_min(0.0)


def head_scores(block: Block, variance: torch.Tensor, column_sq_norms: torch.Tensor) -> torch.Tensor:
    """One block's head scores from F_j and ||W[:, j]||^2: (F_j ||W_j||^2)^2, standardised over the block's
    channels (§3.3), the mean over each head's channels."""
    metric = (variance * column_sq_norms).pow(2)  # §3.2 WIFV, squared for attention as the reference code does
    if metric.numel() > 1:
        std = metric.std()
        metric = (metric - metric.mean()) / std if std > 0 else torch.zeros_like(metric)  # §3.3 standardisation
    return metric.reshape(block.heads, block.head_dim).mean(dim=1)


def input_moments(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    scorer: str,
    progress: Progress | None = None,
) -> tuple[dict[str, Moments], int]:
    """One forward per batch: the moments of every block's output-projection input over the real tokens
    (a projection shared by several blocks, ALBERT's, is called once per block, in order)."""
    live = [b for b in blocks if b.heads > 0]
    groups = output_projections(model, live)
    moments = {b.name: Moments(b.heads * b.head_dim) for b in live}
    current: dict[str, Any] = {}
    calls = {id(mod): 0 for mod, _ in groups}

    def hook_for(mod: nn.Module, members: list[Block]) -> Any:
        def hook(m: nn.Module, args: Any) -> None:
            i = calls[id(mod)]
            calls[id(mod)] += 1
            if i >= len(members):
                raise HeadcutError(
                    f"{scorer}: the output projection of {members[0].name} ran more often than it has "
                    "blocks in one forward"
                )
            block, x = members[i], args[0]
            real = real_queries(current, block.kind, x.shape[0], x.shape[1], x.device) if x.dim() == 3 else None
            rows = x[real] if real is not None else x.reshape(-1, x.shape[-1])
            moments[block.name].add(rows)

        return hook

    handles = [mod.register_forward_pre_hook(hook_for(mod, members)) for mod, members in groups]
    examples = 0
    try:
        with scoring_mode(model), torch.no_grad():
            for batch in calibration(batches, scorer, model_device(model), progress):
                current.clear()
                current.update(batch)
                for key in calls:
                    calls[key] = 0
                model(**batch)
                examples += batch_size(batch)
    finally:
        for handle in handles:
            handle.remove()
    return moments, examples


def fluctuation(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    moments, examples = input_moments(model, blocks, batches, "fluctuation", progress)
    return scores_from_moments(model, blocks, moments, examples)


def scores_from_moments(model: nn.Module, blocks: list[Block], moments: dict[str, Moments], examples: int) -> RawScores:
    """The scores of ``blocks`` from their output-projection inputs' moments (:func:`input_moments`)."""
    base = model.base_model
    out: dict[str, torch.Tensor] = {}
    for block in blocks:
        if block.heads == 0:
            out[block.name] = torch.zeros(0, dtype=torch.float64)
            continue
        columns = weight_out_in(base.get_submodule(block.o)).detach().double().pow(2).sum(dim=0).cpu()
        out[block.name] = head_scores(block, moments[block.name].variance(), columns)
    return RawScores(out, examples)


SCORER = Scorer(
    name="fluctuation",
    fn=fluctuation,
    needs_data=True,
    higher_is_important=True,
    within_block=True,  # §3.3's standardisation is over each layer's channels
)
