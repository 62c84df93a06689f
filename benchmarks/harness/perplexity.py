"""Perplexity as the LLM studies measure it (``benchmarks/studies/peer_llm.py``, ``decoder_recipe.py``,
``kv_budget.py``): the same function for every row, so their columns compare, reading its windows with headcut's
own rule (:func:`headcut.data.windows.window_tensors`, the one ``headcut eval --windows`` reads them with).
torch and that module only: it runs in the peers' environments too (with headcut's ``src/`` on their path)."""

from __future__ import annotations

import math

import torch

from headcut.data.windows import window_tensors


def perplexity(
    model: torch.nn.Module, ids: torch.Tensor, window: int, tokens_per_batch: int = 2048, bos: int | None = None
) -> float:
    """exp of the mean next-token loss over ``ids`` (1-D, no special tokens) cut into non-overlapping windows of
    ``window`` tokens (the remainder dropped), every window its own input, the loss weighted by tokens. With
    ``bos`` (for a model whose tokenizer starts every text with it, as Gemma's does: without it Gemma 3's
    perplexity is several times higher), each window is read after that token and every one of the window's
    tokens is predicted (the first one from ``bos`` alone); without it, all but the window's first."""
    inputs, labels = window_tensors(ids, window, [] if bos is None else [bos])
    per_batch = max(1, tokens_per_batch // window)
    nll, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(inputs), per_batch):
            x, y = inputs[start : start + per_batch], labels[start : start + per_batch, 1:]
            logits = model(input_ids=x, use_cache=False).logits[:, :-1].float()
            nll += float(
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum"
                )
            )
            count += int((y != -100).sum())
    return math.exp(nll / count)
