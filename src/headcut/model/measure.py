"""Measurements of one model's calls: FLOPs of a forward, the peak resident memory it adds, the
milliseconds of timed calls (alone or in interleaved rounds) and the bytes of a KV cache."""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from ..errors import HeadcutError
from ..stats import round_order


def _sdpa_flops(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _custom_flop_formulas() -> dict[Any, Any]:
    """Fused attention kernels PyTorch's counter has no formula for (CPU flash attention)."""
    out: dict[Any, Any] = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            out[op] = _sdpa_flops
    return out


def count_flops(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[int, dict[str, int]]:
    """FLOPs of one forward of ``model`` on ``inputs``: total and per aten op."""
    counter = FlopCounterMode(display=False, custom_mapping=_custom_flop_formulas())
    # the counter's module tracker hooks tensors that require grad, which fails in inference mode
    # when a model passes a parameter between modules (DeBERTa's relative embeddings)
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        with torch.inference_mode(), counter:
            model(**inputs)
    finally:
        for p in trainable:
            p.requires_grad_(True)
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return int(counter.get_total_flops()), dict(sorted(by_op.items()))


class RssPeak:
    """Peak resident memory increase of this process on Linux (VmHWM after a reset via clear_refs)."""

    kind = "cpu_peak_rss_increase"

    def __init__(self) -> None:
        self.before: int | None = None

    @staticmethod
    def _status(field_name: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
        raise OSError(f"{field_name} not in /proc/self/status")

    def start(self) -> None:
        gc.collect()
        try:  # give freed heap memory back to the system so it cannot hide the forwards' peak
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.before = self._status("VmRSS")
        except OSError:
            self.before = None

    def stop(self) -> int | None:
        if self.before is None:
            return None
        try:
            return max(0, self._status("VmHWM") - self.before)
        except OSError:
            return None


class SelfTimed(float):
    """What a call returns when it timed its own work, in milliseconds: a runtime in another process (vLLM)
    times the steps it was asked for where they run, without the pipe to it. :func:`time_calls` and
    :func:`time_rounds` take this figure for the call instead of timing it from outside."""


def _time_one(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call of ``fn`` (CUDA events on CUDA, perf_counter elsewhere), or the
    :class:`SelfTimed` figure it returns."""
    if device.type == "cuda":
        with torch.cuda.device(device):  # events record on the current device's stream
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    out = fn()
    elapsed = (time.perf_counter() - t0) * 1000.0
    return float(out) if isinstance(out, SelfTimed) else elapsed


def time_calls(
    fn: Callable[[], Any], runs: int, device: torch.device, step: Callable[[int], None] | None = None
) -> list[float]:
    """Milliseconds of ``runs`` calls of ``fn`` (CUDA events on CUDA, perf_counter on CPU)."""
    times: list[float] = []
    for i in range(runs):
        times.append(_time_one(fn, device))
        if step is not None:
            step(i + 1)
    return times


def time_rounds(
    calls: Sequence[Callable[[], Any]],
    rounds: int,
    clocks: Sequence[torch.device],
    step: Callable[[int], None] | None = None,
) -> list[list[float]]:
    """Milliseconds of ``rounds`` interleaved rounds: round ``r`` makes one timed call of each of ``calls`` in
    :func:`round_order` (``clocks[i]`` times call ``i``, as :func:`time_calls` does). Returns one list per
    call, in round order: ``[i][r]`` is call ``i`` in round ``r``. ``step(r)`` after round ``r`` (from 1)."""
    if len(clocks) != len(calls):
        raise ValueError(f"{len(calls)} calls but {len(clocks)} clocks")
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        for i in round_order(len(calls), r):
            times[i].append(_time_one(calls[i], clocks[i]))
        if step is not None:
            step(r + 1)
    return times


def storages_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The key and value tensors of a transformers cache (or every tensor of a legacy tuple of tuples)."""
    if cache is None:
        return []
    if isinstance(cache, torch.Tensor):
        return [cache]
    if isinstance(cache, (tuple, list)):
        return [t for item in cache for t in _cache_tensors(item)]
    layers = getattr(cache, "layers", None)
    if layers is not None:
        out = []
        for layer in layers:
            out += [
                t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor)
            ]
        return out
    raise HeadcutError(f"cannot read a KV cache of type {type(cache).__name__}")


def kv_cache_size(cache: Any) -> dict[str, int | None]:
    """Bytes and cached positions of a ``past_key_values`` (self-attention and cross-attention apart)."""
    self_cache = getattr(cache, "self_attention_cache", cache)
    cross_cache = getattr(cache, "cross_attention_cache", None)
    out: dict[str, int | None] = {
        "bytes": storages_bytes(_cache_tensors(self_cache)),
        "positions": int(self_cache.get_seq_length()),
        "cross_bytes": None,
        "cross_positions": None,
    }
    if cross_cache is not None:
        out["cross_bytes"] = storages_bytes(_cache_tensors(cross_cache))
        out["cross_positions"] = int(cross_cache.get_seq_length())
    return out
