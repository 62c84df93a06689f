"""The building blocks of the learned-gate pruning methods (PASS, PASSCONC, DSP, STE, Voita, LAG).

Gate mathematics only: the Hard Concrete distribution (``hard_concrete``), PASS's sparsity
objectives and lambda schedule (``objectives``), DSP's Gumbel soft top-K, its temperature annealing
and the straight-through hard top-K (``relaxed_topk``). Nothing here is a pruning method yet.
"""

from .hard_concrete import HardConcrete
from .objectives import LambdaSchedule, l0_penalty, r_base, r_pass
from .relaxed_topk import (
    TemperatureSchedule,
    gumbel_noise,
    gumbel_soft_topk,
    hard_topk,
    soft_topk,
    straight_through_topk,
)

__all__ = [
    "HardConcrete",
    "LambdaSchedule",
    "TemperatureSchedule",
    "gumbel_noise",
    "gumbel_soft_topk",
    "hard_topk",
    "l0_penalty",
    "r_base",
    "r_pass",
    "soft_topk",
    "straight_through_topk",
]
