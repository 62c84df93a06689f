"""Checking a saved model before anything is allocated: the ``headcut`` record of its config.json,
and the agreement between its config and its weights.

A slimmed checkpoint's ``config.json`` carries the cut as a record (see :mod:`headcut.model.surgery`):
``format``, ``runtime_format``, ``headcut_version``, ``family``, ``blocks`` (the kept original query
and KV heads per block) and ``ops`` (what the runtime does to a freshly built full model). A crafted
or damaged record must not reach the runtime, so :func:`check_record`

1. checks the record's shape and types against a fixed schema (known keys, known format version:
   a newer one says which headcut wrote it);
2. builds the uncut architecture on the meta device (no memory) and checks every block entry
   against it: known block names, head counts equal to the configuration's, head indices in range,
   no repeated query head, ``len(q) == len(kv) * groups`` and each query head served by its own KV
   group;
3. recomputes the ops from the blocks with headcut's own adapter and requires them to equal the
   recorded ops: so every path, attribute, head size and mixin the runtime will touch is one that
   headcut itself produces for this architecture;
4. applies the ops to the meta model and returns the number of values it holds, which the loader
   compares with the weights files before loading.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..adapters import adapter_for_config, runtime_mixins
from ..adapters.base import BlockCut
from ..adapters.runtime import RUNTIME_FORMAT, apply_ops
from ..errors import HeadcutError
from .surgery import PLAIN_RECORD_FORMAT, RECORD_FORMAT, block_ops, count_params

RECORD_KEYS = {"format", "runtime_format", "headcut_version", "family", "blocks", "ops"}
ENTRY_KEYS = {"q", "kv", "groups", "heads", "kv_heads"}


def _damaged(path: str, why: str) -> HeadcutError:
    return HeadcutError(
        f"{path}: the headcut record in config.json is damaged or was edited by hand ({why}); nothing was loaded"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _check_shape(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise _damaged(where, "it is not a JSON object")
    fmt = record.get("format")
    if not _is_int(fmt):
        raise _damaged(where, f"format {fmt!r} is not a version number")
    if fmt > RECORD_FORMAT or (_is_int(record.get("runtime_format")) and record["runtime_format"] > RUNTIME_FORMAT):
        by = record.get("headcut_version")
        by = by if isinstance(by, str) and len(by) < 40 else "a newer headcut"
        raise HeadcutError(
            f"{where} was saved by headcut {by} (record format {fmt}), newer than this headcut "
            f"{__version__} (format {RECORD_FORMAT}): upgrade headcut to load it"
        )
    if fmt not in (PLAIN_RECORD_FORMAT, RECORD_FORMAT):
        raise _damaged(where, f"unknown format {fmt}")
    unknown = sorted(set(record) - RECORD_KEYS)
    if unknown:
        raise _damaged(where, f"unknown key {unknown[0]!r}")
    missing = sorted(RECORD_KEYS - set(record))
    if missing:
        raise _damaged(where, f"no {missing[0]!r}")
    if record["runtime_format"] != RUNTIME_FORMAT:
        raise _damaged(where, f"unknown runtime_format {record['runtime_format']!r}")
    if not isinstance(record["headcut_version"], str):
        raise _damaged(where, "headcut_version is not a string")
    if not isinstance(record["blocks"], dict) or not isinstance(record["ops"], list):
        raise _damaged(where, "blocks must be an object and ops a list")
    for name, entry in record["blocks"].items():
        if not isinstance(entry, dict) or not ENTRY_KEYS <= set(entry) <= ENTRY_KEYS | {"merged"}:
            raise _damaged(where, f"block {name!r} needs exactly the keys {', '.join(sorted(ENTRY_KEYS))} (and merged)")
        merged = entry.get("merged")
        if merged is not None and fmt < RECORD_FORMAT:
            raise _damaged(where, f"block {name!r}: merged KV heads in a format {fmt} record")
        if merged is not None and not (isinstance(merged, list) and all(_int_list(c) and c for c in merged)):
            raise _damaged(where, f"block {name!r}: merged must be a list of lists of KV head indices")
        if not (_int_list(entry["q"]) and _int_list(entry["kv"])):
            raise _damaged(where, f"block {name!r}: q and kv must be lists of head indices")
        for key in ("groups", "heads", "kv_heads"):
            if not _is_int(entry[key]):
                raise _damaged(where, f"block {name!r}: {key} must be an integer")
    return record


def _check_entry(where: str, name: str, entry: dict[str, Any], heads: int, kv_heads: int) -> BlockCut:
    if entry["heads"] != heads or entry["kv_heads"] != kv_heads:
        raise _damaged(
            where,
            f"block {name} has {heads} heads and {kv_heads} KV heads in this architecture, "
            f"the record says {entry['heads']} and {entry['kv_heads']}",
        )
    q, kv, groups = entry["q"], entry["kv"], entry["groups"]
    bad_q = [h for h in q if not 0 <= h < heads]
    bad_kv = [h for h in kv if not 0 <= h < kv_heads]
    if bad_q or bad_kv:
        index = (bad_q or bad_kv)[0]
        top = heads if bad_q else kv_heads
        raise _damaged(where, f"block {name}: head index {index} out of range 0..{top - 1}")
    if len(set(q)) != len(q):
        raise _damaged(where, f"block {name}: a query head is kept twice")
    if not 1 <= groups <= heads or len(q) != len(kv) * groups:
        raise _damaged(where, f"block {name}: {len(q)} query heads do not fill {len(kv)} KV slots of {groups}")
    full_group = heads // kv_heads if kv_heads else 1
    merged = entry.get("merged")
    if merged is not None:  # a merged block: each slot's KV head is the first of the heads merged into it
        flat = [k for cluster in merged for k in cluster]
        if len(merged) != len(kv) or any(c[0] != k for c, k in zip(merged, kv)):
            raise _damaged(where, f"block {name}: merged does not list each KV slot's heads, its own first")
        if len(set(flat)) != len(flat) or any(not 0 <= k < kv_heads for k in flat):
            raise _damaged(where, f"block {name}: merged names a KV head twice or out of range")
    slots = merged if merged is not None else [[k] for k in kv]
    if any(q[i] // full_group not in slots[i // groups] for i in range(len(q))):
        raise _damaged(where, f"block {name}: a query head is paired with another group's KV head")
    return BlockCut(tuple(q), tuple(kv), groups, None if merged is None else tuple(tuple(c) for c in merged))


def _plain(value: Any) -> Any:
    """JSON's view of ``value`` (tuples become lists), to compare recomputed ops with stored ones."""
    return json.loads(json.dumps(value))


