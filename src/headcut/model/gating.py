"""Differentiable per-head gates on any supported model.

A forward pre-hook on each block's output projection multiplies head ``h``'s slice of the
projection input (the concatenated head outputs, shape (B, T, heads * head_dim)) by ``g[h]``. A gate
of 0 removes the head exactly; gradients with respect to the gates are the Michel et al. importance
scores. Gates may be shared by the whole batch (shape ``(heads,)``) or given per example (shape
``(batch, heads)``).

A module called several times per forward (ALBERT's shared layer) gets one gate vector per call, in
layer order: a counter per module, reset at every forward of the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..adapters import Block, adapter_for
from .masks import HeadMask, resolve_mask


class HeadGates:
    """Gates for every block of ``model``; install them with ``with gates.installed(): ...``.

    ``gates[name]`` is a tensor of shape (heads,) or (batch, heads). By default gates are ones and
    need no gradient; pass ``requires_grad=True`` for learnable/scored gates.
    """

    def __init__(self, model: nn.Module, requires_grad: bool = False, init: float = 1.0) -> None:
        self.model = model
        self.blocks: list[Block] = adapter_for(model).blocks(model.base_model)
        param = next(model.parameters())
        self.gates: dict[str, torch.Tensor] = {
            b.name: torch.full((b.heads,), float(init), device=param.device, requires_grad=requires_grad)
            for b in self.blocks
        }

    def set_mask(self, mask: HeadMask | dict[str, Any]) -> None:
        """Set gates to 1 for kept heads and 0 for the others."""
        resolved = resolve_mask(mask, self.blocks)
        for b in self.blocks:
            g = torch.zeros(b.heads, device=self.gates[b.name].device)
            g[resolved.keep[b.name]] = 1.0
            self.gates[b.name] = g.requires_grad_(self.gates[b.name].requires_grad)

    def parameters(self) -> list[torch.Tensor]:
        return [self.gates[b.name] for b in self.blocks]

    @contextmanager
    def installed(self) -> Iterator[HeadGates]:
        """Install the gate hooks for the duration of the block."""
        base = self.model.base_model
        by_module: dict[str, list[Block]] = {}
        for b in self.blocks:
            by_module.setdefault(b.o, []).append(b)
        counters: dict[str, int] = {path: 0 for path in by_module}
        handles = []

        def reset(_module: nn.Module, _args: Any) -> None:
            for path in counters:
                counters[path] = 0

        def make_hook(path: str, blocks: list[Block]):
            def hook(_module: nn.Module, args: tuple) -> tuple:
                block = blocks[counters[path] % len(blocks)]
                counters[path] += 1
                x = args[0]
                g = self.gates[block.name].to(device=x.device, dtype=x.dtype)  # FSDP: gates in CPU memory
                if block.heads == 0:
                    return None
                shape = x.shape
                xh = x.reshape(*shape[:-1], block.heads, block.head_dim)
                gv = g.reshape(g.shape[0], *([1] * (xh.dim() - 3)), block.heads, 1) if g.dim() == 2 else g[:, None]
                return (((xh * gv).reshape(shape)),) + tuple(args[1:])

            return hook

        handles.append(self.model.register_forward_pre_hook(reset))
        if base is not self.model:
            handles.append(base.register_forward_pre_hook(reset))
        for path, blocks in by_module.items():
            handles.append(base.get_submodule(path).register_forward_pre_hook(make_hook(path, blocks)))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


@contextmanager
def gated(model: nn.Module, mask: HeadMask | dict[str, Any]) -> Iterator[HeadGates]:
    """Run ``model`` with the heads outside ``mask`` gated to zero (no structural change)."""
    gates = HeadGates(model)
    gates.set_mask(mask)
    with gates.installed():
        yield gates
