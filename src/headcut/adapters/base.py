"""The adapter interface: everything headcut knows about one model family.

Scorers, pruners, gating and slimming are written against :class:`Adapter` and :class:`Block` and
never name a model family. An adapter reads the model's current structure (so a slimmed model can
be slimmed again) and turns a cut into runtime ops (see :mod:`headcut.adapters.runtime`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn


@dataclass(frozen=True)
class Rows:
    """Where the output rows of one of a block's q, k or v projections lie, head by head.

    Head ``h`` owns ``head_dim`` consecutive output features starting at ``offset + h * stride``
    (``stride`` 0: ``head_dim``; with :attr:`order`, head ``order[h]``). Fused projections say where their part starts (Phi-3's q | k | v) or
    interleave the parts per head (GPT-NeoX: stride ``3 * head_dim``)."""

    path: str
    offset: int = 0
    stride: int = 0
    #: the projection's head behind each current head, where the projection keeps heads the block no
    #: longer has (OLMo 2); None: head ``h`` is the projection's head ``h``
    order: tuple[int, ...] | None = None


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
    #: the q, k and v rows of a projection laid out otherwise than one head after another in separate
    #: projections or in three equal sections of a fused one (see :meth:`rows`)
    layout: tuple[Rows, Rows, Rows] | None = None
    #: the kind of block for ``info`` when it is not softmax attention (e.g. ``linear attention``)
    mixer: str = "attention"

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 without grouped-query attention)."""
        return self.heads // self.kv_heads if self.kv_heads else 1

    def rows(self, part: str) -> Rows:
        """The rows of part ``q``, ``k`` or ``v``: from :attr:`layout`, else separate projections or
        three equal sections (q | k | v) of a fused one."""
        index = "qkv".index(part)
        if self.layout is not None:
            return self.layout[index]
        if self.fused_qkv:
            return Rows(self.q, offset=index * self.heads * self.head_dim)
        return Rows((self.q, self.k, self.v)[index])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "layer": self.layer,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "mixer": self.mixer,
        }


@dataclass(frozen=True)
class BlockCut:
    """What to keep in one block, in the block's *current* head numbering.

    ``q``: kept query heads, in order. ``kv``: the KV head serving each kept KV slot (repeats mean
    duplication). ``groups``: query heads per KV slot after the cut. ``merged``: for a block whose KV heads were
    merged (:mod:`headcut.model.kv_merge`), the KV heads behind each slot (the first is ``kv``'s); its query heads
    then come from any of them."""

    q: tuple[int, ...]
    kv: tuple[int, ...]
    groups: int = 1
    merged: tuple[tuple[int, ...], ...] | None = None


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
            "_hc_o": self.o,
            "_hc_dropout": self.dropout,
            "_hc_norm": self.norm,
            "_hc_cache": self.cache,
            "_hc_outputs": self.outputs,
        }


@dataclass(frozen=True)
class StockSpec:
    """How a family's stock config states a cut that keeps the same heads in every block: the config fields
    of the query-head count, the KV-head count (None: as many as query heads) and an explicit head size.

    ``fallbacks``: model types whose stock config and classes hold the same weights under the same names,
    tried in order when the family's own config refuses the counts (LlamaConfig wants ``hidden_size`` to be
    a multiple of the head count even with an explicit ``head_dim``); ``fallback_fields``: fields a fallback
    config lacks, with the one value they may have for the fallback to compute the same thing;
    ``fallback_sets``: fields the fallback needs set (Mistral's ``sliding_window``: None, full attention)."""

    heads: str = "num_attention_heads"
    kv_heads: str | None = "num_key_value_heads"
    head_dim: str = "head_dim"
    fallbacks: tuple[str, ...] = ()
    fallback_fields: tuple[tuple[str, Any], ...] = ()
    fallback_sets: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class DecilmSpec:
    """How a family's checkpoint maps onto NVIDIA's DeciLM / Nemotron-NAS layout (``--format decilm``; see
    :mod:`headcut.outputs.formats.decilm`): Llama blocks whose attention can differ per layer. ``layers``: the
    layer list under the base model; ``attention``: the module prefix of a layer's attention tensors
    (``model.<layers>.N.<attention>.``); ``norm``: the norm in front
    of it (both dropped for a layer without attention); ``sets``: config fields the DeciLM config needs set (e.g.
    ``qkv_bias`` for a family whose q, k and v projections have biases but its output projection none)."""

    layers: str = "layers"
    attention: str = "self_attn"
    norm: str = "input_layernorm"
    sets: tuple[tuple[str, Any], ...] = ()


#: what a config lookup returns for a field that neither config.json nor its config class has
MISSING: Any = object()


