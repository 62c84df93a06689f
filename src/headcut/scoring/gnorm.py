"""``gnorm``: the Gnorm score of Greedy-Gnorm (Guo & Sheridan, arXiv:2602.04491 §3.1.2, eqs. 9-17; the
plain text lost the formulas, these follow the prose and the authors' reference code, ``get_QKV_norm``).

For a scalar objective F of one calibration batch b and a block with weights W_Q, W_K, W_V
(eqs. 9-12), let G_Q^h = dF/dW_Q restricted to head h's rows (its head_dim output features; for a
fused q|k|v projection, the rows of the q section), likewise G_K^h and G_V^h. With grouped-query
attention the K and V blocks are the rows of the head's KV group g = h // group_size.

    N_Q[h] = E ||G_Q^h||_2                          (eqs. 13-16: the expected Frobenius norm)
    Gnorm[h] = N_Q[h] * N_K[h] * N_V[h]             (eq. 17: the element-wise product)

The expectation (``config.per``): ``batch`` (default) takes the norm of the gradient of each batch's
objective and averages over the batches, as the reference code does (it sums the per-batch norms
and divides by the number of sentences instead of batches: a constant factor, so the same ranking);
``example`` takes the norm of each sentence's own gradient and averages over the sentences, as §3.1.2
describes ("we take the expectation over a set of sentences, where each denotes the embedding result
of a single sentence"): one forward and backward per example instead of per batch. The reference
also standardises the final matrix over all heads ((x - mean) / std), which does not change the
ranking and is not applied here.

Objective (``config.objective``): ``"logits-norm"`` (default) is the paper's ("we use [F] as a
scalarization of the model output (e.g., logits norm)") and the reference code's, ``torch.norm(logits)``:
the L2 (Frobenius) norm of the batch's output logits (last hidden state for a base model), label-free;
for per-token outputs only the real (non-pad) positions enter the norm. ``"loss"`` is the task loss
(``model(**batch).loss``; "any differentiable scalar objective (e.g., task loss) can be used").

Weight sharing: weights shared by several blocks (ALBERT's layers) get one gradient, the sum over
the layers that use them, so every block of a sharing group gets the same scores: one mask
position is one head in every layer of the group, as the paper prunes ALBERT.

One forward and one backward per batch (per example with ``per="example"``); ``torch.autograd.grad`` w.r.t. the q, k and v weights
only (no parameter ``.grad`` is created; frozen weights get ``requires_grad`` for the pass).
Greedy-Gnorm re-scores after every removal: that loop belongs to the pruner, this is one scoring.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from .attention_maps import decoder_mask
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
from .weights import head_rows, to_query_heads


def logits_norm(model: nn.Module, out: Any, batch: Batch) -> torch.Tensor:
    """||logits||_2 over the batch (reference: ``torch.norm(outputs.logits)``), real positions only.

    Per-token outputs (B, T, ...) are masked with the mask of the sequence they belong to: the
    decoder's (``decoder_attention_mask`` or ``labels != -100``) for encoder-decoder models when it
    fits, else ``attention_mask`` when it fits; other outputs are used whole."""
    logits = output_logits(out).float()
    if logits.dim() >= 3:
        b, t = logits.shape[:2]
        candidates = [batch.get("attention_mask")]
        if getattr(model.config, "is_encoder_decoder", False):
            candidates.insert(0, decoder_mask(batch))
        for mask in candidates:
            if isinstance(mask, torch.Tensor) and tuple(mask.shape) == (b, t):
                real = (mask != 0).reshape(b, t, *([1] * (logits.dim() - 2)))
                logits = torch.where(real, logits, 0.0)
                break
    return torch.linalg.vector_norm(logits)


def one_example(batch: Batch, i: int, size: int) -> dict[str, Any]:
    """Example ``i`` of a batch of ``size`` as a batch of one (tensors whose first dimension is the
    batch are sliced; anything else is passed as it is)."""
    return {
        k: v[i : i + 1] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == size else v
        for k, v in batch.items()
    }


def gnorm(
    model: nn.Module,
    blocks: list[Block],
    batches: Iterable[Batch] | None,
    config: ScoreConfig,
    progress: Progress | None = None,
) -> RawScores:
    base = model.base_model
    weights: dict[int, nn.Parameter] = {}
    for block in blocks:
        for part in "qkv":
            w = base.get_submodule(block.rows(part).path).weight
            weights.setdefault(id(w), w)
    params = list(weights.values())
    frozen = [p for p in params if not p.requires_grad]
    sums = {
        b.name: {part: torch.zeros(b.heads if part == "q" else b.kv_heads, dtype=torch.float64) for part in "qkv"}
        for b in blocks
    }
    terms = 0
    examples = 0

    def accumulate(batch: Batch) -> None:
        out = model(**batch)
        objective = task_loss(out, "gnorm") if config.objective == "loss" else logits_norm(model, out, batch)
        grads = dict(zip(weights, torch.autograd.grad(objective, params, allow_unused=True)))
        for block in blocks:
            for part in "qkv":
                rows = block.rows(part)
                mod = base.get_submodule(rows.path)
                grad = grads[id(mod.weight)]
                if grad is None:  # a block without heads takes no part in the forward
                    continue
                count = block.heads if part == "q" else block.kv_heads
                g = head_rows(mod, grad.detach(), count, block.head_dim, rows.offset, rows.stride, rows.order)
                sums[block.name][part] += torch.linalg.vector_norm(g.float(), dim=1).double().cpu()  # eqs. 9-12, 16

    try:
        for p in frozen:
            p.requires_grad_(True)
        with scoring_mode(model):
            for batch in calibration(batches, "gnorm", model_device(model), progress):
                size = batch_size(batch)
                parts = [batch] if config.per == "batch" else [one_example(batch, i, size) for i in range(size)]
                for part in parts:
                    accumulate(part)
                terms += len(parts)
                examples += size
    finally:
        for p in frozen:
            p.requires_grad_(False)
    scores = {}
    for block in blocks:
        n = {part: s / max(terms, 1) for part, s in sums[block.name].items()}  # eqs. 13-15: the expectation
        scores[block.name] = n["q"] * to_query_heads(block, n["k"]) * to_query_heads(block, n["v"])  # eq. 17
    return RawScores(scores, examples)


SCORER = Scorer(
    name="gnorm",
    fn=gnorm,
    needs_data=True,
    higher_is_important=True,
)
