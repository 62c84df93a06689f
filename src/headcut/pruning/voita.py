"""``voita``: Voita et al.'s L0 head gates (ACL 2019, arXiv:1905.09418 §4), the joint baseline of DSP
(arXiv:2108.04657 §4.2.2, §4.3, §5.2) and PASS (§4.1.2).

Each head has a Hard Concrete gate (beta 0.33, gamma -0.1, zeta 1.1) with log-alpha phi_h, sampled
every step. The relaxed L0 norm is the expected number of non-zero gates::

    L_C(phi) = sum_h (1 - P(g_h = 0 | phi_h))                           (eq. 22)
    R(theta, phi) = L(theta, phi) + lambda * L_C(phi)                   (eq. 23)

lambda only steers the sparsity indirectly: the method keeps by its own rule the heads whose
deterministic gate exceeds 0.5. The DSP paper tunes lambda per target ("we found it hard to tune the
weighting coefficient λ for Voita et al. to reach the desired sparsity", §4.3; Figure 3 sweeps it),
then "adjust[s] the number of unpruned heads to the targeted number by re-including heads with the
highest gate values from the discarded ones, or excluding those with the smallest gate values in the
kept ones. We make sure the adjustments are as small as possible." headcut does both:

* **lambda search** (``--lambda`` not given): up to ``lambda_trials`` (default 5) training runs of the
  configured length from the same starting weights, the first at 0.0015 (the reference README's MNLI
  value); a run that keeps more than K heads by its own rule raises lambda (x4 until bracketed, then
  the geometric middle of the bracket), one that keeps fewer lowers it; the search stops at a run that
  keeps exactly K. The run whose own count is nearest K is kept (its weights, in joint mode, and its
  gates); the report lists every trial (``lambda_search``). ``--lambda L`` trains once with L.
* **adjustment**: the final mask is the top-K heads by gate value (ties at a saturated gate broken by
  phi); the report's ``moved_by_adjustment`` counts the heads it re-included or excluded.

Gate learning rate 0.1, the model's 2e-5 (the reference README). Slots that stand for several heads
(ALBERT, KV groups) count each head in L_C. A lambda search keeps no resume checkpoints (resume a run
with the lambda it found, from the report).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..data import Calibration
from ..errors import HeadcutError
from ..options import option
from .base import PruneResult
from .gate_training import (
    ConcreteLearner,
    Context,
    GateMethod,
    GateOptions,
    Slots,
    finish,
    metric_before,
    train_gates,
)
from .method import Problem

#: lambda of the reference README's MNLI run
DEFAULT_LAMBDA = 0.0015


@dataclass
class VoitaOptions(GateOptions):
    """Voita et al.: the gate-training options plus ``lam``, eq. 23's lambda (``--lambda``)."""

    lam: float | None = option(
        None,
        low=0,
        flag="--lambda",
        metavar="L",
        help="The L0 penalty's weight, eq. 23 (default: searched so that the gates keep K heads).",
    )
    lambda_trials: int = option(5, low=1, help="Training runs of the lambda search.")


class Voita(ConcreteLearner):
    name = "voita"
    ranking = "gate value (the deterministic gate, ordered as log alpha)"

    def __init__(self, slots: Slots, k: int, options: VoitaOptions, ctx: Context) -> None:
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
        return {
            "lambda": self.lam,
            "gate_lr": self.options.gate_lr,
            "beta": self.hc.beta,
            "gamma": self.hc.gamma,
            "zeta": self.hc.zeta,
        }


def next_lambda(
    lam: float, kept: float, k: int, low: float | None, high: float | None
) -> tuple[float, float | None, float | None]:
    """The next lambda of the search: a run keeping more than ``k`` heads had too small a lambda (it
    becomes the bracket's ``low``), one keeping fewer too large a one (``high``); x4 or /4 until the
    bracket closes, then its geometric middle. Returns (lambda, low, high)."""
    if kept > k:
        low = lam
    else:
        high = lam
    if low is not None and high is not None:
        return math.sqrt(max(low, 1e-12) * high), low, high
    return (lam * 4 if high is None else lam / 4), low, high


class VoitaMethod(GateMethod):
    """Voita et al. with the lambda search of the module's doc (or one run with ``--lambda``)."""

    def run(self, problem: Problem, options: VoitaOptions) -> PruneResult:
        if options.lam is not None:
            return super().run(problem, options)
        if problem.resume:
            raise HeadcutError(
                "--resume needs --lambda for voita: a lambda search keeps no checkpoints (the report "
                "of the interrupted run's trials, or pass --lambda to train once)"
            )
        task = problem.data.task if isinstance(problem.data, Calibration) else ""
        base = options.resolved(self.learner, task, problem.config.seed)
        model = problem.model
        start_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        before = metric_before(problem)
        started = time.perf_counter()
        searching = replace(problem, checkpoint_dir=None)
        lam, low, high = DEFAULT_LAMBDA, None, None
        trials: list[dict[str, float]] = []
        best: tuple[float, Any, Any, dict[str, torch.Tensor]] | None = None
        for _ in range(options.lambda_trials):
            model.load_state_dict(start_state)
            result, run = train_gates(searching, self.learner, replace(base, lam=lam))
            kept = float(run.own_kept or 0.0)
            trials.append({"lambda": lam, "own_kept": kept})
            gap = abs(kept - problem.budget.target)
            if best is None or gap <= best[0]:
                best = (gap, result, run, {k: v.detach().clone() for k, v in model.state_dict().items()})
            if gap == 0:
                break
            lam, low, high = next_lambda(lam, kept, problem.budget.target, low, high)
        assert best is not None
        _, result, run, state = best
        model.load_state_dict(state)
        run.hyperparameters["lambda_search"] = trials
        return finish(problem, result, run, before, started)


METHOD = VoitaMethod(Voita, VoitaOptions)
