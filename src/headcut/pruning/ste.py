"""``ste``: DSP's straight-through-estimator baseline (Li, Cotterell & Sachan, TACL 2021, arXiv:2108.04657
§4.2.3).

"The Gumbel soft top-K in joint DSP is replaced with hard top-K, while the hard top-K function is
back-propagated through as if it had been the identity function": the forward pass gates the heads
with the exact K-hot mask of the logits w (so every step trains exactly the K heads of the moment),
and d mask / d w = I. Logits, their initialisation and learning rate (0.5; 0.2 for sequence-to-sequence)
as DSP (Table 2). Joint by default; the final mask is the top-K heads by w_h.

**Where headcut departs from the paper's text:** read literally, "the Gumbel soft top-K ... is replaced
with hard top-K" could keep the Gumbel noise (a hard top-K of w + n, eq. 9-13) and only drop the soft
relaxation. headcut takes the hard top-K of w itself, without noise and without a temperature, as the
authors' reference code does in its STE mode: the baseline then isolates the straight-through
gradient, and its mask is deterministic.
"""

from __future__ import annotations

from typing import Any

import torch

from ..learned import hard_topk, straight_through_topk
from .dsp import DSP
from .gate_training import GateMethod


class STE(DSP):
    """DSP's logits, initialisation and learning rates; hard top-K forward, identity backward."""

    name = "ste"

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        return straight_through_topk(self.w, self.k), None, {}  # §4.2.3

    def open_slots(self) -> torch.Tensor:
        return hard_topk(self.w.detach(), self.k) > 0.5

    def hyperparameters(self) -> dict[str, Any]:
        return {"k_slots": self.k, "gate_lr": self.options.gate_lr}


METHOD = GateMethod(STE)
