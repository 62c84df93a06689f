"""``passconc``: PASS with the concentrator (PASS, TMLR 2024, §3.3, App. B).

PASS (``pass_gates.py``) plus a term that gathers the kept heads in few layers, so whole attention
layers can be skipped::

    R_conc(Phi) = sum_l (1 - prod_h q0(phi_{l,h}))                                  (§3.3)
    L_passconc = task loss + lambda R_pass(Phi, s) + lambda_c R_conc(Phi)            (eq. 9)

lambda_c adapts so that the concentrator is not dominated by the sparsifier (App. B)::

    lambda_c = lambda * min_i |dR_pass/dphi_i| / |dR_conc/dphi_i|                    (eq. 17)

It is recomputed at the clip/re-open steps inside the window (BERT: "0 except for iterations between
2,000 and 5,000", i.e. 2 to 5 x n_step; sequence-to-sequence: 0 in the first 20,000 and the last
7,000 iterations, scaled like n_step for short runs), kept in between, and 0 outside the window. As
in the reference code, the minimum leaves out the almost-surely closed gates, lambda_c / lambda is
capped at 3,000, and lambda_c is 0 while the target number of closed gates is already met. A "layer"
is a block set: one attention block, or ALBERT's layers that share one.
"""

from __future__ import annotations

from typing import Any

import torch

from ..learned.objectives import concentrator_weight, r_conc
from .gate_training import Context, GateMethod, Slots, fitted
from .pass_gates import CLIP, PASS, PassOptions

#: the reference code's cap on lambda_c / lambda
MAX_RATIO = 3000.0


class PASSCONC(PASS):
    name = "passconc"

    def __init__(self, slots: Slots, k: int, options: PassOptions, ctx: Context) -> None:
        super().__init__(slots, k, options, ctx)
        self.ratio = 0.0  # lambda_c / lambda
        n = self.schedule.n_step
        if ctx.task == "seq2seq":
            self.window = (
                fitted(20000, 30000, ctx.total_steps),
                ctx.total_steps - fitted(7000, 30000, ctx.total_steps),
            )
        else:
            self.window = (2 * n, 5 * n)

    def in_window(self, step: int) -> bool:
        return self.window[0] <= step < self.window[1]

    def regulariser(self) -> torch.Tensor:
        reg = super().regulariser()
        if self.ratio > 0:
            reg = reg + self.lam * self.ratio * r_conc(self.phi, self.slots.layers, self.hc)  # eq. 9
        return reg

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        z, reg, logs = super().gates(step)
        logs["lambda_c"] = self.lam * self.ratio
        return z, reg, logs

    def event(self, step: int) -> bool:
        if self.ctx.task == "seq2seq":
            n = self.schedule.n_step
            return self.in_window(step) and step % n == 0
        return super().event(step)

    def after_step(self, step: int) -> dict[str, Any]:
        logs = super().after_step(step)
        closed_enough = int((self.phi <= -CLIP).sum()) >= self.slots.n - self.k
        if not self.in_window(step) or closed_enough:
            self.ratio = 0.0
        elif self.event(step) or (step == self.window[0]):
            ratio = concentrator_weight(
                self.phi, self.sparsity, self.slots.layers, 1.0, skip=self.phi <= -CLIP, hc=self.hc
            )  # eq. 17 (times lambda in the loss)
            self.ratio = min(ratio, MAX_RATIO)
        return logs

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "ratio": self.ratio}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.ratio = float(state["ratio"])

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "conc_window": list(self.window), "max_ratio": MAX_RATIO}


METHOD = GateMethod(PASSCONC, PassOptions)
