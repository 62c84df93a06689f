"""AUBER's units and state (:mod:`headcut.pruning.auber`, steps 2 and 3): the heads each action removes (one head,
or a whole KV group) and a layer's state ("State representation", Theorem 1, eqs. 5-19: each unit's value-matrix
L1 norm, or an ablation of Table 3, standardised over the layer and passed through a softmax)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import HeadcutError
from ...scoring.weights import block_rows
from ..units import BlockSet


def units_of(s: BlockSet) -> list[list[int]]:
    """The heads each action removes (in every block of the set): one head, or a whole KV group."""
    if s.mode == "group":
        return [list(range(j * s.group_size, (j + 1) * s.group_size)) for j in range(s.heads // s.group_size)]
    if s.mode != "head":
        raise HeadcutError(f"auber prunes single heads or whole KV groups, not --gqa {s.mode}")
    return [[h] for h in range(s.heads)]


def unit_norms(model: nn.Module, s: BlockSet, units: list[list[int]], state: str) -> torch.Tensor:
    """The norm of each unit's ``state`` matrix (value, query or key; L1, or L2 for ``value-l2``), read
    off the set's first block (blocks of a set share their weights)."""
    block = s.blocks[0]
    part = {"value-l1": "v", "value-l2": "v", "query": "q", "key": "k"}[state]
    with torch.no_grad():
        rows = block_rows(model.base_model, block, part).float()  # (heads in that projection, head_dim * in)
        squares = state == "value-l2"
        per = rows.pow(2).sum(dim=1) if squares else rows.abs().sum(dim=1)
        # a query head h owns q row h; a KV projection's row g serves query heads g*gs .. (g+1)*gs - 1
        owner = (lambda h: h) if part == "q" else (lambda h: h // block.group_size)
        out = []
        for unit in units:
            rows_of_unit = sorted({owner(h) for h in unit})
            total = float(per[rows_of_unit].sum())
            out.append(math.sqrt(total) if squares else total)
    return torch.tensor(out, dtype=torch.float32)


def initial_state(norms: torch.Tensor) -> torch.Tensor:
    """Standardise the norms over the layer (population std, as scikit-learn's StandardScaler; a
    constant layer gives zeros), then softmax ("State representation")."""
    std = norms.std(unbiased=False)
    z = (norms - norms.mean()) / std if float(std) > 0 else torch.zeros_like(norms)
    return torch.softmax(z, dim=0)