@dataclass(frozen=True)
class CacheCost:
    """What one block holds in the cache of one sequence during generation, per kept head (see
    :mod:`headcut.model.kv_cache`): ``per_position`` values per cached position and KV head (keys and values:
    ``2 * head_dim``), held for ``window`` positions at most (a sliding or chunked layer: transformers' dynamic
    cache keeps ``sliding_window - 1``; None: every position); ``per_head`` and ``per_kv`` values of state per
    kept query or KV head whatever the length (a linear-attention layer's recurrent and convolution states);
    ``fixed_kv``: KV heads held whatever the cut (a layer whose keys and values other layers read); ``kind``: the
    layer's cache kind as transformers names it (``full_attention``, ``sliding_attention``, ``dummy`` for a layer
    that reads another's cache, ...)."""

    kind: str
    per_position: int
    window: int | None = None
    per_head: int = 0
    per_kv: int = 0
    fixed_kv: int | None = None

    def values(self, heads: int, kv_heads: int, context: int) -> int:
        """Values held after ``context`` tokens by the block with ``heads`` query and ``kv_heads`` KV heads."""
        positions = context if self.window is None else min(context, self.window)
        kv = self.fixed_kv if self.fixed_kv is not None else kv_heads
        return positions * self.per_position * kv + self.per_head * heads + self.per_kv * kv_heads

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("kind", "per_position", "window", "per_head", "per_kv", "fixed_kv")}


#: cache kinds (transformers' layer types) that hold keys and values for a window of positions
WINDOWED = ("sliding_attention", "chunked_attention")
#: cache kinds that hold keys and values for every position
FULL = ("full_attention",)
#: cache kinds that hold nothing (a layer reading another's keys and values; a layer without attention)
NO_CACHE = ("dummy",)


