"""The page section "Decoders: the default's cut against an 8-bit KV cache", from ``results/kv8.json``
(``benchmarks/studies/kv8.py``)."""

from __future__ import annotations

from typing import Any

TITLE = "Decoders: the default's cut against an 8-bit KV cache"
LABELS = {"unpruned": "unpruned", "quarter": "a quarter of the KV bytes removed", "half": "half removed"}


def _speed(gen: dict[str, Any]) -> str:
    value = gen.get("speedup")
    if value is None:
        return "1 (baseline)"
    text = f"{value:.2f}x"
    low, high = gen.get("speedup_p25"), gen.get("speedup_p75")
    if low is not None and high is not None:
        text += f" ({low:.2f}-{high:.2f}{', noise' if gen.get('within_noise') else ''})"
    return text


def render_markdown(data: dict[str, Any]) -> list[str]:
    """The section's lines."""
    m = data.get("machine", {})
    rows = data.get("rows", {})
    bench = {r["name"]: r for r in (data.get("bench") or {}).get("models", [])}
    base = rows.get("unpruned/auto", {}).get("perplexity", {})
    lines = [
        "",
        f"## {TITLE}",
        "",
        "SmolLM2-135M-Instruct served by vLLM's CPU build in bfloat16 (`headcut bench --runtime vllm "
        '--kv-cache-dtype auto,fp8`), its own 16-bit KV cache against vLLM\'s 8-bit one (`kv_cache_dtype="fp8"`), '
        "for the unpruned model and the default recipe's cuts (`headcut prune --kv-budget F --context 2048`, "
        "written as DeciLM). KV bytes: the cache of the 16-bit unpruned model = 1. Perplexity of hamlet.txt's "
        "first 16,384 tokens (no calibration reads it) in vLLM (its prompt log-probabilities), in windows of 128 and "
        "2,048 tokens. Decode: 32 tokens after a prompt of 8,159 random tokens (the cache ends at 8,192 positions), "
        "batch 1, the six engines timed interleaved; speed-up over the unpruned 16-bit row, p25-p75 of the paired "
        "per-round ratios. "
        + (
            f"{m.get('cpu')} ({m.get('cores')} cores, 2 threads), {m.get('date')}, headcut {m.get('headcut')}; "
            f"measured by `{data.get('command')}` ({data.get('seconds', 0) / 60:.0f} min)."
            if m
            else "The decode timing has not completed yet (its run was stopped): the perplexities only, measured by "
            "`python -m benchmarks.studies.kv8 run --vllm-python V/bin/python --cuts quarter` on 2 CPU cores, "
            "2026-11-29. The half cut (the 8-bit cache's bytes) was not made yet: no row at equal bytes."
        ),
        "",
        "| model | KV cache | KV bytes | ppl 128 | ppl 2,048 | decode tok/s at 8k | speed-up |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    cuts = data.get("cuts", {})
    for row in rows.values():
        model, cache = row["model"], row["kv_cache_dtype"]
        fraction = 1.0 if model == "unpruned" else cuts.get(model, {}).get("kv_fraction")
        size = None if fraction is None else fraction * (0.5 if cache != "auto" else 1.0)
        ppl = row.get("perplexity", {})
        cells = []
        for window in ("128", "2048"):
            value, ref = ppl.get(window), base.get(window)
            cells.append("-" if value is None else f"{value:.2f}" + (f" ({value / ref - 1:+.1%})" if ref else ""))
        gen = (bench.get(f"{model} [kv {cache}]") or {}).get("generation") or {}
        tokens = gen.get("tokens_per_s")
        lines.append(
            f"| {LABELS.get(model, model)} | {'8-bit' if cache != 'auto' else '16-bit'} "
            f"| {'-' if size is None else f'{size:.3g}'} | {cells[0]} | {cells[1]} "
            f"| {'-' if tokens is None else f'{tokens:.1f}'} | {_speed(gen) if gen else '-'} |"
        )
    return lines
