"""The cut of a streamed checkpoint (:mod:`headcut.model.streamed`), layer by layer: each layer's weights read,
cut by the adapter's ops (the same ops as :func:`headcut.slim`) and written to the output's shards; every other
tensor copied as stored."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..adapters import BlockCut, runtime_mixins
from ..adapters.runtime import apply_ops
from ..errors import HeadcutError
from .streamed import LayerwiseStats, StreamedModel
from .surgery import _compose, block_ops, build_record
from .tensor_files import ShardWriter

#: the largest output shard (a shard is held in memory until it is written: a layer-wise run writes about one layer
#: per shard, so that this bound never sets its peak)
SHARD_BYTES = 2 * 1024**3


def write_layerwise(
    streamed: StreamedModel,
    cuts: dict[str, BlockCut],
    folder: Path,
    stats: LayerwiseStats,
    shard_bytes: int = SHARD_BYTES,
    progress: Callable[[int, int], None] | None = None,
    before_cut: Callable[[int], None] | None = None,
    after_cut: Callable[[int], None] | None = None,
) -> None:
    """Cut every layer of ``streamed`` by ``cuts`` and write all tensors as safetensors shards into ``folder``
    (an existing empty folder); afterwards the meta model carries the cut (shapes, record in its config).
    ``before_cut(i)`` / ``after_cut(i)``: called with layer ``i``'s weights in memory, before its cut and before it
    is written."""
    start = time.perf_counter()
    model, adapter = streamed.model, streamed.adapter
    base = model.base_model
    ops = block_ops(adapter, base, streamed.blocks, cuts)
    rel = [p.removeprefix(streamed._base_prefix()) for p in streamed.prefixes]
    per_layer: list[list[dict[str, Any]]] = [[] for _ in streamed.layers]
    for op in ops:
        index = next((i for i, p in enumerate(rel) if op["path"] == p or op["path"].startswith(p + ".")), None)
        if index is None:
            raise HeadcutError(f"layer-wise pruning: the cut changes {op['path']}, outside the layers")
        per_layer[index].append(op)
    # shards of about one layer: the writer holds a shard in memory until it is written
    limit = min(shard_bytes, max(streamed.layer_bytes(i) for i in range(len(streamed.layers))))
    writer = ShardWriter(folder, limit)
    outside = streamed.outside_layers()
    for start_at in range(0, len(outside), 64):
        part = dict(outside[start_at : start_at + 64])
        tensors = streamed.checkpoint.read(list(part.values()))
        for name, key in part.items():
            writer.add(name, tensors[key])
    mixins = runtime_mixins()
    n = len(streamed.layers)
    for i, layer in enumerate(streamed.layers):
        streamed.materialize(layer, streamed.prefixes[i])
        try:
            if before_cut is not None:
                before_cut(i)
            apply_ops(base, per_layer[i], mixins)
            if after_cut is not None:
                after_cut(i)
            for name, t in layer.state_dict().items():
                writer.add(f"{streamed.prefixes[i]}.{name}", t)
        finally:
            streamed.release(layer)
        if writer.size >= limit:
            writer.flush()
        if progress is not None:
            progress(i + 1, n)
    stats.shards = writer.finish()
    previous = getattr(model.config, "headcut", None)
    model.config.headcut = build_record(model, adapter, _compose(previous, streamed.blocks, cuts))
    stats.write_seconds = time.perf_counter() - start
