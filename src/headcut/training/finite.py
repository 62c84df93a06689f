"""Finite-value checks: of the trained tensors after each step (:func:`all_finite`, one fused reduction) and of
nested states (:func:`first_nonfinite`: which tensor holds a nan or an inf)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .parallel import is_dtensor, whole


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite: one fused max-abs reduction per device and dtype
    (a nan or inf anywhere makes it nan or inf) and one synchronisation."""
    # empty tensors (the projections of a block cut to zero heads) hold nothing to check, and an inf-norm
    # of one has no identity
    tensors = [t.detach() for t in tensors if (t.is_floating_point() or t.is_complex()) and t.numel()]
    sharded = [t for t in tensors if is_dtensor(t)]  # FSDP's shards: every process checks its own, together
    plain = [t for t in tensors if not is_dtensor(t)]
    with torch.no_grad():
        return all(
            bool(torch.isfinite(whole(torch.nn.utils.get_total_norm(group, norm_type=math.inf))))
            for group in (sharded, plain)
            if group
        )


def first_nonfinite(value: Any, name: str = "", floats: bool = False) -> str | None:
    """The dotted name of the first floating tensor (with ``floats``: or Python float) in nested dicts/lists
    ``value`` that holds a nan or an inf (``name`` itself for a bare one); None when every one is finite."""
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            return name or "a tensor"
        return None
    if floats and isinstance(value, float) and not math.isfinite(value):
        return name or "a number"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = first_nonfinite(item, f"{name}.{key}" if name else str(key), floats)
        if found is not None:
            return found
    return None
