"""FLAP's baseline bias compensation (An et al., Fluctuation-based Adaptive Structured Pruning for Large Language
Models, AAAI 2024, arXiv:2312.11983, §3.4).

Removing the input channels ``R`` of an output projection ``y = W x + b`` (the removed heads' outputs) loses
``W[:, R] x_R``. FLAP replaces it by its value at the channels' mean input over the calibration tokens (the
"baseline"), folded into the bias::

    b' = b + W[:, R] mean(x_R)                                  (§3.4; FLAP's code: (mean * ~mask) @ W^T)

so the cut layer's output is right on average. The means are those the fluctuation scorer already measures
(:meth:`headcut.scoring.fluctuation.Moments.mean`, float64 over the real tokens of the unpruned model).

A projection without a bias gets one where the family's stock config can state it: a config field (``attention
_bias`` in Llama, Qwen3, Gemma, OLMo 2, SmolLM3, ModernBERT) that gives every attention projection a bias; the
other projections then get zero biases (no change), and the config says ``True``, so that the saved model
(stock or headcut's form) is built with them. Where the stock config has no such field (Mistral, Qwen2, Phi-3,
Gemma 4 ...) the compensation is refused before any work, with the reason. A block that lost every head keeps
its output projection, whose bias then carries the whole compensation.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..adapters import Block, adapter_for
from ..errors import HeadcutError
from .projections import weight_out_in
from .surgery import skeleton


def bias_field(model: nn.Module, blocks: list[Block]) -> str | None:
    """The config field to turn on so that every output projection of ``blocks`` has a bias: None where they all
    have one; HeadcutError where some lack one and the stock config has no field for it."""

    base = model.base_model
    if all(getattr(base.get_submodule(b.o), "bias", None) is not None for b in blocks):
        return None
    for name in adapter_for(model).bias_fields:
        if not hasattr(model.config, name):
            continue
        probe = copy.copy(model)  # the field's effect, on a meta build of the family's class
        probe.config = copy.deepcopy(model.config)
        setattr(probe.config, name, True)
        built = skeleton(probe).base_model
        if all(getattr(built.get_submodule(b.o), "bias", None) is not None for b in blocks):
            return name
    family = getattr(model.config, "model_type", "this family")
    raise HeadcutError(
        f"bias compensation needs a bias on the output projections, and {family}'s stock config "
        "cannot give them one (no attention_bias field): prune without it"
    )


def deltas(
    model: nn.Module, blocks: list[Block], keep: dict[str, list[int]], means: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Per block, ``W[:, R] mean(x_R)`` (float64, one value per output feature) for the channels ``R`` of the heads
    ``keep`` (the block's kept query heads, current numbering) drops; blocks that drop nothing are left out."""
    base = model.base_model
    out: dict[str, torch.Tensor] = {}
    for block in blocks:
        kept = set(keep.get(block.name, range(block.heads)))
        removed = [h for h in range(block.heads) if h not in kept]
        if not removed:
            continue
        if block.name not in means:
            raise HeadcutError(f"bias compensation: no mean input for block {block.name}")
        cols = torch.tensor([h * block.head_dim + j for h in removed for j in range(block.head_dim)])
        weight = weight_out_in(base.get_submodule(block.o)).detach().to("cpu", torch.float64)
        out[block.name] = weight[:, cols] @ means[block.name].to(torch.float64)[cols]
    return out


def _linear_parts(mod: nn.Module) -> int:
    """Output features of a projection (Linear or Conv1D)."""
    return int(mod.weight.shape[1] if not isinstance(mod, nn.Linear) else mod.weight.shape[0])


def apply(
    model: nn.Module, blocks: list[Block], added: dict[str, torch.Tensor], field: str | None, modules: Any = None
) -> None:
    """Add ``added`` (from :func:`deltas`) to the output projections' biases of the (cut) ``model`` in place; with
    ``field``, first give every q, k, v and o projection of ``blocks`` that has none a zero bias and set the config
    field. ``modules``: the blocks whose projections exist here (a layer-wise write: one layer at a time)."""
    base = model.base_model
    if field is not None:
        setattr(model.config, field, True)
        for block in blocks if modules is None else modules:
            for path in dict.fromkeys((block.q, block.k, block.v, block.o)):
                mod = base.get_submodule(path)
                if getattr(mod, "bias", None) is None:
                    weight = mod.weight
                    mod.bias = nn.Parameter(
                        torch.zeros(_linear_parts(mod), dtype=weight.dtype, device=weight.device),
                        requires_grad=weight.requires_grad,
                    )
    with torch.no_grad():
        for block in blocks if modules is None else modules:
            delta = added.get(block.name)
            if delta is None:
                continue
            bias = base.get_submodule(block.o).bias
            bias.copy_((bias.detach().to(torch.float64).cpu() + delta).to(bias.dtype))


def check_names(model: nn.Module, field: str | None) -> None:
    """With ``field`` set, the config must build exactly the parameters the compensated model has (names): refuses
    a family whose field adds biases elsewhere (the saved model would not load)."""
    if field is None:
        return

    built = set(skeleton(model).state_dict())
    have = set(model.state_dict())
    if built != have:
        extra = sorted(built ^ have)[0]
        raise HeadcutError(
            f"bias compensation: {field}=True builds other parameters than the compensated model has "
            f"({extra}); prune without it"
        )
