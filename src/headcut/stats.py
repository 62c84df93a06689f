"""Summaries of repeated timings: percentiles, the rotated order of interleaved rounds and the paired
speed-up of two rows timed in the same rounds (stdlib only)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def round_order(count: int, round_index: int) -> list[int]:
    """The order of ``count`` rows in round ``round_index`` (from 0) of an interleaved bench: rotated by one
    each round (0 1 2, 1 2 0, 2 0 1, 0 1 2, ...; two rows alternate), so over ``count`` consecutive rounds
    every row runs once in every position."""
    if count < 1:
        return []
    return [(round_index + i) % count for i in range(count)]


def paired_speedup(
    baseline_ms: Sequence[float], model_ms: Sequence[float], scale: float = 1.0
) -> tuple[float, float, bool | None] | None:
    """The per-round speed-ups of an interleaved bench, ``scale * baseline_ms[r] / model_ms[r]`` (both timed in
    round ``r``), summarised as ``(p25, p75, within_noise)``: their 25th and 75th percentiles (see
    :func:`percentile`) and whether that interval contains 1.0, i.e. the difference is within run-to-run noise.
    ``within_noise`` is None with a single pair (one ratio tells nothing of the noise); the whole result is
    None when no round has two positive times. ``scale``: the work of one of this model's calls over the
    baseline's (generation: its new tokens / the baseline's), so the ratio reads as a throughput ratio."""
    if len(baseline_ms) != len(model_ms):
        raise ValueError(f"paired times need as many rounds: {len(baseline_ms)} and {len(model_ms)}")
    ratios = [scale * b / m for b, m in zip(baseline_ms, model_ms) if b > 0 and m > 0]
    if not ratios:
        return None
    low, high = percentile(ratios, 25), percentile(ratios, 75)
    return low, high, (low <= 1.0 <= high) if len(ratios) > 1 else None
