"""What ``headcut bench`` measured: one result per model and runtime, the speed-ups relative to the first
one, and the ``--json`` report."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

from ... import __version__
from ...config import BenchConfig
from ...stats import paired_speedup


@dataclass
class GenerationResult:
    """Cached greedy generation of one model (see :mod:`headcut.jobs.bench.run`)."""

    new_tokens: int
    runs_ms: list[float]
    median_ms: float
    p25_ms: float
    p75_ms: float
    tokens_per_s: float
    kv_cache_bytes: int
    kv_cache_positions: int
    kv_bytes_per_token: float
    cross_kv_cache_bytes: int | None = None
    cross_kv_cache_positions: int | None = None
    cross_kv_bytes_per_token: float | None = None
    speedup: float | None = None
    #: the 25th..75th percentile of the per-round tokens/s ratios to the first row (interleaved rows after it)
    speedup_p25: float | None = None
    speedup_p75: float | None = None
    #: whether that interval contains 1.0 (None: no pairs, or a single round)
    within_noise: bool | None = None
    #: whether the timed calls include the prompt's prefill (torch, onnxruntime) or only the decoding steps (vllm)
    prefill_included: bool = True
    #: bytes read per new token: the weights read once per decoding step (shared by the batch) plus each
    #: sequence's KV cache at the mean cached length of the decoding steps, over the batch size
    bytes_per_token: float | None = None
    #: the speed-up those bytes alone predict for a memory-bound decoder: the first row's bytes per token / this
    #: row's (filled by :func:`compare`)
    ideal_speedup: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchResult:
    """Everything measured for one model (in one runtime); ``speedup``/``flop_ratio`` and the paired interval
    ``speedup_p25``..``speedup_p75`` with its ``within_noise`` verdict are filled by :func:`compare`."""

    name: str
    architecture: str
    model_type: str
    dtype: str
    attn_implementation: str | None
    device: str
    threads: int
    inputs: dict[str, list[int]]
    heads: int | None
    kv_heads: int | None
    params: int
    weights_bytes: int
    flops: int
    flops_by_op: dict[str, int]
    runs_ms: list[float]
    median_ms: float
    p90_ms: float
    p25_ms: float
    p75_ms: float
    examples_per_s: float
    tokens_per_s: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str
    generation: GenerationResult | None = None
    speedup: float | None = None
    flop_ratio: float | None = None
    notes: list[str] = field(default_factory=list)
    runtime: str = "torch"
    #: the 25th..75th percentile of the per-round speed-ups against the first row (interleaved rows after it)
    speedup_p25: float | None = None
    speedup_p75: float | None = None
    #: whether that interval contains 1.0: the difference is within run-to-run noise (None: no pairs, or one round)
    within_noise: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["generation"] = self.generation.to_json() if self.generation is not None else None
        return out


def compare(results: list[BenchResult], *, paired: bool = False) -> list[BenchResult]:
    """Fill ``speedup`` and ``flop_ratio`` (and generation speed-ups) relative to the first result; a
    single model has no baseline, so they stay None. ``paired``: the results were timed interleaved (run
    ``r`` of every result in the same round), so each result after the first also gets the interval of its
    per-round speed-ups and its ``within_noise`` verdict (:func:`paired_speedup`)."""
    if len(results) < 2:
        return results
    first = results[0]
    for k, r in enumerate(results):
        r.speedup = first.median_ms / r.median_ms if r.median_ms > 0 else None
        r.flop_ratio = first.flops / r.flops if r.flops > 0 else None
        gen, base = r.generation, first.generation
        if gen is not None and base is not None and base.tokens_per_s > 0:
            gen.speedup = gen.tokens_per_s / base.tokens_per_s
        if gen is not None and base is not None and base.bytes_per_token and gen.bytes_per_token:
            gen.ideal_speedup = base.bytes_per_token / gen.bytes_per_token
        if not paired or k == 0:
            continue
        interval = paired_speedup(first.runs_ms, r.runs_ms)
        if interval is not None:
            r.speedup_p25, r.speedup_p75, r.within_noise = interval
        if gen is not None and base is not None and base.new_tokens > 0:
            interval = paired_speedup(base.runs_ms, gen.runs_ms, gen.new_tokens / base.new_tokens)
            if interval is not None:
                gen.speedup_p25, gen.speedup_p75, gen.within_noise = interval
    return results


def device_name(device: str) -> str:
    """A readable name of the device (GPU model, or the CPU model from /proc/cpuinfo)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report_json(results: list[BenchResult], config: BenchConfig, warnings: list[str] | None = None) -> dict[str, Any]:
    """The ``--json`` document: settings, environment, the schedule (``interleaved``: in rounds, the order
    rotated each round; ``back to back``: one model after the other), the ``warnings`` of the settings (None:
    ``config.validate()``'s, read here) and one entry per model."""

    return {
        "config": config.to_json(),
        "schedule": "interleaved" if config.interleave else "back to back",
        "device": config.device,
        "device_name": device_name(config.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "headcut": __version__,
        "warnings": config.validate() if warnings is None else warnings,
        "models": [r.to_json() for r in results],
    }
