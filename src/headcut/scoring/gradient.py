"""``gradient``: Michel et al.'s head importance, as Li, Cotterell & Sachan state it (arXiv:2108.04657,
sec. 4.2.1, eq. 21):

    iota_h = 1/M * sum_{m=1..M} | dL(y_m, x_m) / dg_h |    at g = 1

where g_h is a gate multiplying head h's output (:class:`headcut.HeadGates`) and L the task loss
(``model(**batch).loss``). Two variants (``config.abs_per``):

* ``"example"`` (eq. 21): the absolute value per example. Every example gets its own copy of the
  gates (shape (B, heads)); examples do not interact in eval mode, so the gradient of the batch loss
  w.r.t. example i's gates is w_i * dL_i/dg, where L_i is the loss the model gives example i alone
  and w_i its weight in the batch loss. One backward of the batch loss per batch gives every
  example's dL_i/dg = grad_i / w_i. Weights: sequence-level tasks (one label per example) average
  over examples, w_i = 1/B; token-level tasks (labels per token) average over the N labelled tokens
  of the batch, w_i = n_i / N with n_i example i's labelled tokens. Whether the model shifts token
  labels (causal LMs predict the next token) is read off the loss itself: the cross-entropy is
  recomputed from the logits with and without the shift and the alignment that reproduces
  ``outputs.loss`` is used; if neither does (a custom loss), scoring stops with an error that
  suggests ``abs_per="batch"``. Examples without labelled tokens are skipped.
* ``"batch"`` (TextPruner): per batch the absolute value of the gradient of the batch's mean loss
  w.r.t. shared gates, | dL_batch/dg_h |, averaged over batches.

One forward and one backward per batch; ``torch.autograd.grad`` w.r.t. the gates only (no
parameter ``.grad`` is created). A layer called several times (ALBERT's shared layers) gets one gate
vector per call, so each layer gets its own score.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..adapters import Block
from ..errors import HeadcutError
from ..model.gating import HeadGates
from .base import (
    Batch,
    Progress,
    RawScores,
    ScoreConfig,
    Scorer,
    batch_size,
    calibration,
    model_device,
    output_logits,
    scoring_mode,
    task_loss,
)

IGNORE = -100


def _token_weights(logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """w_i = n_i / N for a token-level loss; the label alignment (shift 0 or 1) is the one whose
    mean cross-entropy reproduces the model's loss."""
    target = float(loss)
    best: tuple[float, torch.Tensor] | None = None
    for shift in (0, 1):
        lg = logits[:, : logits.shape[1] - shift] if shift else logits
        lb = labels[:, shift:]
        real = lb != IGNORE
        total = int(real.sum())
        if total == 0:
            continue
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), lb.reshape(-1), ignore_index=IGNORE, reduction="sum")
        err = abs(float(ce) / total - target)
        if err <= 1e-3 * max(1.0, abs(target)) and (best is None or err < best[0]):
            best = (err, real.sum(dim=1).float() / total)
    if best is None:
        raise HeadcutError(
            "cannot split the model's loss into per-example losses (it is not the mean token cross-entropy of "
            'the labels); use abs_per="batch"'
        )
    return best[1]


def example_weights(out: Any, batch: Batch) -> torch.Tensor:
    """(B,) weights w_i with ``outputs.loss = sum_i w_i L_i`` (L_i: example i's own loss)."""
    labels = batch.get("labels")
    if not isinstance(labels, torch.Tensor):
        raise HeadcutError("the gradient scorer needs labels in every calibration batch")
    logits = output_logits(out).detach()
    b = labels.shape[0]
    token_level = logits.dim() == 3 and labels.dim() == 2 and not labels.is_floating_point()
    if not token_level:
        return torch.full((b,), 1.0 / b, device=logits.device)  # mean over examples
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise HeadcutError(
            f"token labels of shape {tuple(labels.shape)} do not match the logits {tuple(logits.shape[:2])}; "
            'use abs_per="batch"'
        )
    return _token_weights(logits, labels, task_loss(out, "gradient").detach())


def per_example_gate_grads(
    model: nn.Module,
    gates: HeadGates,
    blocks: list[Block],
    batch: Batch,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """dL_i/dg for every example of ``batch`` and every block, from ONE backward: (B, heads) per
    block, and the examples' weights w_i (examples with w_i = 0 have no loss and zero rows).
    ``gates`` must be installed on ``model``."""
    b = batch_size(batch)
    device = model_device(model)
    for block in blocks:
        gates.gates[block.name] = torch.ones(b, block.heads, device=device, requires_grad=True)
    out = model(**batch)
    loss = task_loss(out, "gradient")
    weights = example_weights(out, batch)
    grads = torch.autograd.grad(loss, [gates.gates[bl.name] for bl in blocks], allow_unused=True)
    scale = torch.where(weights > 0, 1.0 / weights.clamp(min=1e-30), 0.0)[:, None]
    result = {}
    for block, grad in zip(blocks, grads):
        g = torch.zeros(b, block.heads, device=device) if grad is None else grad.detach()
        result[block.name] = g.float() * scale  # dL_i/dg = (dL/dg_i) / w_i
    return result, weights


def gradient(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    per_example = config.abs_per == "example"
    gates = HeadGates(model, requires_grad=True)
    device = model_device(model)
    sums = {b.name: torch.zeros(b.heads, dtype=torch.float64) for b in blocks}
    count = 0  # examples with a loss ("example") or batches ("batch")
    examples = 0
    with scoring_mode(model), gates.installed():
        for batch in calibration(batches, "gradient", device, progress):
            if per_example:
                grads, weights = per_example_gate_grads(model, gates, blocks, batch)
                real = weights > 0
                for name, g in grads.items():
                    sums[name] += g[real].abs().sum(dim=0).double().cpu()  # sum_m |dL_m/dg_h|
                count += int(real.sum())
            else:
                for block in blocks:
                    gates.gates[block.name] = torch.ones(block.heads, device=device, requires_grad=True)
                loss = task_loss(model(**batch), "gradient")
                grads = torch.autograd.grad(loss, [gates.gates[b.name] for b in blocks], allow_unused=True)
                for block, grad in zip(blocks, grads):
                    if grad is not None:
                        sums[block.name] += grad.detach().abs().double().cpu()  # |dL_batch/dg_h|
                count += 1
            examples += batch_size(batch)
    return RawScores({n: s / max(count, 1) for n, s in sums.items()}, examples)


SCORER = Scorer(
    name="gradient",
    fn=gradient,
    needs_data=True,
    higher_is_important=True,
)
