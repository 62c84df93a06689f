"""Structural head removal (slimming) and the cut record kept in ``config.headcut``.

The record stores, per changed block, the *original* indices of the kept query heads and KV heads,
and the ops that cut a freshly built full-size model down to the current one. Slimming a slimmed
model composes the cuts, so the record always describes the cut from the original architecture.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..adapters import Adapter, Block, BlockCut, adapter_for, runtime_mixins
from ..adapters.runtime import RUNTIME_FORMAT, apply_ops
from ..errors import HeadcutError
from .masks import HeadMask, plan_cuts, resolve_mask

#: the newest ``config.headcut`` record this headcut writes and reads: 2 where a block's KV heads were merged (its
#: ``merged`` entry, which a headcut reading format 1 would not know), 1 otherwise (every headcut reads it)
RECORD_FORMAT = 2
#: the format of a record without merged blocks
PLAIN_RECORD_FORMAT = 1


class HeadTotals:
    """``total_before`` / ``total_after`` of a result with ``heads_before`` / ``heads_after`` per block."""

    heads_before: dict[str, int]
    heads_after: dict[str, int]

    @property
    def total_before(self) -> int:
        return sum(self.heads_before.values())

    @property
    def total_after(self) -> int:
        return sum(self.heads_after.values())


@dataclass
class SlimResult(HeadTotals):
    """What a slimming changed."""

    heads_before: dict[str, int]
    heads_after: dict[str, int]
    params_before: int
    params_after: int
    unshared_params: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "heads_before": self.total_before,
            "heads_after": self.total_after,
            "heads_per_block_before": self.heads_before,
            "heads_per_block_after": self.heads_after,
            "params_before": self.params_before,
            "params_after": self.params_after,
            "unshared_params": self.unshared_params,
            "notes": self.notes,
        }


def count_params(model: nn.Module) -> int:
    """Number of distinct parameters (tied and shared weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (a storage shared by tied weights counted once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def model_blocks(model: nn.Module) -> list[Block]:
    """The model's attention blocks as they are now."""
    return adapter_for(model).blocks(model.base_model)


def _is_identity(block: Block, cut: BlockCut) -> bool:
    return (
        list(cut.q) == list(range(block.heads))
        and list(cut.kv) == list(range(block.kv_heads))
        and cut.groups == block.group_size
    )


def block_ops(
    adapter: Adapter, base: nn.Module, blocks: list[Block], cuts: dict[str, BlockCut]
) -> list[dict[str, Any]]:
    """Ops for every non-identity cut; blocks sharing one module are cut once."""
    ops: list[dict[str, Any]] = []
    done: set[str] = set()
    for block in blocks:
        cut = cuts.get(block.name)
        if cut is None or _is_identity(block, cut) or block.attn in done:
            continue
        done.add(block.attn)
        ops.extend(adapter.cut_ops(base, block, cut))
    return ops


def skeleton(model: nn.Module) -> nn.Module:
    """The uncut architecture of ``model`` on the meta device (no memory, no weights)."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "headcut"):
        delattr(config, "headcut")
    with torch.device("meta"):
        return type(model)(config)


def _compose(previous: dict[str, Any] | None, blocks: list[Block], cuts: dict[str, BlockCut]) -> dict[str, Any]:
    old = (previous or {}).get("blocks", {})
    out: dict[str, Any] = {}
    for block in blocks:
        prior = old.get(block.name)
        if prior is None:
            prior = {
                "q": list(range(block.heads)),
                "kv": list(range(block.kv_heads)),
                "groups": block.group_size,
                "heads": block.heads,
                "kv_heads": block.kv_heads,
            }
        cut = cuts.get(block.name)
        if cut is None:
            entry = prior
        else:
            entry = dict(
                prior, q=[prior["q"][i] for i in cut.q], kv=[prior["kv"][j] for j in cut.kv], groups=cut.groups
            )
            behind = prior.get("merged") or [[k] for k in prior["kv"]]  # the original KV heads behind each slot
            if cut.merged is not None:
                entry["merged"] = [[k for slot in cluster for k in behind[slot]] for cluster in cut.merged]
            elif "merged" in prior:
                entry["merged"] = [behind[j] for j in cut.kv]
        full_groups = entry["heads"] // entry["kv_heads"] if entry["kv_heads"] else 1
        unchanged = (
            entry["q"] == list(range(entry["heads"]))
            and entry["kv"] == list(range(entry["kv_heads"]))
            and entry["groups"] == full_groups
        )
        if not unchanged:
            out[block.name] = entry
    return out


def build_record(model: nn.Module, adapter: Adapter, blocks_record: dict[str, Any]) -> dict[str, Any]:
    """The ``config.headcut`` record: kept original heads per block and ops from the full model."""
    skel = skeleton(model)
    full = adapter.blocks(skel.base_model)
    cuts = {
        name: BlockCut(tuple(entry["q"]), tuple(entry["kv"]), entry["groups"]) for name, entry in blocks_record.items()
    }
    return {
        "format": RECORD_FORMAT if any("merged" in e for e in blocks_record.values()) else PLAIN_RECORD_FORMAT,
        "runtime_format": RUNTIME_FORMAT,
        "headcut_version": __version__,
        "family": adapter.family,
        "blocks": blocks_record,
        "ops": block_ops(adapter, skel.base_model, full, cuts),
    }


def slim(
    model: nn.Module,
    mask: HeadMask | dict[str, Any],
    gqa: str = "auto",
    planned: dict[str, BlockCut] | None = None,
) -> SlimResult:
    """Physically remove the heads that ``mask`` does not keep, in place.

    ``mask`` is a :class:`HeadMask` or mask-file JSON (``{"keep": ...}`` / ``{"drop": ...}``) in the
    model's current head numbering. Refuses (HeadcutError) masks that name unknown blocks or heads,
    or that the GQA policy cannot realise, before changing anything. ``planned``: the cuts of blocks ``mask``
    keeps whole that another step planned (a merge of KV heads), realised in the same reshape.
    """
    blocks = adapter_for(model).blocks(model.base_model)
    cuts = plan_cuts(resolve_mask(mask, blocks), blocks, gqa)
    heads = {b.name: b.heads for b in blocks}
    for name in planned or {}:
        if name not in heads or len(cuts[name].q) != heads[name]:
            raise HeadcutError(f"internal: block {name} is both cut by the mask and given a planned cut")
    return reshape(model, {**cuts, **(planned or {})})


def reshape(model: nn.Module, cuts: dict[str, BlockCut]) -> SlimResult:
    """Realise ``cuts`` (per block, in its current numbering) on ``model`` in place and record them in
    ``config.headcut``: what :func:`slim` does once the mask is planned (a merge of KV heads plans its own cuts)."""
    adapter = adapter_for(model)
    base = model.base_model
    blocks = adapter.blocks(base)
    before = count_params(model)
    heads_before = {b.name: b.heads for b in blocks}
    facts = adapter.prepare(model, cuts)
    unshared = count_params(model) - before
    blocks = adapter.blocks(base)
    apply_ops(base, block_ops(adapter, base, blocks, cuts), runtime_mixins())
    previous = getattr(model.config, "headcut", None)
    model.config.headcut = build_record(model, adapter, _compose(previous, blocks, cuts))
    after = adapter.blocks(base)
    notes = list(facts.get("notes", [])) + adapter.notes(base, after)
    return SlimResult(
        heads_before=heads_before,
        heads_after={b.name: b.heads for b in after},
        params_before=before,
        params_after=count_params(model),
        unshared_params=unshared,
        notes=notes,
    )