def uncut_model(config: Any, cls: type) -> nn.Module:
    """The architecture of ``config`` without its cut, on the meta device (no memory, no weights)."""
    bare = copy.deepcopy(config)
    if hasattr(bare, "headcut"):
        delattr(bare, "headcut")
    with torch.device("meta"):
        return cls(bare)


def check_record(config: Any, cls: type, where: str) -> nn.Module:
    """Validate ``config.headcut`` (if any) against the architecture of ``cls``; return the cut model
    on the meta device (for sizes). One-line :class:`HeadcutError` for anything wrong."""
    adapter = adapter_for_config(config)
    try:
        skeleton = uncut_model(config, cls)
    except (
        ValueError,
        TypeError,
        AttributeError,
        RuntimeError,
        IndexError,
        KeyError,
        OverflowError,
        ZeroDivisionError,
    ) as exc:  # the numbers were checked before; this is the last net
        raise HeadcutError(
            f"{where}: cannot build {cls.__name__} from config.json "
            f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
        ) from None
    record = getattr(config, "headcut", None)
    if record is None:
        return skeleton
    record = _check_shape(record, where)
    if record["family"] != adapter.family:
        raise _damaged(where, f"family {record['family']!r}, but config.json describes a {adapter.family} model")
    base = skeleton.base_model
    blocks = {b.name: b for b in adapter.blocks(base)}
    cuts = {}
    for name, entry in record["blocks"].items():
        block = blocks.get(name)
        if block is None:
            raise _damaged(where, f"unknown block {name!r}")
        cuts[name] = _check_entry(where, name, entry, block.heads, block.kv_heads)
    try:
        expected = block_ops(adapter, base, list(blocks.values()), cuts)
    except (ValueError, IndexError) as exc:
        raise _damaged(where, str(exc)) from None
    if _plain(expected) != record["ops"]:
        raise _damaged(where, "its ops are not the ones its kept heads give")
    apply_ops(base, record["ops"], runtime_mixins())
    return skeleton


def expected_values(model: nn.Module) -> int:
    """Values a model's weights hold: distinct parameters and persistent buffers."""
    persistent = sum(
        buf.numel()
        for mod in model.modules()
        for name, buf in mod.named_buffers(recurse=False)
        if name not in getattr(mod, "_non_persistent_buffers_set", set())
    )
    return count_params(model) + persistent
