"""Gemma 4 text decoders (``gemma4_text``: ``Gemma4TextModel``, ``Gemma4ForCausalLM``).

Layer ``i``: ``layers.{i}.self_attn`` with ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` as in Llama
(query head ``h`` reads KV head ``h // num_key_value_groups``; the forward infers the head counts from the
projection widths, so only ``num_key_value_groups`` must follow a cut). What Gemma 4 adds:

* **Per-layer sizes.** ``head_dim`` and ``num_key_value_heads`` differ between sliding and global layers.
  The config stores them with transformers' heterogeneity mechanism: global values plus
  ``config.per_layer_config`` overrides (serialised as ``"per_layer_config": {"01": {...}}``); reading
  such a field on the global config raises ``AmbiguousGlobalPerLayerAttributeError``. Blocks read the
  head size off each attention module (``attn.head_dim``) and the head counts off its projections; the
  config's numbers are checked layer by layer (:meth:`Gemma4Adapter.config_numbers`). A slimmed model's
  config.json keeps the original counts: the cut is the ``headcut`` record, applied at load.
* **Norms per head.** ``q_norm`` and ``k_norm`` are RMSNorms of width ``head_dim`` with one weight shared by
  the heads, ``v_norm`` the same without a weight: a cut slices none of them. The attention scale is 1.
* **k = v.** With ``attention_k_eq_v`` the global layers have no ``v_proj``: the key projection's output is
  also the value (before ``k_norm``/``v_norm``), so cutting ``k_proj``'s rows cuts both.
* **Sliding and global layers** differ in mask, rope and sizes, not in how heads are laid out.
* **KV sharing** (``config.kv_sharing_modes``). A ``reuse`` layer has no k/v projections or norms: it reads
  ``shared_kv_states[layer_type]``, the full-length keys and values that the ``store`` layer of its type
  (the last non-reusing layer of that type) puts there after its cache update. Every model has a store
  layer per layer type, readers or not, because an assistant model (``Gemma4Assistant``) drafting for
  this one reads the same states (``return_shared_kv_states``).

The exact cut of shared keys and values:

* A **store** layer keeps every KV head, always: its keys and values are what readers and an assistant
  model receive, so they stay those of the original model. Any subset of its query heads can go: the kept
  ones are laid out by KV head, each KV head then serving ``m`` query positions (``m`` the most kept heads
  of any KV head, at least 1); positions no kept head fills hold a placeholder copy of a query row, whose
  output :class:`HeadcutGemma4Attention` drops before ``o_proj`` (``_hc_real``: the positions of the kept
  heads). A store layer without query heads keeps one placeholder per KV head, so it still computes,
  caches and stores its keys and values, and adds nothing to the residual stream. Such a block is shown
  with as many KV slots as query heads (``kv_heads == heads``): every subset is exact, under every GQA
  policy, and nothing is duplicated.
* A **reuse** layer's query heads are cut like Llama's under the GQA policy; its KV heads are the store
  layer's, which stay whole, so instead of slicing projections it selects the stored heads it needs
  (``_hc_kv_select``: store KV head per slot, repeats allowed for ``--gqa duplicate``). No cut of a reader
  can conflict with the store layer's, so no mask is refused for KV sharing. A reader without heads becomes
  the generic empty attention (it writes no cache: its cache layer is transformers' never-written dummy).
* Other layers are cut as in Llama; without heads they become the generic empty attention, which writes
  a cache placeholder so cached positions stay right.

All of this is per module and per block, so cuts compose (a second slim reads ``_hc_real``/``_hc_kv_select``
off the modules) and the record of a twice-slimmed model rebuilds the same function from the full model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from .base import (
    MISSING,
    Adapter,
    Block,
    BlockCut,
    CacheCost,
    EmptyStyle,
    Rows,
    Stack,
    _positive,
    cols_op,
    mixin_op,
    rows_op,
    set_op,
)


class HeadcutGemma4Attention:
    """Runtime mixin for a Gemma 4 attention module that takes part in KV sharing.

    ``_hc_kv_select`` (a reader): the stored KV heads this module uses, one per KV slot (repeats allowed);
    the keys and values read from ``shared_kv_states`` are narrowed to them before the original forward
    runs. ``_hc_real`` (a store layer): the query positions whose output is kept, in ``o_proj``'s order;
    the other positions are placeholders and their output is dropped before ``o_proj`` (and from the
    returned attention weights). None: nothing to select."""

    _hc_kv_select: list[int] | None = None
    _hc_real: list[int] | None = None

    def _hc_select_shared(self, states: Any) -> Any:
        if states is None:
            return states
        key, value = states[self.layer_type]
        index = torch.tensor(self._hc_kv_select, dtype=torch.long, device=key.device)
        return {self.layer_type: (key.index_select(1, index), value.index_select(1, index))}

    def _hc_keep_real(self, _module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        d = self.head_dim
        index = torch.tensor(self._hc_real, dtype=torch.long, device=x.device)
        heads = x.reshape(*x.shape[:-1], x.shape[-1] // d, d).index_select(-2, index)
        return (heads.reshape(*x.shape[:-1], len(self._hc_real) * d),) + tuple(args[1:])

    def forward(self, *args: Any, **kwargs: Any) -> tuple:
        if self._hc_kv_select is not None:
            # forward(hidden_states, position_embeddings, attention_mask, shared_kv_states, cache=None, **kwargs)
            if len(args) > 3:
                args = (*args[:3], self._hc_select_shared(args[3]), *args[4:])
            else:
                kwargs["shared_kv_states"] = self._hc_select_shared(kwargs.get("shared_kv_states"))
        if self._hc_real is None:
            return super().forward(*args, **kwargs)
        # first in line, so that gates on o_proj see the kept heads only
        handle = self.o_proj.register_forward_pre_hook(self._hc_keep_real, prepend=True)
        try:
            out, weights = super().forward(*args, **kwargs)
        finally:
            handle.remove()
        if weights is not None:
            weights = weights.index_select(1, torch.tensor(self._hc_real, dtype=torch.long, device=weights.device))
        return out, weights


def _attr_list(module: nn.Module, name: str) -> list[int] | None:
    value = getattr(module, name, None) if isinstance(module, HeadcutGemma4Attention) else None
    return None if value is None else list(value)


def _per_layer_values(get: Callable[[str], Any]) -> list[tuple[str, dict[str, Any]]]:
    """(layer, overrides) of a config's ``per_layer_config``: a live config's per-layer view (every layer's
    head_dim and num_key_value_heads) or config.json's object of overrides."""
    try:
        per_layer = get("per_layer_config")
    except RuntimeError:
        return []
    if isinstance(per_layer, dict):
        return [(str(k), v) for k, v in per_layer.items() if isinstance(v, dict)]
    if per_layer is MISSING or per_layer is None or not hasattr(per_layer, "__len__"):
        return []
    out = []
    for i in range(len(per_layer)):
        layer = per_layer[i]
        out.append((str(i), {k: getattr(layer, k) for k in ("head_dim", "num_key_value_heads") if hasattr(layer, k)}))
    return out


