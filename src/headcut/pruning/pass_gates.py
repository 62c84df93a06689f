"""``pass``: Pruning with Almost-Sure Sparsity targets (Ding, Jawahar & Lakshmanan, TMLR 2024, §3.2, §3.4,
App. B). (The module is not called ``pass``: that is a Python keyword.)

Hard Concrete gates z_i (beta 0.33, gamma -0.1, zeta 1.1) with log-alpha phi_i, sampled every step;
closing and opening probabilities q0(phi) = sigmoid(beta log(-gamma/zeta) - phi),
q1(phi) = sigmoid(phi - beta log((1-gamma)/(zeta-1))), q_nb = 1 - q0 - q1 (§3.2). The sparsity
objective::

    R_pass(Phi, s) = sum_i q_nb(phi_i) + | s|H| - sum_i q0(phi_i) | + | (1-s)|H| - sum_i q1(phi_i) |   (eq. 7)
    L_pass = task loss + lambda R_pass                                                                  (eq. 8)

is 0 exactly at almost-sure sparsity s = 1 - K/|H|. lambda escalates exponentially (App. B)::

    lambda = lambda_base * lambda_0 ** (train_itr / n_step)                                             (eq. 16)

Table 6: lambda_base 1e-5, lambda_0 1000, gate learning rate 0.5 (BERT); 1, 2, 0.2 for
sequence-to-sequence models (the ED Transformer column); n_step 1,000 "in all experiments".

**Clipping and re-opening** (§3.4): every phi is clipped to [-5, 5], and each almost-surely closed
gate (phi at -5) is re-opened (phi set to +5) with probability equal to its head's confidence (Voita
et al.: the mean over real query tokens of the largest attention weight, measured on the first 8
training batches) divided by the largest confidence of all heads. The draws come from a generator
seeded with the run's seed and the step. Final mask: the top-K heads by opening probability q1
(§4.1.1).

**Where headcut departs from the paper's text, and why** (each recorded in the report's
``hyperparameters``; the README's method table lists them too):

1. *When to clip and re-open.* The paper gives no schedule; headcut follows the authors' reference
   code: at steps 2, 3 and 4 x n_step (every n_step steps strictly between n_step and 5 n_step).
2. *train_itr.* As in the reference code, eq. 16's train_itr counts only the steps at which the target
   is not met yet (the gates with phi <= -5 are not exactly |H| - K, or those with phi >= 5 not exactly
   K), so lambda stops growing once almost-sure sparsity is reached.
3. *n_step for short runs.* The paper's n_step = 1,000 fits runs of 6,000 steps or more (SST-2's 3
   epochs at batch 32 take about 6,300), whose lambda ramp and clip/re-open events end by 5,000. A
   shorter run with n_step = 1,000 would end before its gates close, so n_step is scaled to steps / 6,
   and lambda and the events go through the same course (``--lambda-step`` sets n_step).
4. *A cap on lambda.* lambda stops growing at 1e10, where the sparsity term already outweighs the task
   loss's gradient on the gates by more than float32 resolves (a larger lambda changes nothing) and
   lambda * dR/dphi would overflow float32 a few n_step later; the paper sets no bound because its runs
   meet the target first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import ScoreConfig
from ..learned import LambdaSchedule, r_pass
from ..options import option
from ..scoring import score
from .base import seed_in_range
from .gate_training import ConcreteLearner, Context, GateMethod, GateOptions, Slots, fitted

#: phi is clipped to [-CLIP, CLIP] (§3.4); |phi| >= CLIP counts as almost surely closed / open
CLIP = 5.0
#: training batches whose attention gives the head confidence for re-opening
CONFIDENCE_BATCHES = 8
#: the shortest run the reference schedule fits (its events end at 5 x n_step = 5,000)
PAPER_RUN = 6000
#: lambda stops growing here: the sparsity term then outweighs the task loss's gradient on the gates
#: by more than float32 resolves (so a larger lambda changes nothing), and lambda * dR/dphi would
#: overflow float32 a few n_step later (the paper sets no bound; its runs meet the target first)
MAX_LAMBDA = 1e10


@dataclass
class PassOptions(GateOptions):
    """PASS and PASSCONC: the gate-training options plus ``lambda_step``, eq. 16's n_step (None: 1,000,
    or steps / 6 for a run under 6,000 steps)."""

    lambda_step: int | None = option(
        None, low=1, help="n_step of the lambda schedule, eq. 16 (default 1,000, or steps / 6 under 6,000 steps)."
    )


class PASS(ConcreteLearner):
    name = "pass"

    def __init__(self, slots: Slots, k: int, options: PassOptions, ctx: Context) -> None:
        super().__init__(slots, k, options, ctx)
        column = LambdaSchedule.ed_transformer() if ctx.task == "seq2seq" else LambdaSchedule.bert_base()
        self.paper_n_step = column.n_step
        n_step = options.lambda_step or fitted(column.n_step, PAPER_RUN, ctx.total_steps)
        self.schedule = LambdaSchedule(lambda_base=column.lambda_base, lambda_0=column.lambda_0, n_step=n_step)
        #: eq. 16's train_itr: steps at which the target was not met yet
        self.itr = 0
        self.lam = self.schedule(0)

    @staticmethod
    def default_gate_lr(task: str) -> float:
        return 0.2 if task == "seq2seq" else 0.5  # Table 6

    # -- the objective ----------------------------------------------------------------------------
    def regulariser(self) -> torch.Tensor:
        return self.lam * r_pass(self.phi, self.sparsity, self.hc)  # eq. 7-8

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        return self.sample(), self.regulariser(), {"lambda": self.lam}

    # -- after each step --------------------------------------------------------------------------
    def target_met(self) -> bool:
        phi = self.phi.detach()
        closed, opened = int((phi <= -CLIP).sum()), int((phi >= CLIP).sum())
        return closed == self.slots.n - self.k and opened == self.k

    def event(self, step: int) -> bool:
        """Whether step ``step`` clips and re-opens (2, 3 and 4 x n_step)."""
        n = self.schedule.n_step
        return n < step < 5 * n and step % n == 0

    def confidence(self) -> torch.Tensor:
        """Per slot: head confidence (mean over the slot's heads) divided by the largest one."""
        batches = self.ctx.batches[:CONFIDENCE_BATCHES]
        scores = score(self.ctx.model, batches, ScoreConfig(scorer="confidence"))
        total = torch.zeros(self.slots.n, dtype=torch.float64)
        count = torch.zeros(self.slots.n, dtype=torch.float64)
        for name, idx in self.slots.index.items():
            values = torch.tensor(scores.blocks[name], dtype=torch.float64)
            total.index_add_(0, idx, values)
            count.index_add_(0, idx, torch.ones_like(values))
        conf = total / count.clamp_min(1)
        return conf / conf.max().clamp_min(1e-12)

    def clip_and_reopen(self, step: int) -> int:
        """§3.4: clip phi to [-5, 5]; re-open closed gates with probability = normalised confidence."""
        self.phi.clamp_(-CLIP, CLIP)
        closed = self.phi <= -CLIP
        if not bool(closed.any()):
            return 0
        chance = self.confidence().to(self.phi.dtype)
        # a generator of its own, seeded by the run's seed and the step: every process of a data-parallel
        # run draws the same (their torch RNGs drift apart with dropout on batches of different shapes)
        generator = torch.Generator().manual_seed(seed_in_range(self.ctx.seed * 1_000_003 + step))
        draw = torch.rand(self.slots.n, generator=generator)
        reopen = closed & (draw < chance)
        self.phi[reopen] = CLIP
        return int(reopen.sum())

    def after_step(self, step: int) -> dict[str, Any]:
        logs: dict[str, Any] = {}
        if self.event(step):
            logs["reopened"] = self.clip_and_reopen(step)
        if not self.target_met() and self.schedule(self.itr + 1) <= MAX_LAMBDA:
            self.itr += 1
        self.lam = self.schedule(self.itr)
        return logs

    def state_dict(self) -> dict[str, Any]:
        return {"itr": self.itr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.itr = int(state["itr"])
        self.lam = self.schedule(self.itr)

    def hyperparameters(self) -> dict[str, Any]:
        s = self.schedule
        return {
            "lambda_base": s.lambda_base,
            "lambda_0": s.lambda_0,
            "n_step": s.n_step,
            "n_step_scaled": self.options.lambda_step is None and s.n_step != self.paper_n_step,
            "reopen_steps": [k * s.n_step for k in (2, 3, 4)],
            "max_lambda": MAX_LAMBDA,
            "clip": CLIP,
            "target_sparsity": self.sparsity,
            "k_slots": self.k,
            "gate_lr": self.options.gate_lr,
            "beta": self.hc.beta,
            "gamma": self.hc.gamma,
            "zeta": self.hc.zeta,
        }


METHOD = GateMethod(PASS, PassOptions)
