"""``voita``: Voita et al.'s L0 head gates, DSP's joint baseline (paper 000, §4.2.2; PASS §4.1.2).

Each head has a Hard Concrete gate (beta 0.33, gamma -0.1, zeta 1.1) with log-alpha phi_h, sampled
every step. The relaxed L0 norm is the expected number of non-zero gates::

    L_C(phi) = sum_h (1 - P(g_h = 0 | phi_h))                           (eq. 22)
    R(theta, phi) = L(theta, phi) + lambda * L_C(phi)                   (eq. 23)

lambda (``--lambda``, default 0.0015: the reference README's MNLI value; the gate learning rate is
0.1, the model's 2e-5) only steers the sparsity indirectly, so the method keeps by its own rule the
heads whose deterministic gate exceeds 0.5, and the final mask is then "adjusted to the targeted
number by re-including heads with the highest gate values from the discarded ones, or excluding those
with the smallest gate values in the kept ones" (§4.3): the top-K heads by gate value (ties at a
saturated gate broken by phi). The report's ``moved_by_adjustment`` counts the heads that adjustment
re-included or excluded. Slots that stand for several heads (ALBERT, KV groups) count each head in
L_C.
"""

from __future__ import annotations

from typing import Any

import torch

from .gate_training import ConcreteLearner, Context, LearnedOptions, Slots

#: lambda of the reference README's MNLI run
DEFAULT_LAMBDA = 0.0015


class Voita(ConcreteLearner):
    name = "voita"
    summary = "learned: Hard Concrete gates with an L0 penalty (--lambda), adjusted to exactly K (Voita et al.)"
    ranking = "gate value (the deterministic gate, ordered as log alpha)"

    def __init__(self, slots: Slots, k: int, options: LearnedOptions, ctx: Context) -> None:
        super().__init__(slots, k, options, ctx)
        self.lam = DEFAULT_LAMBDA if options.lam is None else options.lam

    @staticmethod
    def default_gate_lr(task: str) -> float:
        return 0.1

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        weight = self.slots.weight.to(torch.float32)
        l0 = (weight * self.hc.prob_nonzero(self.phi)).sum()  # eq. 22
        return self.sample(), self.lam * l0, {"l0": l0.detach(), "lambda": self.lam}  # eq. 23

    def own_keep(self) -> torch.Tensor:
        return self.open_slots()

    def hyperparameters(self) -> dict[str, Any]:
        return {"lambda": self.lam, "gate_lr": self.options.gate_lr, "beta": self.hc.beta, "gamma": self.hc.gamma,
                "zeta": self.hc.zeta}