class Gemma4Adapter(Adapter):
    family = "gemma4"
    model_types = ("gemma4_text",)
    no_stock = (
        "headcut does not write Gemma 4's per-layer config (layers whose K/V other layers reuse keep "
        "placeholder query rows)"
    )
    stacks = (Stack(("num_hidden_layers",), "hidden_size", "num_attention_heads", "head_dim"),)
    count_fields = ("num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings")
    optional_fields = {"num_key_value_heads": "num_attention_heads"}
    multiples = (("num_attention_heads", "num_key_value_heads"),)
    gqa = True
    runtime_mixins = (HeadcutGemma4Attention,)

    # ---- the config -----------------------------------------------------------------------------------

    def check_config(self, config: Any) -> None:
        try:
            modes = list(config.kv_sharing_modes)
        except (ValueError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(f"Gemma 4 config: its KV sharing is inconsistent ({exc})") from None
        types = list(config.layer_types)
        stored = {t for t, m in zip(types, modes) if m == "store"}
        orphans = sorted({t for t, m in zip(types, modes) if m == "reuse"} - stored)
        if orphans:
            raise ValueError(
                f"Gemma 4 config: layers of type {orphans[0]} reuse keys and values that no layer "
                f"stores (num_kv_shared_layers {config.num_kv_shared_layers} of "
                f"{config.num_hidden_layers} layers)"
            )

    def config_numbers(self, get: Callable[[str], Any]) -> dict[str, int | None]:
        """As :meth:`Adapter.config_numbers`, with the per-layer ``head_dim`` and ``num_key_value_heads`` of
        ``per_layer_config`` checked too (a global read of such a field, which transformers refuses, counts
        as absent). The head size used for the size bound is the smallest of any layer."""
        layers = _per_layer_values(get)
        per_layer: dict[str, list[int]] = {"head_dim": [], "num_key_value_heads": []}
        for layer, overrides in layers:
            for name in per_layer:
                if name in overrides:
                    per_layer[name].append(_positive(f"per_layer_config[{layer}].{name}", overrides[name]))

        def value(name: str) -> Any:
            try:
                found = get(name)
            except RuntimeError:  # AmbiguousGlobalPerLayerAttributeError: the field differs between layers
                found = MISSING
            if name in per_layer and per_layer[name]:
                if found is MISSING:
                    return min(per_layer[name])
                if isinstance(found, int) and not isinstance(found, bool) and found > 0:
                    return min(found, *per_layer[name])
            return found

        numbers = super().config_numbers(value)
        heads = numbers.get("num_attention_heads")
        if heads:
            for layer, overrides in layers:
                kv = overrides.get("num_key_value_heads")
                if isinstance(kv, int) and heads % kv:
                    raise ValueError(
                        f"num_attention_heads {heads} is not a multiple of "
                        f"per_layer_config[{layer}].num_key_value_heads {kv}"
                    )
        return numbers

    # ---- the blocks -------------------------------------------------------------------------------------

    @staticmethod
    def _roles(base: nn.Module) -> tuple[list[str | None], dict[str, int]]:
        """Each layer's KV sharing mode, and the store layer of each layer type."""
        config = base.config
        modes = list(config.kv_sharing_modes)
        stores = {config.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}
        return modes, stores

    def blocks(self, base: nn.Module) -> list[Block]:
        modes, stores = self._roles(base)
        out = []
        for i, layer in enumerate(base.layers):
            attn = layer.self_attn
            d = attn.head_dim
            p = f"layers.{i}.self_attn"
            heads = attn.o_proj.in_features // d
            layout = None
            if modes[i] == "reuse":
                s = stores[attn.layer_type]
                source = base.layers[s].self_attn
                sp = f"layers.{s}.self_attn"
                k = f"{sp}.k_proj"
                v = f"{sp}.v_proj" if source.v_proj is not None else k
                select = _attr_list(attn, "_hc_kv_select")
                kv = 0 if heads == 0 else len(select) if select is not None else source.k_proj.out_features // d
                order = tuple(select) if select is not None and heads else None
                layout = (Rows(f"{p}.q_proj"), Rows(k, order=order), Rows(v, order=order))
            else:
                k = f"{p}.k_proj"
                v = f"{p}.v_proj" if attn.v_proj is not None else k
                kv = attn.k_proj.out_features // d
                if modes[i] == "store":
                    # every subset of query heads is exact: one KV slot per query head (see the docstring)
                    real = _attr_list(attn, "_hc_real")
                    groups = attn.num_key_value_groups
                    slots = tuple(pos // groups for pos in (real if real is not None else range(heads)))
                    kv = heads
                    q_order = tuple(real) if real is not None and heads else None
                    layout = (
                        Rows(f"{p}.q_proj", order=q_order),
                        Rows(k, order=slots or None),
                        Rows(v, order=slots or None),
                    )
            out.append(
                Block(
                    name=f"self.{i}",
                    kind="self",
                    layer=i,
                    heads=heads,
                    kv_heads=kv,
                    head_dim=d,
                    attn=p,
                    q=f"{p}.q_proj",
                    k=k,
                    v=v,
                    o=f"{p}.o_proj",
                    layout=layout,
                )
            )
        return out

    def layer_cost(self, base: nn.Module, block: Block, kind: str, args: dict[str, Any]) -> CacheCost:
        """A reader's layer holds nothing (transformers' ``dummy``); a store layer holds every KV head of its
        own whatever its query heads (its keys and values are what the readers get)."""
        cost = super().layer_cost(base, block, kind, args)
        modes, _ = self._roles(base)
        if modes[block.layer] != "store":
            return cost
        return replace(cost, fixed_kv=base.get_submodule(block.attn).k_proj.out_features // block.head_dim)

    # ---- the cut ----------------------------------------------------------------------------------------

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="o_proj", cache=True)

    def cut_ops(self, base: nn.Module, block: Block, cut: BlockCut) -> list[dict[str, Any]]:
        modes, _ = self._roles(base)
        mode = modes[block.layer]
        attn = base.get_submodule(block.attn)
        if mode == "store":
            return self._store_ops(attn, block, list(cut.q))
        d, q = block.head_dim, list(cut.q)
        ops = [rows_op(block.q, q, d)]
        if mode != "reuse":
            ops.append(rows_op(f"{block.attn}.k_proj", list(cut.kv), d))
            if attn.v_proj is not None:  # else k = v: the key rows are the value rows
                ops.append(rows_op(f"{block.attn}.v_proj", list(cut.kv), d))
        ops += [cols_op(block.o, q, d), set_op(block.attn, num_key_value_groups=cut.groups)]
        if not q:
            style = EmptyStyle(o="o_proj", cache=mode != "reuse")  # a reader's cache layer is never written
            ops.append(mixin_op(block.attn, "HeadcutEmptyAttention", style.attrs()))
        elif mode == "reuse":
            current = _attr_list(attn, "_hc_kv_select") or list(range(block.kv_heads))
            ops.append(mixin_op(block.attn, "HeadcutGemma4Attention", {"_hc_kv_select": [current[j] for j in cut.kv]}))
        return ops

    def _store_ops(self, attn: nn.Module, block: Block, q: list[int]) -> list[dict[str, Any]]:
        """A store layer keeps its keys and values; the kept query heads (``q``, current numbering) are laid
        out by KV head with placeholders, ``m`` positions per KV head."""
        d = block.head_dim
        groups = attn.num_key_value_groups
        real = _attr_list(attn, "_hc_real")
        positions = real if real is not None else list(range(block.heads))
        kept = [positions[i] for i in q]
        slots = attn.k_proj.out_features // d
        members = [[pos for pos in kept if pos // groups == s] for s in range(slots)]
        width = max([1] + [len(m) for m in members])
        layout: list[int] = []
        where: dict[int, int] = {}
        for s, mine in enumerate(members):
            for pos in mine:
                where[pos] = len(layout)
                layout.append(pos)
            # a placeholder repeats a query row of the same KV head (its output is dropped)
            layout += [mine[0] if mine else s * groups] * (width - len(mine))
        new_real = [where[pos] for pos in kept]
        ops = [
            rows_op(block.q, layout, d),
            cols_op(block.o, q, d),
            set_op(block.attn, num_key_value_groups=width),
        ]
        if new_real != list(range(len(layout))):
            ops.append(mixin_op(block.attn, "HeadcutGemma4Attention", {"_hc_real": new_real}))
        elif real is not None:
            ops.append(mixin_op(block.attn, "HeadcutGemma4Attention", {"_hc_real": None}))
        return ops

    def notes(self, base: nn.Module, blocks: list[Block]) -> list[str]:
        padded, values = [], 0
        for b in blocks:
            attn = base.get_submodule(b.attn)
            extra = attn.q_proj.out_features // b.head_dim - b.heads
            if extra > 0:
                padded.append(b.name)
                values += extra * b.head_dim * attn.q_proj.in_features
        if not padded:
            return []
        return [
            f"Gemma 4 layers that store keys and values for KV sharing ({', '.join(padded)}) keep every KV head; "
            f"their kept query heads are padded to the same number per KV head with placeholder query rows "
            f"({values:,} values) whose outputs are dropped"
        ]
