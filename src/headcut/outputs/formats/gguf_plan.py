"""What a GGUF export plan is made of: the tensors to write (:class:`Tensor`, made when written), their
layers, the rope pairing of query/key rows, and the :class:`Plan` a family fills for the writer (:mod:`.gguf`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ...adapters import Block
from ...errors import HeadcutError


@dataclass
class Layer:
    """One layer's attention as written: query and KV heads (``placeholder``: one zero head standing
    in for none, ``deci`` only)."""

    heads: int
    kv_heads: int
    placeholder: bool = False


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # torch layout (out, in) or (n,)
    get: Callable[[], np.ndarray]  # float32 values in that shape


@dataclass
class Rope:
    """How llama.cpp rotates: ``n_rot`` leading values of each head, frequencies ``base ** (-2i / n_rot)``
    divided by ``factor`` (linear scaling) and by ``freqs`` (per-frequency divisors, the ``rope_freqs``
    tensor); sliding-window layers use ``base_swa`` where the architecture has one."""

    n_rot: int
    base: float
    factor: float = 1.0
    base_swa: float | None = None
    freqs: np.ndarray | None = None


def values(
    t: torch.Tensor, rows: np.ndarray | None = None, shift: float = 0.0, scale: np.ndarray | None = None
) -> Callable[[], np.ndarray]:
    """A tensor's float32 values (rows picked, ``shift`` added, rows multiplied by ``scale``), read when
    written."""

    def get() -> np.ndarray:
        arr = t.detach().to("cpu", torch.float32).numpy()
        if rows is not None:
            arr = arr[rows]
        if shift:
            arr = arr + np.float32(shift)
        if scale is not None:
            arr = arr * scale.reshape((-1,) + (1,) * (arr.ndim - 1)).astype(np.float32)
        return np.ascontiguousarray(arr, dtype=np.float32)

    return get


def zeros(*shape: int) -> Callable[[], np.ndarray]:
    return lambda: np.zeros(shape, dtype=np.float32)


def rope_pairs(heads: int, head_dim: int) -> np.ndarray:
    """Row order taking transformers' rotary layout (per head: first halves, then second halves of the
    pairs) to llama.cpp's ``norm`` rope (per head: the two values of each pair side by side)."""
    half = head_dim // 2
    per_head = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    return (np.arange(heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


def head_rows(block: Block, part: str, heads: int) -> np.ndarray:
    """The output rows of ``part`` (q, k or v) of ``block`` in its projection, head after head (fused
    projections and projections that keep removed heads included: the adapter's :meth:`Block.rows`)."""
    where = block.rows(part)
    d = block.head_dim
    order = np.array(where.order if where.order is not None else range(heads), dtype=np.int64)[:heads]
    return (where.offset + order[:, None] * (where.stride or d) + np.arange(d)[None, :]).reshape(-1)


def fail(message: str) -> HeadcutError:
    return HeadcutError(f"--format gguf: {message}")


class Plan:
    """The tensors of one file in order, and the model parameters they read (so that a parameter the
    architecture has no place for is refused, not silently dropped)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tensors: list[Tensor] = []
        self.read: set[int] = set()

    @staticmethod
    def name(kind: str, bid: int | None = None, suffix: str = "weight") -> str:
        """The file's name of tensor ``kind`` (a gguf-py ``MODEL_TENSOR`` member name) of block ``bid``."""
        import gguf

        base = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, kind)]
        return (base.format(bid=bid) if bid is not None else base) + "." + suffix

    def add(self, kind: str, bid: int | None, t: torch.Tensor, suffix: str = "weight", **how: Any) -> None:
        rows = how.get("rows")
        shape = tuple(t.shape) if rows is None else (len(rows),) + tuple(t.shape[1:])
        self.tensors.append(Tensor(self.name(kind, bid, suffix), shape, values(t, **how)))
        self.read.add(id(t))

    def add_zeros(self, kind: str, bid: int | None, shape: tuple[int, ...], suffix: str = "weight") -> None:
        self.tensors.append(Tensor(self.name(kind, bid, suffix), shape, zeros(*shape)))

    def module(self, path: str, bid: int | None = None) -> nn.Module:
        """The module at ``path`` inside layer ``bid`` (None: inside the base model)."""
        base = self.model.base_model
        return (base.layers[bid] if bid is not None else base).get_submodule(path)

    def skip(self, module: nn.Module) -> None:
        """``module``'s parameters have no place in the file, on purpose (a layer without attention)."""
        self.read.update(id(p) for p in module.parameters())

    def unread(self) -> list[str]:
        return [name for name, p in self.model.named_parameters() if id(p) not in self.read]
