"""DSP's differentiable subset selection (DSP, arXiv:2108.04657, §3.2, §4.2.3, §4.3).

Head importance ``iota_h = exp(w_h)`` (eq. 20), so the Gumbel-perturbed logits are
``r_h = w_h + n_h``, ``n_h ~ Gumbel(0, 1)`` (§3.1.1). The soft top-K (eq. 14-19) relaxes the
Gumbel-top-K sample (eq. 9-11) into a mask in [0, 1]^n summing to K; the hard top-K with
straight-through gradients is the STE baseline (§4.2.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def gumbel_noise(
    shape: torch.Size | tuple[int, ...],
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Standard Gumbel noise n = -log(-log u), u ~ U(0, 1) (clamped away from 0 and 1)."""
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    eps = torch.finfo(dtype).eps
    u = u.clamp(tiny, 1.0 - eps)
    return -torch.log(-torch.log(u))


def _check(r: torch.Tensor, k: int, tau: float) -> None:
    if r.dim() != 1:
        raise ValueError(f"logits must be a 1-D tensor (n,), got shape {tuple(r.shape)}")
    if not 1 <= k <= r.numel():
        raise ValueError(f"K must lie in [1, {r.numel()}], got {k}")
    if not tau > 0:
        raise ValueError(f"temperature tau must be > 0, got {tau}")


def soft_topk(r: torch.Tensor, k: int, tau: float) -> torch.Tensor:
    """The relaxed K-hot mask of already perturbed logits ``r`` (n,) (eq. 14-19).

    r^(1) = r (eq. 17); g^(k) = softmax(r^(k) / tau) (eq. 14-16);
    r^(k+1) = r^(k) + log(1 - g^(k)) (eq. 18); m = sum_k g^(k) (eq. 19).
    Each g^(k) sums to 1, so sum(m) = K. 1 - g is floored at the dtype's smallest normal number so
    that a fully selected head (g = 1 in floating point, tau -> 0) gets a finite, very negative logit
    instead of -inf and a NaN gradient.
    """
    _check(r, k, tau)
    tiny = torch.finfo(r.dtype).tiny
    m = torch.zeros_like(r)
    rk = r
    for _ in range(k):
        g = torch.softmax(rk / tau, dim=0)
        m = m + g
        rk = rk + torch.log((1.0 - g).clamp_min(tiny))
    return m


def gumbel_soft_topk(w: torch.Tensor, k: int, tau: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """DSP's gate: the soft top-K (eq. 14-19) of the Gumbel-perturbed importance logits w + n."""
    _check(w, k, tau)
    r = w + gumbel_noise(w.shape, generator=generator, device=w.device, dtype=w.dtype)
    return soft_topk(r, k, tau)


def hard_topk(r: torch.Tensor, k: int) -> torch.Tensor:
    """The exact K-hot mask (0/1, same dtype as ``r``) of the K largest entries of ``r`` (eq. 9-11)."""
    _check(r, k, 1.0)
    idx = torch.topk(r.detach(), k).indices
    return torch.zeros_like(r, requires_grad=False).index_fill(0, idx, 1.0)


def straight_through_topk(w: torch.Tensor, k: int) -> torch.Tensor:
    """The STE baseline (§4.2.3): the hard top-K of the importance logits ``w`` in the forward pass,
    "back-propagated through as if it had been the identity function": d mask / d w = I.

    Forward value: exactly 0/1 with K ones (hard + (w - w) adds an exact 0). No Gumbel noise: the
    paper replaces the Gumbel soft top-K by a hard top-K and its reference code draws none for STE.
    """
    _check(w, k, 1.0)
    return hard_topk(w, k) + (w - w.detach())


@dataclass(frozen=True)
class TemperatureSchedule:
    """DSP's log-linear temperature annealing (§4.3, eq. 24):

    log tau = log tau_ini - min(n / N_cooldown, 1) * (log tau_ini - log tau_end)

    Defaults: Table 2's BERT column (tau_ini 1000, tau_end 1e-8, N_cooldown 25000);
    ``enc_dec()`` gives the Enc-Dec column (0.1, 1e-8, 15000).
    """

    tau_ini: float = 1000.0
    tau_end: float = 1e-8
    n_cooldown: int = 25000

    def __post_init__(self) -> None:
        if not self.tau_ini > 0 or not self.tau_end > 0 or not self.n_cooldown > 0:
            raise ValueError("tau_ini, tau_end and n_cooldown must be positive")

    @classmethod
    def bert(cls) -> TemperatureSchedule:
        """Table 2, BERT: tau_ini 1000, tau_end 1e-8, N_cooldown 25000."""
        return cls(tau_ini=1000.0, tau_end=1e-8, n_cooldown=25000)

    @classmethod
    def enc_dec(cls) -> TemperatureSchedule:
        """Table 2, Enc-Dec: tau_ini 0.1, tau_end 1e-8, N_cooldown 15000."""
        return cls(tau_ini=0.1, tau_end=1e-8, n_cooldown=15000)

    def __call__(self, n: int) -> float:
        """tau after ``n`` training steps (0-based); tau_end from N_cooldown on."""
        if n < 0:
            raise ValueError(f"step must be >= 0, got {n}")
        frac = min(n / self.n_cooldown, 1.0)
        log_tau = math.log(self.tau_ini) - frac * (math.log(self.tau_ini) - math.log(self.tau_end))
        if frac >= 1.0:
            return self.tau_end
        return math.exp(log_tau)
