"""What a decoder reads per generated token (:class:`Shape`), and a cache of random keys and values of its shapes,
so that decoding at a long context is timed without a prefill (``benchmarks/studies/long_context.py``,
``kv_budget.py``): the speed does not depend on the values."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


@dataclass
class Shape:
    """What a model reads per generated token."""

    kv_heads: list[int]
    head_dim: int
    windows: list[int | None]  # per layer: the sliding window or None (global)
    weight_values_2d: int  # values of the matrices read per token (linear weights incl. the LM head; one embedding row)
    weight_values_1d: int  # norms, biases
    dtype_bytes: int


def model_shape(model: Any) -> Shape:
    import torch
    from torch import nn

    import headcut

    config = model.config
    blocks = headcut.model_blocks(model)
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    windows = [config.sliding_window if t == "sliding_attention" else None for t in types]
    two = one = 0
    counted: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            two += mod.weight.numel()
            counted.add(id(mod.weight))
            if mod.bias is not None:
                one += mod.bias.numel()
                counted.add(id(mod.bias))
    for mod in model.modules():
        if isinstance(mod, nn.Embedding):
            two += mod.embedding_dim  # one row looked up
            counted.add(id(mod.weight))
    for p in model.parameters():
        if id(p) not in counted:
            one += p.numel()
            counted.add(id(p))
    dtype = next(model.parameters()).dtype
    return Shape(
        kv_heads=[b.kv_heads for b in blocks],
        head_dim=blocks[0].head_dim,
        windows=windows,
        weight_values_2d=two,
        weight_values_1d=one,
        dtype_bytes=torch.finfo(dtype).bits // 8,
    )


def random_cache(model: Any, shape: Shape, length: int, seed: int = 0) -> tuple[Any, int]:
    """A cache of ``length`` positions of random keys and values with the model's per-layer KV heads (an emptied
    layer: headcut's one-value placeholder), and a random first token."""
    import torch
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    cache = DynamicCache(config=model.config)
    for i, k in enumerate(shape.kv_heads):
        dims = (1, k, length, shape.head_dim) if k else (1, 1, length, 1)
        key = torch.randn(dims, generator=gen).to(dtype)
        value = torch.randn(dims, generator=gen).to(dtype)
        cache.update(key, value, i)
    token = int(torch.randint(3, 49152, (1,), generator=gen))
    return cache, token


def fresh_copy(cache: Any) -> Any:
    """A copy of a cache whose tensors are contiguous copies of the positions it holds (a sliding layer's keys
    are a view into a larger concatenation after prefill)."""
    import torch

    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        c = copy.copy(layer)
        if getattr(layer, "is_initialized", True) and isinstance(getattr(layer, "keys", None), torch.Tensor):
            c.keys = layer.keys.clone()
            c.values = layer.values.clone()
        new.layers.append(c)
    return new
