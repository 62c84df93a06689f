"""``lag``: the Lagrangian-multiplier baseline of PASS (PASS, TMLR 2024, §4.1.2; after Wang et al. 2020 and
Xia et al. 2022).

Hard Concrete gates (as PASS) sampled every step; the expected sparsity of the deterministic gates::

    z_hat_i = min(1, max(0, sigmoid(phi_i) (zeta - gamma) + gamma))
    s_hat = 1/|H| sum_i (1 - z_hat_i)

is tied to the target s = 1 - K/|H| by::

    R_lag = lambda_1 (s_hat - s) + lambda_2 (s_hat - s)^2

``--sparsity-warmup N`` (default 0: the paper's fixed target) raises the target linearly from 0 to s over
the first N steps, s_t = s min(1, t / N), as CoFi (Xia et al. 2022, §3.3, after Wang et al. 2020) trains
this Lagrangian, so the model is not asked for the whole sparsity before it adapts.

with lambda_1, lambda_2 trainable and "optimized jointly in training": they start at 0 and take
gradient *ascent* steps (the saddle point of a Lagrangian; their gradients are negated, so the shared
AdamW step raises the penalty while the target is missed), at the gates' learning rate. The paper
gives no learning rates for LAG; PASS's (0.5 BERT, 0.2 sequence-to-sequence) are used. Sparsity is
met only in expectation; the final mask is the top-K heads by opening probability (§4.1.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..options import option
from .gate_training import ConcreteLearner, Context, GateMethod, GateOptions, Slots


@dataclass
class LAGOptions(GateOptions):
    """LAG: the gate-training options plus ``sparsity_warmup`` (steps over which the target sparsity rises
    linearly from 0; 0: the fixed target from the first step)."""

    sparsity_warmup: int = option(
        0,
        low=0,
        help="Raise the target sparsity linearly from 0 over the first N steps "
        "(CoFi's schedule); 0: the paper's fixed target.",
    )


class LAG(ConcreteLearner):
    name = "lag"

    def __init__(self, slots: Slots, k: int, options: GateOptions, ctx: Context) -> None:
        super().__init__(slots, k, options, ctx)
        self.lambdas = torch.zeros(2, requires_grad=True)
        self.lambdas.register_hook(lambda g: -g)  # gradient ascent on lambda_1, lambda_2

    @staticmethod
    def default_gate_lr(task: str) -> float:
        return 0.2 if task == "seq2seq" else 0.5

    def parameters(self) -> list[torch.Tensor]:
        return [self.phi, self.lambdas]

    def expected_sparsity(self) -> torch.Tensor:
        weight = self.slots.weight.to(torch.float32)
        z_hat = self.hc.deterministic(self.phi)
        return (weight * (1.0 - z_hat)).sum() / weight.sum()

    def target(self, step: int) -> float:
        """The target sparsity of step ``step`` (0-based): s, or s min(1, (step + 1) / N) in the warm-up."""
        warmup = getattr(self.options, "sparsity_warmup", 0)
        return self.sparsity if not warmup else self.sparsity * min(1.0, (step + 1) / warmup)

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        target = self.target(step)
        gap = self.expected_sparsity() - target
        reg = self.lambdas[0] * gap + self.lambdas[1] * gap**2  # R_lag
        logs = {
            "expected_sparsity": float(gap.detach()) + target,
            "target_sparsity": target,
            "lambda_1": float(self.lambdas[0].detach()),
            "lambda_2": float(self.lambdas[1].detach()),
        }
        return self.sample(), reg, logs

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "target_sparsity": self.sparsity,
            "sparsity_warmup": getattr(self.options, "sparsity_warmup", 0),
            "gate_lr": self.options.gate_lr,
            "lambda_lr": self.options.gate_lr,
        }


METHOD = GateMethod(LAG, LAGOptions)
