"""Perplexity as the LLM studies measure it (``benchmarks/studies/peer_llm.py``, ``decoder_recipe.py``): the same
function for every row, so their columns compare. torch only (it runs in the peers' environments too)."""

from __future__ import annotations

import math

import torch


def perplexity(
    model: torch.nn.Module, ids: torch.Tensor, window: int, tokens_per_batch: int = 2048, bos: int | None = None
) -> float:
    """exp of the mean next-token loss over ``ids`` (1-D) cut into non-overlapping windows of ``window`` tokens
    (the remainder dropped), every window its own input: the loss of every next token in each window, weighted
    by tokens. With ``bos`` (for a model whose tokenizer starts every text with it, as Gemma's does: without it
    Gemma 3's perplexity is several times higher), each window is read after that token and every one of the
    window's tokens is predicted (the first one from ``bos`` alone)."""
    n = ids.numel() // window * window
    windows = ids[:n].view(-1, window)
    if bos is not None:
        windows = torch.cat([torch.full((len(windows), 1), bos, dtype=windows.dtype), windows], dim=1)
    per_batch = max(1, tokens_per_batch // window)
    nll, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(windows), per_batch):
            x = windows[start : start + per_batch]
            logits = model(input_ids=x, use_cache=False).logits[:, :-1].float()
            nll += float(
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
                )
            )
            count += x[:, 1:].numel()
    return math.exp(nll / count)
