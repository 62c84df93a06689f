"""The Hard Concrete distribution (Louizos et al., 2018) as PASS (PASS, TMLR 2024, §3.2, App. A.2) uses it.

A gate ``z`` is a binary Concrete variable with location ``phi`` (log alpha) and temperature
``beta``, stretched to ``(gamma, zeta)`` and clamped to ``[0, 1]``, so it has point masses at 0 and
1. ``phi`` is any tensor (one entry per head); every function works elementwise and is
differentiable in ``phi``. Larger ``phi`` means a more open gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HardConcrete:
    """Parameters of the Hard Concrete distribution; PASS's defaults (after Voita et al., 2019)."""

    beta: float = 0.33
    gamma: float = -0.1
    zeta: float = 1.1

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not self.gamma < 0:
            raise ValueError(f"gamma must be < 0, got {self.gamma}")
        if not self.zeta > 1:
            raise ValueError(f"zeta must be > 1, got {self.zeta}")

    @property
    def closed_shift(self) -> float:
        """``beta * log(-gamma / zeta)``: q0 = sigmoid(closed_shift - phi) (negative for the defaults)."""
        return self.beta * math.log(-self.gamma / self.zeta)

    @property
    def open_shift(self) -> float:
        """``beta * log((1 - gamma) / (zeta - 1))``: q1 = sigmoid(phi - open_shift)."""
        return self.beta * math.log((1.0 - self.gamma) / (self.zeta - 1.0))

    def sample(self, phi: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A reparameterised sample of the gates, same shape as ``phi``, differentiable in ``phi``.

        u ~ U(0, 1); s = sigmoid((log u - log(1 - u) + phi) / beta)  (binary Concrete, whose CDF is
        App. A.2 eq. 11: Q_c(x) = sigmoid(beta * logit(x) - phi)); s_bar = s * (zeta - gamma) + gamma
        (stretch); z = min(1, max(0, s_bar)) (collapse).
        """
        u = torch.rand(phi.shape, generator=generator, device=phi.device, dtype=phi.dtype)
        eps = torch.finfo(phi.dtype).eps
        u = u.clamp(eps, 1.0 - eps)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + phi) / self.beta)
        s_bar = s * (self.zeta - self.gamma) + self.gamma
        return s_bar.clamp(0.0, 1.0)

    def prob_closed(self, phi: torch.Tensor) -> torch.Tensor:
        """q0(phi) = P(z = 0) = Q_c(-gamma / (zeta - gamma)) = sigmoid(beta * log(-gamma / zeta) - phi).

        PASS §3.2 (the unnumbered formulas before eq. 6) and App. A.2 (eq. 11 evaluated at the
        point that the stretch maps to 0: logit(-gamma / (zeta - gamma)) = log(-gamma / zeta)).
        """
        return torch.sigmoid(self.closed_shift - phi)

    def prob_open(self, phi: torch.Tensor) -> torch.Tensor:
        """q1(phi) = P(z = 1) = 1 - Q_c((1 - gamma) / (zeta - gamma)) = sigmoid(phi - beta * log((1 - gamma) / (zeta - 1))).

        PASS §3.2 and App. A.2 (logit((1 - gamma) / (zeta - gamma)) = log((1 - gamma) / (zeta - 1))).
        """
        return torch.sigmoid(phi - self.open_shift)

    def prob_nonbinary(self, phi: torch.Tensor) -> torch.Tensor:
        """q_nb(phi) = 1 - q0(phi) - q1(phi), the probability that 0 < z < 1 (PASS §3.2)."""
        return 1.0 - self.prob_closed(phi) - self.prob_open(phi)

    def prob_nonzero(self, phi: torch.Tensor) -> torch.Tensor:
        """1 - q0(phi) = P(z != 0) = sigmoid(phi - beta * log(-gamma / zeta)).

        The per-gate term of Voita et al.'s relaxed L0 norm (DSP, arXiv:2108.04657, eq. 22).
        """
        return torch.sigmoid(phi - self.closed_shift)

    def deterministic(self, phi: torch.Tensor) -> torch.Tensor:
        """The test-time gate of Louizos et al. (2018): min(1, max(0, sigmoid(phi) * (zeta - gamma) + gamma))."""
        return (torch.sigmoid(phi) * (self.zeta - self.gamma) + self.gamma).clamp(0.0, 1.0)