def cache_layer_types(config: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Each layer's cache kind and its arguments as transformers' own dynamic cache reads them off ``config``
    (layer types, sliding windows, KV sharing), so that the count follows what generation holds."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, kwargs = get_layer_types_and_kwargs(config)
    return list(types), list(kwargs)


@dataclass(frozen=True)
class Stack:
    """One stack of attention layers as a family's config describes it (config field names).

    ``layers``: fields whose product is the number of attention modules built (ALBERT: groups times
    inner layers); ``width``: the model width; ``heads``: the head count; ``head_dim``: a field that may
    give the head size explicitly (else ``width // heads``, and ``width`` must be a multiple of
    ``heads``); ``kind``: ``encoder``/``decoder`` for the stacks of encoder-decoder families."""

    layers: tuple[str, ...]
    width: str
    heads: str
    head_dim: str | None = None
    kind: str = "self"


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # null, true and false as config.json writes them
        shown = json.dumps(value) if value is None or isinstance(value, bool) else f"{value!r:.40}"
        raise ValueError(f"{name} is {shown}; it must be a positive integer")
    if value <= 0:
        raise ValueError(f"{name} is {value}; it must be a positive integer")
    return value


def rows_op(path: str, heads: list[int], head_dim: int, sections: int = 1) -> dict[str, Any]:
    return {"op": "rows", "path": path, "heads": list(heads), "head_dim": head_dim, "sections": sections}


def cols_op(path: str, heads: list[int], head_dim: int) -> dict[str, Any]:
    return {"op": "cols", "path": path, "heads": list(heads), "head_dim": head_dim}


def set_op(path: str, **attrs: Any) -> dict[str, Any]:
    return {"op": "set", "path": path, "attrs": attrs}


def mixin_op(path: str, mixin: str, attrs: dict[str, Any]) -> dict[str, Any]:
    return {"op": "mixin", "path": path, "mixin": mixin, "attrs": attrs}


def part(heads: list[int], head_dim: int, count: int) -> dict[str, Any]:
    """One part of a ``parts`` layout: ``count`` heads of ``head_dim`` features, ``heads`` kept."""
    return {"heads": list(heads), "head_dim": head_dim, "count": count}


def parts_op(path: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Keep output rows of a projection whose output is unequal parts (see :func:`part`)."""
    return {"op": "rows", "path": path, "parts": parts}


def channels_op(path: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Keep channels of a depthwise Conv1d laid out in parts (see :func:`part`)."""
    return {"op": "channels", "path": path, "parts": parts}


def param_op(path: str, name: str, heads: list[int], head_dim: int) -> dict[str, Any]:
    """Keep the entries of the module's own parameter ``name`` (first dimension) that belong to ``heads``."""
    return {"op": "param", "path": path, "name": name, "heads": list(heads), "head_dim": head_dim}


def same_heads(cut: BlockCut, family: str) -> list[int]:
    """The kept heads of a family with one key/value head per query head (refusing a cut that keeps other
    KV heads than query heads)."""
    if list(cut.q) != list(cut.kv):
        raise ValueError(f"{family} has one key/value head per query head; the cut must keep the same heads")
    return list(cut.q)


def out_features(mod: nn.Module) -> int:
    """Output width of a Linear or Conv1D projection."""
    if isinstance(mod, nn.Linear):
        return mod.weight.shape[0]
    return mod.weight.shape[1]


def make_block(
    base: nn.Module,
    name: str,
    kind: str,
    layer: int,
    head_dim: int,
    attn: str,
    q: str,
    k: str,
    v: str,
    o: str,
    shared: str | None = None,
) -> Block:
    """A Block whose head counts are read off the current widths of its q and k projections
    (paths relative to ``base``; a fused q|k|v projection, given as q == k == v, is a third each)."""
    fused = q == k
    parts = 3 if fused else 1
    heads = out_features(base.get_submodule(q)) // parts // head_dim
    kv_heads = out_features(base.get_submodule(k)) // parts // head_dim
    return Block(
        name=name,
        kind=kind,
        layer=layer,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        attn=attn,
        q=q,
        k=k,
        v=v,
        o=o,
        fused_qkv=fused,
        shared=shared,
    )


def stack_blocks(
    base: nn.Module,
    layers: str,
    attn: str,
    q: str,
    k: str,
    v: str,
    o: str,
    head_dim: str,
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
        out.append(
            make_block(
                base,
                f"{kind}.{i}",
                kind,
                i,
                size,
                attn=f"{p}.{attn}",
                q=f"{p}.{q}",
                k=f"{p}.{k}",
                v=f"{p}.{v}",
                o=f"{p}.{o}",
            )
        )
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

    #: config fields that give every attention projection (q, k, v and o) a bias when true, tried in order for
    #: FLAP's bias compensation (:mod:`headcut.model.compensation`, which checks each on a meta build)
    bias_fields: ClassVar[tuple[str, ...]] = ("attention_bias",)
    #: why the family's layers cannot be pruned one at a time (:mod:`headcut.model.streamed`); None: they can
    no_layerwise: ClassVar[str | None] = None

    #: why the family's stock config cannot hold a cut (a family with a :meth:`stock_spec` sets none)
    no_stock: ClassVar[str] = "its stock config derives the head size from the width and the head count"

    def blocks(self, base: nn.Module) -> list[Block]:
        raise NotImplementedError

    def stock_spec(self, model_type: str) -> StockSpec | None:
        """How the stock config of ``model_type`` states one head count for every block, or None where it
        cannot (:attr:`no_stock` says why); see :mod:`headcut.model.stock`."""
        return None

    #: why the family cannot be written in the DeciLM layout (a family with a :meth:`decilm_spec` sets none)
    no_decilm: ClassVar[str] = "DeciLM / Nemotron-NAS holds Llama blocks only"

    def decilm_spec(self, config: Any) -> DecilmSpec | None:
        """How a model of this family (its ``config``) is written as DeciLM, or None where the engines' DeciLM
        would not compute what the model computes (:meth:`no_decilm_reason` says why)."""
        return None

    def no_decilm_reason(self, config: Any) -> str:
        """Why :meth:`decilm_spec` gives None for ``config``: :attr:`no_decilm`, unless the family says more
        (a setting of this config rather than the family)."""
        return self.no_decilm

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(cache=block.kind in self.cached_kinds)

    #: why the family's KV heads cannot be merged (:mod:`headcut.model.kv_merge`); a family that can overrides
    #: :meth:`kv_merge_refusal`
    no_kv_merge: ClassVar[str] = (
        "merging KV heads is exact for grouped-query attention with separate q/k/v projections, a full rotary "
        "embedding in transformers' rotate_half layout and no norm on the keys"
    )

    def kv_merge_refusal(self, config: Any) -> str | None:
        """Why this model's KV heads cannot be merged (its ``config``), or None where they can: the merge aligns
        keys by complex scalars on RoPE's ``(j, j + head_dim/2)`` pairs (see :mod:`headcut.model.kv_merge`)."""
        return self.no_kv_merge

    def cache_costs(self, base: nn.Module, blocks: list[Block]) -> dict[str, CacheCost]:
        """What each block of a generating model holds in its cache (:class:`CacheCost`), by the layer kinds
        transformers' dynamic cache reads off the config: keys and values of ``head_dim`` per KV head, for a
        window of positions where the layer slides. Families with other caches (linear attention, layers
        sharing keys and values) override it; a kind the family does not say how to count is refused."""
        types, kwargs = cache_layer_types(base.config)
        out: dict[str, CacheCost] = {}
        for block in blocks:
            if block.kind not in self.cached_kinds:
                continue
            kind, args = types[block.layer], kwargs[block.layer]
            out[block.name] = self.layer_cost(base, block, kind, args)
        return out

    def layer_cost(self, base: nn.Module, block: Block, kind: str, args: dict[str, Any]) -> CacheCost:
        """The :class:`CacheCost` of ``block`` in a layer of cache kind ``kind`` (with the cache's ``args``)."""
        if kind in NO_CACHE:
            return CacheCost(kind, 0)
        if kind in FULL:
            return CacheCost(kind, 2 * block.head_dim)
        if kind in WINDOWED:
            return CacheCost(kind, 2 * block.head_dim, window=max(int(args["sliding_window"]) - 1, 0))
        raise ValueError(f"headcut does not count the cache of {block.name} (a {kind} layer)")

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

    def notes(self, base: nn.Module, blocks: list[Block]) -> list[str]:
        """What ``info`` and reports should say about how this family is cut (e.g. parts kept whole)."""
        return []

    def prepare(self, model: nn.Module, cuts: dict[str, BlockCut]) -> dict[str, Any]:
        """Change the model's structure before cutting, if the cut needs it (ALBERT unsharing).

        Returns facts for the report (e.g. ``{"unshared_params": n}``)."""
        return {}

    def check_config(self, config: Any) -> None:
        """Refuse configurations of the family that headcut cannot cut exactly."""

    # ---- the numbers of a config, checked before any model is built ---------------------------------

    #: the attention stacks a config describes (for the checks below and the size bound)
    stacks: ClassVar[tuple[Stack, ...]] = ()
    #: further config fields that must be positive integers (sizes and counts)
    count_fields: ClassVar[tuple[str, ...]] = ()
    #: fields that may be null: the value of the named field is used instead (None: derived later)
    optional_fields: ClassVar[dict[str, str | None]] = {}
    #: (a, b): field a must be a multiple of field b
    multiples: ClassVar[tuple[tuple[str, str], ...]] = ()

    def config_numbers(self, get: Callable[[str], Any]) -> dict[str, int | None]:
        """The head, layer and size fields of a config, validated: ``get(field)`` returns the field's
        value, or :data:`MISSING` where the config has no such field. Raises ValueError naming the
        field (not a positive integer, a null that may not be one, a width its head count does not
        divide)."""
        fields: list[str] = []
        for stack in self.stacks:
            fields += [*stack.layers, stack.width, stack.heads] + ([stack.head_dim] if stack.head_dim else [])
        fields += self.count_fields
        numbers: dict[str, int | None] = {}
        for name in dict.fromkeys(fields):
            value = get(name)
            if value is MISSING:
                continue
            if value is None and name in self.optional_fields:
                numbers[name] = None
                continue
            numbers[name] = _positive(name, value)
        for name, fallback in self.optional_fields.items():
            if numbers.get(name) is None and fallback is not None and numbers.get(fallback) is not None:
                numbers[name] = numbers[fallback]
        pairs = list(self.multiples)
        for stack in self.stacks:
            if stack.head_dim is None or numbers.get(stack.head_dim) is None:
                pairs.append((stack.width, stack.heads))
        for a, b in pairs:
            va, vb = numbers.get(a), numbers.get(b)
            if va is not None and vb is not None and va % vb:
                raise ValueError(f"{a} {va} is not a multiple of {b} {vb}")
        return numbers

    def built_stacks(self, cls_name: str) -> tuple[Stack, ...]:
        """The stacks a model class ``cls_name`` of the family builds (encoder-decoder families
        override this for their encoder-only or decoder-only classes)."""
        return self.stacks

    def min_values(self, numbers: dict[str, int | None], cls_name: str) -> int:
        """A lower bound of the values a model of class ``cls_name`` with these (validated) numbers
        holds: the query and output projections of every attention module. Computed from the numbers
        alone, so a config of a million layers is measured without building anything."""
        total = 0
        for stack in self.built_stacks(cls_name):
            layers = 1
            for name in stack.layers:
                layers *= numbers.get(name) or 1
            width, heads = numbers.get(stack.width) or 1, numbers.get(stack.heads) or 1
            head_dim = (numbers.get(stack.head_dim) if stack.head_dim else None) or max(width // heads, 1)
            total += layers * 2 * width * heads * head_dim
        return total


@dataclass
class Registry:
    """Model type -> adapter."""

    adapters: dict[str, Adapter] = field(default_factory=dict)

    def add(self, adapter: Adapter) -> None:
        for model_type in adapter.model_types:
            self.adapters[model_type] = adapter
