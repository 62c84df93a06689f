"""Head masks: reading mask files, validating them against a model, and turning them into cuts.

A mask file is JSON: ``{"keep": {"<block name>": [head indices]}}`` or ``{"drop": {...}}``. Indices
refer to the model's current heads. Blocks a ``keep`` mask does not name keep all their heads;
blocks a ``drop`` mask does not name lose none.

Grouped-query attention (GQA) limits which sets of query heads can be removed exactly; the policy
(``--gqa``) says how a kept set is realised:

* ``group``: only whole KV groups are removed (a query head goes with its group);
* ``uniform``: every remaining KV group keeps the same number of query heads;
* ``duplicate``: any subset, by giving each kept query head its own copy of its KV head (exact,
  but stores more KV weights and cache);
* ``auto`` (default): ``group`` where it works, else ``uniform``, else refuse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.base import Block, BlockCut
from ..errors import HeadcutError

GQA_POLICIES = ("auto", "group", "uniform", "duplicate")


@dataclass
class HeadMask:
    """Kept heads per block name (every block of the model), in current head numbering."""

    keep: dict[str, list[int]] = field(default_factory=dict)

    def total(self) -> int:
        return sum(len(v) for v in self.keep.values())

    def to_json(self) -> dict[str, Any]:
        return {"keep": {k: list(v) for k, v in self.keep.items()}}

    @classmethod
    def full(cls, blocks: Iterable[Block]) -> HeadMask:
        return cls({b.name: list(range(b.heads)) for b in blocks})


def read_mask_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a mask JSON file and check its form (:func:`check_mask`); one-line errors for missing,
    unreadable or malformed files."""
    p = Path(path)
    if not p.is_file():
        raise HeadcutError(f"mask file not found: {p}")
    try:
        raw = json.loads(p.read_bytes())
    except PermissionError:
        raise HeadcutError(f"cannot read {p}: permission denied") from None
    except RecursionError:
        raise HeadcutError(
            f"mask file {p} is nested too deeply to be a mask "
            '(expected {"keep": {block: [heads]}} or {"drop": ...})'
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise HeadcutError(f"mask file {p} is not valid JSON: {str(exc).strip().splitlines()[0]}") from None
    try:
        check_mask(raw)
    except HeadcutError as exc:
        raise HeadcutError(f"mask file {p}: {exc}") from None
    return raw


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_mask(raw: Any) -> tuple[str, Mapping[str, Any]]:
    """Check the form of mask-file JSON (or the same as Python objects) without a model: an object
    with exactly one of ``keep`` or ``drop``, mapping block names to lists of distinct head indices
    (integers; not booleans, floats, strings or null). Returns the mode and its entries."""
    if not isinstance(raw, Mapping):
        raise HeadcutError(
            f'a mask must be a JSON object {{"keep": {{...}}}} or {{"drop": {{...}}}}, not {type(raw).__name__}'
        )
    modes = [k for k in ("keep", "drop") if k in raw]
    extra = sorted(map(str, set(raw) - {"keep", "drop"}))
    if len(modes) != 1 or extra:
        raise HeadcutError('a mask needs exactly one of "keep" or "drop" (and nothing else)')
    mode = modes[0]
    entries = raw[mode]
    if not isinstance(entries, Mapping):
        what = "null" if entries is None else type(entries).__name__
        raise HeadcutError(f'mask "{mode}" must map block names to lists of head indices, not {what}')
    for name, heads in entries.items():
        if not isinstance(name, str):
            raise HeadcutError(f'mask "{mode}" names block {name!r:.40}: block names are strings such as "self.0"')
        if heads is None:
            raise HeadcutError(
                f"mask entry for block {name} is null: give a list of head indices "
                f"(an empty list {'drops every head' if mode == 'keep' else 'drops none'})"
            )
        if not isinstance(heads, (list, tuple)) or not all(_is_index(h) for h in heads):
            bad = heads if not isinstance(heads, (list, tuple)) else next(h for h in heads if not _is_index(h))
            found = json.dumps(bad) if bad is None or isinstance(bad, bool) else repr(bad)[:40]
            raise HeadcutError(f"mask entry for block {name} must be a list of integers (head indices; found {found})")
        if len(set(heads)) != len(heads):
            dup = next(h for h in heads if heads.count(h) > 1)
            raise HeadcutError(f"head index {dup} repeated in mask entry for block {name}")
    return mode, entries


def resolve_mask(raw: Mapping[str, Any] | HeadMask, blocks: list[Block]) -> HeadMask:
    """Validate ``raw`` (mask-file JSON or a HeadMask) against ``blocks``; return a complete HeadMask."""
    if isinstance(raw, HeadMask):
        raw = {"keep": raw.keep}
    mode, entries = check_mask(raw)
    by_name = {b.name: b for b in blocks}
    unknown = [n for n in entries if n not in by_name]
    if unknown:
        names = [b.name for b in blocks]
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise HeadcutError(f"unknown block name {unknown[0]!r} in mask; this model's blocks: {shown}")
    keep: dict[str, list[int]] = {}
    for block in blocks:
        if block.name not in entries:
            keep[block.name] = list(range(block.heads))  # unnamed: kept (keep) or not dropped (drop)
            continue
        heads = list(entries[block.name])
        bad = [h for h in heads if not 0 <= h < block.heads]
        if bad:
            raise HeadcutError(
                f"head index {bad[0]} out of range for block {block.name} (it has {block.heads} heads: 0..{block.heads - 1})"
            )
        chosen = sorted(heads)
        keep[block.name] = chosen if mode == "keep" else [h for h in range(block.heads) if h not in set(chosen)]
    return HeadMask(keep)


def valid_counts(block: Block, policy: str) -> list[int]:
    """Head counts a block can keep under a GQA policy."""
    g, k = block.group_size, block.kv_heads
    if policy == "duplicate" or g == 1:
        return list(range(block.heads + 1))
    if policy == "group":
        return [c * g for c in range(k + 1)]
    # uniform (and auto, whose group counts are a subset): m heads in each of c groups
    return sorted({m * c for m in range(1, g + 1) for c in range(1, k + 1)} | {0})


def block_cut(block: Block, kept: list[int], policy: str) -> BlockCut | None:
    """The cut that keeps query heads ``kept`` of ``block`` under a GQA policy, or None where it cannot."""
    g = block.group_size
    if g == 1:
        return BlockCut(tuple(kept), tuple(kept), 1)
    counts: dict[int, int] = {}
    for h in kept:
        counts[h // g] = counts.get(h // g, 0) + 1
    groups = sorted(counts)
    if policy in ("group", "auto") and all(c == g for c in counts.values()):
        return BlockCut(tuple(kept), tuple(groups), g)
    if policy in ("uniform", "auto") and len(set(counts.values())) <= 1:
        m = next(iter(counts.values()), g)
        return BlockCut(tuple(kept), tuple(groups), m)
    if policy == "duplicate":
        return BlockCut(tuple(kept), tuple(h // g for h in kept), 1)
    return None


def plan_cuts(mask: HeadMask, blocks: list[Block], policy: str = "auto") -> dict[str, BlockCut]:
    """Turn a complete mask into per-block cuts, refusing what the GQA policy cannot realise."""
    if policy not in GQA_POLICIES:
        raise HeadcutError(f"unknown --gqa policy {policy!r}; choose one of {', '.join(GQA_POLICIES)}")
    cuts: dict[str, BlockCut] = {}
    for block in blocks:
        kept = mask.keep[block.name]
        cut = block_cut(block, kept, policy)
        if cut is None:
            valid = valid_counts(block, policy)
            n = len(kept)
            nearest = sorted(valid, key=lambda c: (abs(c - n), c))[:2]
            why = (
                "a count this policy cannot keep"
                if n not in valid
                else "heads that do not fill whole KV groups equally"
            )
            raise HeadcutError(
                f"--gqa {policy} cannot keep heads {kept} of block {block.name} ({why}; "
                f"{block.kv_heads} KV groups of {block.group_size}); valid counts for this block: "
                f"{', '.join(map(str, valid))} (nearest: {' or '.join(map(str, sorted(nearest)))}); "
                "--gqa duplicate keeps any subset"
            )
        cuts[block.name] = cut
    return cuts
