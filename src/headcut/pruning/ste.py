"""``ste``: DSP's straight-through-estimator baseline (paper 000, §4.2.3).

"The Gumbel soft top-K in joint DSP is replaced with hard top-K, while the hard top-K function is
back-propagated through as if it had been the identity function": the forward pass gates the heads
with the exact K-hot mask of the logits w (so every step trains exactly the K heads of the moment),
and d mask / d w = I. No Gumbel noise and no temperature: the reference code of the paper draws none
in its STE mode. Logits, their initialisation and learning rate (0.5; 0.2 for sequence-to-sequence)
as DSP (Table 2). Joint by default; the final mask is the top-K heads by w_h.
"""

from __future__ import annotations

from typing import Any

import torch

from ..learned import hard_topk, straight_through_topk
from .dsp import DSP


class STE(DSP):
    """DSP's logits, initialisation and learning rates; hard top-K forward, identity backward."""

    name = "ste"
    summary = "learned: hard top-K gates with straight-through gradients, exactly K heads (DSP's STE baseline)"

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        return straight_through_topk(self.w, self.k), None, {}  # §4.2.3

    def open_slots(self) -> torch.Tensor:
        return hard_topk(self.w.detach(), self.k) > 0.5

    def hyperparameters(self) -> dict[str, Any]:
        return {"k_slots": self.k, "gate_lr": self.options.gate_lr}
