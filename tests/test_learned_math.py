"""The gate mathematics of the learned-gate methods: Hard Concrete, PASS objectives, DSP top-K."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch

from headcut.learned import (
    HardConcrete,
    LambdaSchedule,
    TemperatureSchedule,
    gumbel_soft_topk,
    hard_topk,
    l0_penalty,
    r_base,
    r_pass,
    soft_topk,
    straight_through_topk,
)
from headcut.learned.objectives import r_base_open_threshold

HC = HardConcrete()


# --- Hard Concrete -------------------------------------------------------------------------------


def test_defaults_are_the_papers() -> None:
    assert (HC.beta, HC.gamma, HC.zeta) == (0.33, -0.1, 1.1)
    with pytest.raises(ValueError):
        HardConcrete(gamma=0.1)
    with pytest.raises(ValueError):
        HardConcrete(zeta=0.9)


@pytest.mark.parametrize("phi", [-3.0, -1.0, 0.0, 0.5, 1.0, 2.5])
def test_closing_and_opening_probabilities_match_monte_carlo(phi: float) -> None:
    n = 200_000
    gen = torch.Generator().manual_seed(1234)
    z = HC.sample(torch.full((n,), phi, dtype=torch.float64), gen)
    p = torch.tensor([phi], dtype=torch.float64)
    assert (z == 0).double().mean().item() == pytest.approx(HC.prob_closed(p).item(), abs=0.005)
    assert (z == 1).double().mean().item() == pytest.approx(HC.prob_open(p).item(), abs=0.005)
    assert (z != 0).double().mean().item() == pytest.approx(HC.prob_nonzero(p).item(), abs=0.005)
    nb = ((z > 0) & (z < 1)).double().mean().item()
    assert nb == pytest.approx(HC.prob_nonbinary(p).item(), abs=0.005)


def test_closed_forms_and_monotonicity() -> None:
    phi = torch.linspace(-6, 6, 121, dtype=torch.float64)
    q0, q1 = HC.prob_closed(phi), HC.prob_open(phi)
    a = 0.33 * math.log(0.1 / 1.1)
    b = 0.33 * math.log(1.1 / 0.1)
    assert torch.allclose(q0, torch.sigmoid(a - phi))
    assert torch.allclose(q1, torch.sigmoid(phi - b))
    assert torch.allclose(HC.prob_nonzero(phi), 1 - q0)
    assert torch.all(q0[1:] < q0[:-1]) and torch.all(q1[1:] > q1[:-1])  # larger phi: more open
    assert torch.all(HC.prob_nonbinary(phi) > 0)
    assert l0_penalty(phi).item() == pytest.approx((1 - q0).sum().item())


def test_sample_is_reparameterised_and_deterministic() -> None:
    phi = torch.zeros(64, requires_grad=True)
    z1 = HC.sample(phi, torch.Generator().manual_seed(7))
    z2 = HC.sample(phi, torch.Generator().manual_seed(7))
    assert torch.equal(z1, z2)
    assert torch.all((z1 >= 0) & (z1 <= 1))
    z1.sum().backward()
    assert phi.grad is not None and phi.grad.abs().sum() > 0


def test_deterministic_gate_in_unit_interval() -> None:
    phi = torch.linspace(-20, 20, 401)
    g = HC.deterministic(phi)
    assert torch.all((g >= 0) & (g <= 1))
    assert g[0] == 0 and g[-1] == 1
    assert torch.all(g[1:] >= g[:-1])
    assert HC.deterministic(torch.tensor(0.0)).item() == pytest.approx(0.5)


# --- PASS objectives ------------------------------------------------------------------------------


def test_r_pass_is_minimal_at_almost_sure_sparsity() -> None:
    s, n = 0.25, 8
    target = torch.tensor([-30.0] * 2 + [30.0] * 6)  # 2 closed, 6 open almost surely
    best = r_pass(target, s).item()
    assert best == pytest.approx(0.0, abs=1e-6)
    assert r_base(target, s).item() == pytest.approx(0.0, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        phi = torch.randn(n, generator=gen) * 4
        assert r_pass(phi, s).item() > best
    # wrong almost-sure sparsity: all open or 4 closed
    assert r_pass(torch.full((n,), 30.0), s).item() == pytest.approx(4.0, abs=1e-5)
    assert r_pass(torch.tensor([-30.0] * 4 + [30.0] * 4), s).item() == pytest.approx(4.0, abs=1e-5)


def test_r_base_open_threshold_is_where_the_gradient_changes_sign() -> None:
    # App. A.3: per gate, with the target not yet met, dR_base/dphi_i = -2 q0' - q1'
    phi_star = r_base_open_threshold()
    assert phi_star == pytest.approx(0.9846, abs=1e-3)
    for phi_i, sign in [(phi_star - 0.1, 1.0), (phi_star + 0.1, -1.0), (4.0, -1.0)]:
        phi = torch.tensor([phi_i, 30.0, 30.0, 30.0], dtype=torch.float64, requires_grad=True)
        r_base(phi, 0.5).backward()  # s|theta| = 2 > sum q0: the high-sparsity branch
        assert math.copysign(1.0, phi.grad[0].item()) == sign


def test_r_base_has_a_spurious_optimum_and_r_pass_does_not() -> None:
    """Fig. 2: two gates, s = 0.5. Started with both phi positive, gradient descent on R_base opens
    both gates (R_base -> 1, not the global minimum 0); on R_pass it closes one and opens the other."""

    def descend(objective, steps: int = 2000) -> torch.Tensor:
        phi = torch.tensor([2.0, 1.5], dtype=torch.float64, requires_grad=True)
        opt = torch.optim.SGD([phi], lr=2.0)
        for _ in range(steps):
            opt.zero_grad()
            objective(phi, 0.5).backward()
            opt.step()
        return phi.detach()

    phi_b = descend(r_base)
    assert torch.all(phi_b > 5)  # both gates driven open
    assert HC.prob_open(phi_b).sum().item() > 1.99
    assert r_base(phi_b, 0.5).item() == pytest.approx(1.0, abs=0.01)
    # it is a (limiting) local optimum: along the diagonal R_base keeps decreasing towards 1 ...
    diag = [r_base(torch.tensor([t, t], dtype=torch.float64), 0.5).item() for t in (2.0, 4.0, 8.0, 16.0)]
    assert all(x > y for x, y in pairwise(diag)) and diag[-1] > 0.99
    # ... while the global optimum (one closed, one open) is 0
    assert r_base(torch.tensor([-30.0, 30.0]), 0.5).item() == pytest.approx(0.0, abs=1e-6)

    phi_p = descend(r_pass)
    assert phi_p.max() > 5 and phi_p.min() < -5  # one open, one closed
    assert HC.prob_closed(phi_p).sum().item() == pytest.approx(1.0, abs=0.01)
    assert HC.prob_open(phi_p).sum().item() == pytest.approx(1.0, abs=0.01)
    assert r_pass(phi_p, 0.5).item() < 0.01


def test_objectives_reject_bad_targets() -> None:
    with pytest.raises(ValueError):
        r_pass(torch.zeros(4), 1.0)
    with pytest.raises(ValueError):
        r_base(torch.zeros(4), 0.0)


def test_lambda_schedule() -> None:
    bert = LambdaSchedule()
    assert bert == LambdaSchedule.bert_base() == LambdaSchedule(1e-5, 1000.0, 1000)
    assert bert(0) == pytest.approx(1e-5)
    assert bert(1000) == pytest.approx(1e-2)
    assert bert(2500) == pytest.approx(1e-5 * 1000**2.5)
    ed = LambdaSchedule.ed_transformer()
    assert ed(0) == 1.0 and ed(1000) == pytest.approx(2.0) and ed(3000) == pytest.approx(8.0)
    for sched in (bert, ed):
        vals = [sched(i) for i in range(0, 10_000, 97)]
        assert all(x < y for x, y in pairwise(vals))
    with pytest.raises(ValueError):
        bert(-1)


# --- DSP relaxed top-K ----------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1000.0, 1.0, 0.1, 1e-3])
def test_soft_topk_sums_to_k(tau: float) -> None:
    gen = torch.Generator().manual_seed(3)
    for n, k in [(12, 1), (12, 4), (144, 36), (7, 7)]:
        w = torch.randn(n, generator=gen)
        m = gumbel_soft_topk(w, k, tau, gen)
        assert m.shape == (n,)
        assert torch.all(m >= 0)
        assert m.sum().item() == pytest.approx(k, rel=1e-5)


def test_soft_topk_follows_the_papers_recursion() -> None:
    # eq. 14-19 by hand for r = (5, 0), K = 2, tau = 1: g1 = softmax(r); r2 = r + log(1 - g1)
    r = torch.tensor([5.0, 0.0], dtype=torch.float64)
    g1 = torch.softmax(r, 0)
    g2 = torch.softmax(r + torch.log(1 - g1), 0)
    assert torch.allclose(soft_topk(r, 2, 1.0), g1 + g2)
    # the construction does not bound entries by 1 at moderate tau (here m_0 ~ 1.49)
    assert soft_topk(r, 2, 1.0)[0].item() > 1.4


def test_soft_topk_tends_to_hard_topk_as_tau_goes_to_zero() -> None:
    gen = torch.Generator().manual_seed(11)
    for n, k in [(12, 3), (144, 50), (20, 19)]:
        r = torch.randn(n, generator=gen, dtype=torch.float64)
        hard = hard_topk(r, k)
        assert hard.sum().item() == k and torch.all((hard == 0) | (hard == 1))
        errs = [(soft_topk(r, k, tau) - hard).abs().max().item() for tau in (1.0, 1e-1, 1e-2, 1e-4, 1e-8)]
        assert errs[-1] < 1e-6
        assert errs[-2] < errs[0]
        m = soft_topk(r, k, 1e-4)
        assert set(torch.topk(m, k).indices.tolist()) == set(torch.nonzero(hard).flatten().tolist())


def test_gumbel_soft_topk_is_deterministic_given_a_generator() -> None:
    w = torch.randn(16, generator=torch.Generator().manual_seed(0))
    a = gumbel_soft_topk(w, 5, 0.5, torch.Generator().manual_seed(42))
    b = gumbel_soft_topk(w, 5, 0.5, torch.Generator().manual_seed(42))
    c = gumbel_soft_topk(w, 5, 0.5, torch.Generator().manual_seed(43))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_soft_topk_gradients_are_finite_at_tiny_tau() -> None:
    w = torch.randn(12, generator=torch.Generator().manual_seed(5), requires_grad=True)
    m = gumbel_soft_topk(w, 4, 1e-8, torch.Generator().manual_seed(6))
    (m * torch.arange(12.0)).sum().backward()
    assert torch.all(torch.isfinite(w.grad))


@pytest.mark.parametrize("k", [1, 4, 11])
def test_straight_through_topk(k: int) -> None:
    """Forward: the exact top-K of w; backward: the identity (d mask / d w = I, DSP §4.2.3)."""
    n = 12
    w_init = torch.randn(n, generator=torch.Generator().manual_seed(9))
    coef = torch.randn(n, generator=torch.Generator().manual_seed(10))
    w = w_init.clone().requires_grad_(True)
    mask = straight_through_topk(w, k)
    assert torch.all((mask == 0) | (mask == 1)) and mask.sum().item() == k
    assert torch.equal(mask.detach(), hard_topk(w_init, k))
    assert set(torch.topk(w_init, k).indices.tolist()) == set(mask.detach().nonzero().flatten().tolist())
    (mask * coef).sum().backward()
    assert torch.equal(w.grad, coef)


def test_topk_rejects_bad_arguments() -> None:
    w = torch.zeros(4)
    with pytest.raises(ValueError):
        soft_topk(w, 0, 1.0)
    with pytest.raises(ValueError):
        soft_topk(w, 5, 1.0)
    with pytest.raises(ValueError):
        soft_topk(w, 2, 0.0)
    with pytest.raises(ValueError):
        soft_topk(torch.zeros(2, 2), 1, 1.0)


# --- DSP temperature annealing --------------------------------------------------------------------


def test_temperature_schedule() -> None:
    bert = TemperatureSchedule()
    assert bert == TemperatureSchedule.bert() == TemperatureSchedule(1000.0, 1e-8, 25000)
    assert bert(0) == pytest.approx(1000.0)
    assert bert(25000) == 1e-8 and bert(10**6) == 1e-8
    # log-linear: halfway in steps is the geometric mean
    assert bert(12500) == pytest.approx(math.sqrt(1000.0 * 1e-8))
    vals = [bert(i) for i in range(0, 25001, 250)]
    assert all(x > y for x, y in pairwise(vals))
    ed = TemperatureSchedule.enc_dec()
    assert ed(0) == pytest.approx(0.1) and ed(15000) == 1e-8 and ed(20000) == 1e-8
    assert ed.n_cooldown == 15000
    with pytest.raises(ValueError):
        bert(-1)
