"""The adapter interface: everything headcut knows about one model family.

Scorers, pruners, gating and slimming are written against :class:`Adapter` and :class:`Block` and
never name a model family. An adapter reads the model's current structure (so a slimmed model can
be slimmed again) and turns a cut into runtime ops (see :mod:`headcut.runtime`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn


@dataclass(frozen=True)
class Block:
    """One attention block (one attention module in one layer).

    Paths are relative to ``model.base_model``. ``q``, ``k`` and ``v`` may name the same fused
    module (GPT-2), in which case ``fused_qkv`` is true. ``o`` is the output projection whose input
    is the concatenation of the per-head outputs (B, T, heads * head_dim): gates act there.
    ``shared`` names the weight-sharing group (ALBERT: every layer of a group shares one module).
    """

    name: str
    kind: str
    layer: int
    heads: int
    kv_heads: int
    head_dim: int
    attn: str
    q: str
    k: str
    v: str
    o: str
    fused_qkv: bool = False
    shared: str | None = None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 without grouped-query attention)."""
        return self.heads // self.kv_heads if self.kv_heads else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "layer": self.layer,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
        }


@dataclass(frozen=True)
class BlockCut:
    """What to keep in one block, in the block's *current* head numbering.

    ``q``: kept query heads, in order. ``kv``: the KV head serving each kept KV slot (repeats mean
    duplication). ``groups``: query heads per KV slot after the cut."""

    q: tuple[int, ...]
    kv: tuple[int, ...]
    groups: int = 1


@dataclass
class EmptyStyle:
    """How a block without heads is wired (see runtime.HeadcutEmptyAttention)."""

    o: str | None = None
    dropout: str | None = None
    norm: str | None = None
    cache: bool = False
    outputs: int = 2

    def attrs(self) -> dict[str, Any]:
        return {
            "_hc_o": self.o, "_hc_dropout": self.dropout, "_hc_norm": self.norm,
            "_hc_cache": self.cache, "_hc_outputs": self.outputs,
        }


def rows_op(path: str, heads: list[int], head_dim: int, sections: int = 1) -> dict[str, Any]:
    return {"op": "rows", "path": path, "heads": list(heads), "head_dim": head_dim, "sections": sections}


def cols_op(path: str, heads: list[int], head_dim: int) -> dict[str, Any]:
    return {"op": "cols", "path": path, "heads": list(heads), "head_dim": head_dim}


def set_op(path: str, **attrs: Any) -> dict[str, Any]:
    return {"op": "set", "path": path, "attrs": attrs}


def mixin_op(path: str, mixin: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {"op": "mixin", "path": path, "mixin": mixin, "attrs": attrs}


def out_features(mod: nn.Module) -> int:
    """Output width of a Linear or Conv1D projection."""
    if isinstance(mod, nn.Linear):
        return mod.weight.shape[0]
    return mod.weight.shape[1]


def make_block(
    base: nn.Module, name: str, kind: str, layer: int, head_dim: int,
    attn: str, q: str, k: str, v: str, o: str, shared: str | None = None,
) -> Block:
    """A Block whose head counts are read off the current widths of its q and k projections
    (paths relative to ``base``; a fused q|k|v projection, given as q == k == v, is a third each)."""
    fused = q == k
    parts = 3 if fused else 1
    heads = out_features(base.get_submodule(q)) // parts // head_dim
    kv_heads = out_features(base.get_submodule(k)) // parts // head_dim
    return Block(
        name=name, kind=kind, layer=layer, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        attn=attn, q=q, k=k, v=v, o=o, fused_qkv=fused, shared=shared,
    )


def stack_blocks(
    base: nn.Module, layers: str, attn: str, q: str, k: str, v: str, o: str, head_dim: str,
    kind: str = "self",
) -> list[Block]:
    """Blocks ``{kind}.{i}`` of one stack of layers (the module list at ``layers``; none if absent).

    ``attn`` (the attention module), ``q``, ``k``, ``v`` and ``o`` are paths inside one layer;
    ``head_dim`` names the attention module's head-size attribute."""
    try:
        stack = base.get_submodule(layers)
    except AttributeError:
        return []
    out = []
    for i in range(len(stack)):
        p = f"{layers}.{i}"
        try:
            size = getattr(base.get_submodule(f"{p}.{attn}"), head_dim)
        except AttributeError:
            continue  # a layer without this attention (e.g. no cross-attention)
        out.append(make_block(
            base, f"{kind}.{i}", kind, i, size, attn=f"{p}.{attn}", q=f"{p}.{q}", k=f"{p}.{k}", v=f"{p}.{v}", o=f"{p}.{o}",
        ))
    return out


class Adapter:
    """Base class of the per-family adapters.

    Subclasses set ``model_types`` and implement :meth:`blocks`; most also override
    :meth:`head_attrs` (attributes holding head counts) and :attr:`empty_style`. Families whose
    projections are not four separate Linear modules override :meth:`cut_ops`.
    """

    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: extra runtime mixins (defined with torch only; their source is saved with the model)
    runtime_mixins: ClassVar[tuple[type, ...]] = ()
    #: does the family use grouped-query attention (so ``--gqa`` applies)?
    gqa: ClassVar[bool] = False
    #: block kinds that write a KV cache during generation (a block without heads then writes a
    #: placeholder so cached positions stay right)
    cached_kinds: ClassVar[tuple[str, ...]] = ("self", "decoder")

    def blocks(self, base: nn.Module) -> list[Block]:
        raise NotImplementedError

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(cache=block.kind in self.cached_kinds)

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        """Attributes of the attention module that hold head counts, after ``cut``."""
        return {}

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        """Ops that realise ``cut`` on ``block`` (separate q, k, v and o projections)."""
        q, kv, d = list(cut.q), list(cut.kv), block.head_dim
        ops = [rows_op(block.q, q, d), rows_op(block.k, kv, d), rows_op(block.v, kv, d), cols_op(block.o, q, d)]
        attrs = self.head_attrs(block, cut)
        if attrs:
            ops.append(set_op(block.attn, **attrs))
        if not q:
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", self.empty_style(block).attrs()))
        return ops

    def prepare(self, model: nn.Module, cuts: dict[str, BlockCut]) -> dict[str, Any]:
        """Change the model's structure before cutting, if the cut needs it (ALBERT unsharing).

        Returns facts for the report (e.g. ``{"unshared_params": n}``)."""
        return {}

    def check_config(self, config: Any) -> None:
        """Refuse configurations of the family that headcut cannot cut exactly."""


@dataclass
class Registry:
    """Model type -> adapter."""

    adapters: dict[str, Adapter] = field(default_factory=dict)

    def add(self, adapter: Adapter) -> None:
        for model_type in adapter.model_types:
            self.adapters[model_type] = adapter
