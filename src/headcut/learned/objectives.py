"""PASS's sparsity objectives and lambda schedule (PASS, TMLR 2024, §3.2 and App. B), and Voita's L0 term.

``phi`` holds the log-alpha of every gate in the model (all heads of all layers, any shape; it is
flattened), so ``|theta|`` in the paper is ``phi.numel()``. ``sparsity`` is the target ``s``: the
fraction of gates to close almost surely. The objectives are unscaled; the training loss adds
``lambda * R`` (eq. 8), lambda from ``LambdaSchedule``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .hard_concrete import HardConcrete


def _check_sparsity(sparsity: float) -> None:
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"sparsity target s must lie in (0, 1), got {sparsity}")


def r_base(phi: torch.Tensor, sparsity: float, hc: HardConcrete | None = None) -> torch.Tensor:
    """R_base(Phi, s) = sum_i q_nb(phi_i) + | s|theta| - sum_i q0(phi_i) |   (eq. 6).

    Zero exactly at almost-sure sparsity s, but it has a spurious optimum where every gate is open
    (fig. 2; App. A.3): the objective PASS argues against, kept for comparison and tests.
    """
    _check_sparsity(sparsity)
    hc = hc if hc is not None else HardConcrete()
    phi = phi.reshape(-1)
    n = phi.numel()
    return hc.prob_nonbinary(phi).sum() + (sparsity * n - hc.prob_closed(phi).sum()).abs()


def r_pass(phi: torch.Tensor, sparsity: float, hc: HardConcrete | None = None) -> torch.Tensor:
    """R_pass(Phi, s) = sum_i q_nb(phi_i) + | s|theta| - sum_i q0(phi_i) | + | (1-s)|theta| - sum_i q1(phi_i) |   (eq. 7).

    Non-negative, and 0 exactly at almost-sure sparsity s (s|theta| gates with q0 = 1, the rest with
    q1 = 1). The two absolute terms tie the *expected* numbers of closed (sum q0) and open (sum q1)
    gates to the targets; the q_nb term polarises the gates (Lemma 1, App. A.4).
    """
    _check_sparsity(sparsity)
    hc = hc if hc is not None else HardConcrete()
    phi = phi.reshape(-1)
    n = phi.numel()
    return (
        hc.prob_nonbinary(phi).sum()
        + (sparsity * n - hc.prob_closed(phi).sum()).abs()
        + ((1.0 - sparsity) * n - hc.prob_open(phi).sum()).abs()
    )


def r_conc(phi: torch.Tensor, layers: list[torch.Tensor], hc: HardConcrete | None = None) -> torch.Tensor:
    """PASSCONC's concentrator R_conc(Phi) = sum_l (1 - prod_h q0(phi_{l,h}))   (§3.3, eq. 9).

    ``layers``: the indices into the flat ``phi`` of each layer's gates. A layer's term is 0 only when
    every one of its gates is closed almost surely (the layer can be skipped).
    """
    hc = hc if hc is not None else HardConcrete()
    q0 = hc.prob_closed(phi.reshape(-1))
    return sum((1.0 - q0[idx].prod() for idx in layers), start=q0.new_zeros(()))


def concentrator_weight(
    phi: torch.Tensor,
    sparsity: float,
    layers: list[torch.Tensor],
    lam: float,
    skip: torch.Tensor | None = None,
    hc: HardConcrete | None = None,
) -> float:
    """The adaptive lambda_c of eq. 17: lam * min_i |dR_pass/dphi_i| / |dR_conc/dphi_i|.

    The minimum runs over the gates not in ``skip`` (PASS's code leaves out the almost-surely closed
    gates) whose concentrator gradient is not 0; 0.0 when there is none.
    """
    with torch.enable_grad():
        p = phi.detach().reshape(-1).to(torch.float64).requires_grad_(True)
        (g_pass,) = torch.autograd.grad(r_pass(p, sparsity, hc), p)
        (g_conc,) = torch.autograd.grad(r_conc(p, layers, hc), p)
    ok = g_conc.abs() > 0
    if skip is not None:
        ok &= ~skip.reshape(-1)
    if not bool(ok.any()):
        return 0.0
    return float(lam * (g_pass.abs()[ok] / g_conc.abs()[ok]).min())


def l0_penalty(phi: torch.Tensor, hc: HardConcrete | None = None) -> torch.Tensor:
    """Voita et al.'s relaxed L0 norm L_C(phi) = sum_h (1 - P(g_h = 0 | phi_h))   (DSP, arXiv:2108.04657, eq. 22).

    The expected number of non-zero gates; the loss is L + lambda * L_C (eq. 23).
    """
    hc = hc if hc is not None else HardConcrete()
    return hc.prob_nonzero(phi.reshape(-1)).sum()


def r_base_open_threshold(hc: HardConcrete | None = None) -> float:
    """phi' above which gradient descent on R_base raises phi_i (opens the gate) (PASS §3.2, App. A.3).

    phi' = log((-1 - sqrt(1 - g(a) g(-a))) / g(a)), g(a) = 2 e^a - e^-a, a = beta log(-gamma / zeta),
    valid when gamma + zeta = 1 and the target is not yet met (s|theta| >= sum q0). The main text
    writes "-1 - sqrt", App. A.3 (after eq. 15) writes "-1 + sqrt"; solving the quadratic of eq. 15,
    g(a) x^2 + 2x + g(-a) = 0 with x = e^phi', gives x = (-1 +- sqrt(1 - g(a) g(-a))) / g(a), and for
    the defaults g(a) < 0, so only "-1 - sqrt" gives x > 0: the main text's sign is the right one.
    """
    hc = hc if hc is not None else HardConcrete()
    if not math.isclose(hc.gamma + hc.zeta, 1.0, abs_tol=1e-12):
        raise ValueError("the closed form assumes a symmetric stretch, gamma + zeta = 1")
    a = hc.closed_shift

    def g(x: float) -> float:
        return 2.0 * math.exp(x) - math.exp(-x)

    ga, gma = g(a), g(-a)
    disc = 1.0 - ga * gma
    x = (-1.0 - math.sqrt(disc)) / ga
    if not x > 0:
        raise ValueError("no positive root for these Hard Concrete parameters")
    return math.log(x)


@dataclass(frozen=True)
class LambdaSchedule:
    """The exponential escalation of PASS's lambda (App. B, eq. 16):

    lambda = lambda_base * lambda_0 ** (train_itr / n_step)

    Defaults: Table 6's BERT-base column (lambda_base 1e-5, lambda_0 1000) and n_step = 1,000 ("in
    all experiments"); ``ed_transformer()`` gives the ED Transformer column (1, 2). The paper puts
    no upper bound on lambda.
    """

    lambda_base: float = 1e-5
    lambda_0: float = 1000.0
    n_step: int = 1000

    def __post_init__(self) -> None:
        if not self.lambda_base > 0 or not self.lambda_0 > 0 or not self.n_step > 0:
            raise ValueError("lambda_base, lambda_0 and n_step must be positive")

    @classmethod
    def bert_base(cls) -> LambdaSchedule:
        """Table 6, BERT-base: lambda_base 1e-5, lambda_0 1000."""
        return cls(lambda_base=1e-5, lambda_0=1000.0)

    @classmethod
    def ed_transformer(cls) -> LambdaSchedule:
        """Table 6, ED Transformer: lambda_base 1, lambda_0 2."""
        return cls(lambda_base=1.0, lambda_0=2.0)

    def __call__(self, train_itr: int) -> float:
        """lambda at training iteration ``train_itr`` (0-based)."""
        if train_itr < 0:
            raise ValueError(f"train_itr must be >= 0, got {train_itr}")
        return self.lambda_base * self.lambda_0 ** (train_itr / self.n_step)
