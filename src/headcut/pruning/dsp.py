"""``dsp``: Differentiable Subset Pruning (Li, Cotterell, Sachan; DSP, arXiv:2108.04657, §3.2-3.3, §4.3).

Head importance iota_h = exp(w_h) (eq. 20) with learned logits w. Every step draws Gumbel noise
n_h ~ Gumbel(0, 1) and relaxes the Gumbel-top-K of r = w + n (eq. 9-13) into a soft K-hot mask::

    g^(1) = softmax(r^(1) / tau),  r^(1) = r                         (eq. 14, 17)
    r^(k+1) = r^(k) + log(1 - g^(k))                                   (eq. 18)
    m = sum_{k=1..K} g^(k)                                             (eq. 19)

which gates the heads (plugged into the gated attention of eq. 2; one draw per step, shared by the
batch). The mask sums to K, so the budget is met by construction and no regulariser is needed.
The temperature cools log-linearly (eq. 24)::

    log tau = log tau_ini - min(n / N_cooldown, 1) * (log tau_ini - log tau_end)

Defaults: Table 2 (BERT column: tau_ini 1000, tau_end 1e-8, N_cooldown 25,000, lr of w 0.5; the
Enc-Dec column, tau_ini 0.1, N_cooldown 15,000, lr 0.2, for sequence-to-sequence models). Table 2's
N_cooldown is 68 % of the paper's BERT run (25,000 of 3 MNLI epochs = 36,816 steps at batch 32; the
reference README's pipelined run cools in 8,333 of 12,272 steps, the same share): a run shorter than
N_cooldown / 0.68 steps cools over the same 68 % of its steps (``--cooldown`` sets it). w starts
from U(-b, b) with Xavier's bound over (blocks, heads) as in the reference code. ``--mode joint``
(default; the model is trained with w, §3.3) or ``pipelined`` (w only, on the trained model: 1
epoch by default, §4.3). Final mask: the top-K heads by w_h (PASS §4.1.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..learned import TemperatureSchedule, gumbel_soft_topk, soft_topk
from ..options import option
from .gate_training import Context, GateLearner, GateMethod, GateOptions, Slots, fitted, uniform_init, xavier_bound

#: Table 2's N_cooldown as a share of the paper's run (25,000 / 36,816)
COOLDOWN_SHARE = 25000 / 36816


def temperature_schedule(task: str, total_steps: int, cooldown: int | None) -> TemperatureSchedule:
    """Table 2's column for the task, with N_cooldown fitted to the run (see the module's doc)."""
    column = TemperatureSchedule.enc_dec() if task == "seq2seq" else TemperatureSchedule.bert()
    if cooldown is None:
        cooldown = fitted(column.n_cooldown, round(column.n_cooldown / COOLDOWN_SHARE), total_steps)
    return TemperatureSchedule(tau_ini=column.tau_ini, tau_end=column.tau_end, n_cooldown=cooldown)


def init_logits(slots: Slots, seed: int) -> torch.Tensor:
    """w ~ U(-b, b), b = Xavier's bound of a (blocks, heads per block) matrix."""
    layers, heads = len(slots.layers), max(slots.heads_per_layer)
    return uniform_init(slots.n, xavier_bound(heads, layers), seed)


@dataclass
class DSPOptions(GateOptions):
    """DSP: the gate-training options plus ``cooldown``, eq. 24's N_cooldown (None: 25,000, or 68 % of a
    shorter run)."""

    cooldown: int | None = option(
        None, low=1, help="Temperature cooldown steps, eq. 24's N_cooldown (default 25,000, or 68 % of a shorter run)."
    )


class DSP(GateLearner):
    name = "dsp"
    ranking = "w_h (importance logit)"

    def __init__(self, slots: Slots, k: int, options: GateOptions, ctx: Context) -> None:
        super().__init__(slots, k, options, ctx)
        self.w = init_logits(slots, ctx.seed)
        self.schedule = temperature_schedule(ctx.task, ctx.total_steps, getattr(options, "cooldown", None))
        self._tau = self.schedule.tau_ini

    @staticmethod
    def default_gate_lr(task: str) -> float:
        return 0.2 if task == "seq2seq" else 0.5  # Table 2, lr for w_h

    def parameters(self) -> list[torch.Tensor]:
        return [self.w]

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        self._tau = self.schedule(step)  # eq. 24
        m = gumbel_soft_topk(self.w.to(torch.float64), self.k, self._tau)  # eq. 14-19 on w + Gumbel noise
        return m.to(torch.float32), None, {"tau": self._tau}

    def importance(self) -> torch.Tensor:
        return self.w.detach().clone()

    def open_slots(self) -> torch.Tensor:
        """Heads whose noise-free soft mask at the current temperature exceeds 0.5."""
        return soft_topk(self.w.detach().to(torch.float64), self.k, self._tau) > 0.5

    def hyperparameters(self) -> dict[str, Any]:
        s = self.schedule
        return {
            "tau_ini": s.tau_ini,
            "tau_end": s.tau_end,
            "n_cooldown": s.n_cooldown,
            "k_slots": self.k,
            "gate_lr": self.options.gate_lr,
        }


METHOD = GateMethod(DSP, DSPOptions)
