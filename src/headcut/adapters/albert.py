"""ALBERT: layers that share one set of weights.

The encoder holds ``num_hidden_groups`` layer groups of ``inner_group_num`` layers each; layer ``i``
(of ``num_hidden_layers``) runs every layer of group ``int(i / (num_hidden_layers /
num_hidden_groups))``. Attention ``j`` of group ``g``:
``encoder.albert_layer_groups.{g}.albert_layers.{j}.attention`` with ``query``, ``key``, ``value``
and the output projection ``dense`` inside it. Head size: ``attention.attention_head_size``
(``hidden_size // num_attention_heads``). The forward infers the head count from the projection
width; ``num_attention_heads`` and ``all_head_size`` are kept in step.

Quirks:

* One block per attention *call*: ``self.{n}`` with ``n = i * inner_group_num + j`` (``self.{i}``
  in the usual ``inner_group_num == 1``). Blocks whose weights are shared carry ``shared`` (the
  group, or ``group.inner``) and the same ``attn``/``o`` paths; gates count calls per module.
* The same heads in every layer of a group keeps the sharing (the shared module is cut once). A
  mask that differs between layers sharing weights first *unshares* (:meth:`AlbertAdapter.prepare`):
  the fewest groups ``G'`` for which the model's own group formula puts only layers with equal cuts
  (and equal old groups) together, ``config.num_hidden_groups = G'`` (at most ``num_hidden_layers``),
  each new group a copy of its old group. A model built from the saved config then has the
  unshared structure natively.
* The residual and a LayerNorm are inside the attention module:
  ``LayerNorm(hidden + output_dropout(dense(context)))``. A block without heads becomes
  ``LayerNorm(hidden + output_dropout(dense.bias))`` (the generic empty-attention mixin, wired by
  :meth:`AlbertAdapter.empty_style`).
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn
from transformers import PreTrainedConfig

from .base import Adapter, Block, BlockCut, EmptyStyle, Stack, make_block


def group_of_layer(layer: int, num_layers: int, num_groups: int) -> int:
    """The layer group layer ``layer`` runs (AlbertTransformer.forward's formula, float and all)."""
    return int(layer / (num_layers / num_groups))


def _fewest_groups(layers: list[tuple], start: int) -> int:
    """The fewest layer groups (at least ``start``) for which the group formula puts together only
    layers with equal entries in ``layers`` (old group and cuts); every layer alone always works."""
    num_layers = len(layers)
    for count in range(start, num_layers):
        seen: dict[int, tuple] = {}
        if all(seen.setdefault(group_of_layer(i, num_layers, count), layer) == layer for i, layer in enumerate(layers)):
            if len(seen) == count:
                return count
    return num_layers


def _copy_group(group: nn.Module) -> nn.Module:
    """A copy of a layer group with its own weights but the model's config object (so that run-time
    switches such as ``set_attn_implementation`` reach the copy too)."""
    memo: dict[int, Any] = {}
    for mod in group.modules():
        for value in vars(mod).values():
            if isinstance(value, PreTrainedConfig):
                memo[id(value)] = value
    return copy.deepcopy(group, memo)


class AlbertAdapter(Adapter):
    family = "albert"
    model_types = ("albert",)
    # the attention modules built: one per inner layer of every group (layers share them)
    stacks = (Stack(("num_hidden_groups", "inner_group_num"), "hidden_size", "num_attention_heads"),)
    count_fields = ("num_hidden_layers", "embedding_size", "intermediate_size", "vocab_size", "max_position_embeddings")
    cached_kinds = ()

    def blocks(self, base: nn.Module) -> list[Block]:
        cfg = base.config
        num_layers, num_groups = cfg.num_hidden_layers, cfg.num_hidden_groups
        groups = base.encoder.albert_layer_groups
        uses = [group_of_layer(i, num_layers, num_groups) for i in range(num_layers)]
        out = []
        for i in range(num_layers):
            g = uses[i]
            inner = groups[g].albert_layers
            for j, layer in enumerate(inner):
                n = i * len(inner) + j
                p = f"encoder.albert_layer_groups.{g}.albert_layers.{j}.attention"
                shared = None
                if uses.count(g) > 1:
                    shared = str(g) if len(inner) == 1 else f"{g}.{j}"
                out.append(
                    make_block(
                        base,
                        f"self.{n}",
                        "self",
                        n,
                        layer.attention.attention_head_size,
                        attn=p,
                        q=f"{p}.query",
                        k=f"{p}.key",
                        v=f"{p}.value",
                        o=f"{p}.dense",
                        shared=shared,
                    )
                )
        return out

    def head_attrs(self, block: Block, cut: BlockCut) -> dict[str, Any]:
        n = len(cut.q)
        return {"num_attention_heads": n, "all_head_size": n * block.head_dim}

    def empty_style(self, block: Block) -> EmptyStyle:
        return EmptyStyle(o="dense", dropout="output_dropout", norm="LayerNorm")

    def prepare(self, model: nn.Module, cuts: dict[str, BlockCut]) -> dict[str, Any]:
        """Unshare layer groups whose layers get different cuts (see the module docstring)."""
        base = model.base_model
        cfg = base.config
        num_layers, old_groups = cfg.num_hidden_layers, cfg.num_hidden_groups
        blocks = self.blocks(base)
        inner = len(blocks) // num_layers

        def key(block: Block) -> tuple:
            cut = cuts.get(block.name)
            if cut is None:
                return (tuple(range(block.heads)), tuple(range(block.kv_heads)), block.group_size)
            return (tuple(cut.q), tuple(cut.kv), cut.groups)

        # per layer: the old group it runs and the cuts of its inner layers
        layers = [
            (group_of_layer(i, num_layers, old_groups), tuple(key(b) for b in blocks[i * inner : (i + 1) * inner]))
            for i in range(num_layers)
        ]
        new_groups = _fewest_groups(layers, old_groups)
        if new_groups == old_groups:
            return {}
        source = {group_of_layer(i, num_layers, new_groups): layers[i][0] for i in range(num_layers)}
        encoder = base.encoder
        old = encoder.albert_layer_groups
        reused: set[int] = set()
        modules = []
        for k in range(new_groups):
            g = source[k]
            modules.append(old[g] if g not in reused else _copy_group(old[g]))
            reused.add(g)
        encoder.albert_layer_groups = nn.ModuleList(modules)
        for config in {id(c): c for c in (model.config, cfg, encoder.config)}.values():
            config.num_hidden_groups = new_groups
        return {
            "notes": [
                f"the mask differs between ALBERT layers that share weights: unshared {old_groups} -> "
                f"{new_groups} layer groups (config.num_hidden_groups)"
            ]
        }
