"""The page section "Serving in vLLM", from ``results/serving.json`` (``benchmarks/studies/serving.py``)."""

from __future__ import annotations

import json
from typing import Any


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_markdown(data: dict[str, Any]) -> str:
    """The page section "Serving in vLLM"."""
    m = data.get("machine", {})
    lines = ["## Serving in vLLM", ""]
    lines.append(
        f"SmolLM2-135M-Instruct and its cuts served by vLLM's CPU build {m.get('vllm')} (`headcut bench --runtime "
        f"vllm`, vLLM in its own virtualenv), batch 1, float32, on {m.get('cpu')} ({m.get('cores')} cores, 2 threads), "
        f"{m.get('date')}; measured by `python -m benchmarks.studies.serving run` ({data.get('seconds', 0) / 60:.0f} "
        "min). Each context is one interleaved benchmark: every model in a vLLM engine of its own, rounds of one "
        "prefill of each (a prompt of C - 33 random tokens at a context of C, no prefix caching), then rounds of one "
        "decode of each (32 tokens after such a prompt, up to C positions; only the decoding steps timed, inside "
        "vLLM's process). Speed-up: median over "
        "the unpruned model's, with the p25-p75 of the paired per-round ratios ('noise' when it contains 1). "
        "Ideal: prefill, the FLOP ratio (FLOPs computed from the layers vLLM built: the padded query heads count); "
        "decode, the ratio of bytes read per new token (the matrices once per step plus the KV cache at the mean "
        "cached length). KV bytes/token: from the attention layers vLLM built (K and V, float32), what its cache "
        "holds per position."
    )
    lines.append("")
    cuts = data.get("cuts", {})
    desc = {
        "unpruned": "unpruned (stock)",
        "quarter-layers": "a quarter of the KV groups, per layer (DeciLM)",
        "third-layers": "a third, per layer (DeciLM)",
        "third-uniform": "a third, uniform (stock Llama)",
    }
    for context, report in sorted(data.get("contexts", {}).items(), key=lambda kv: int(kv[0])):
        lines += [
            f"**Context {int(context):,} tokens**",
            "",
            "| model | heads (KV) served | KV bytes/token | prefill tok/s | speed-up | ideal | decode tok/s "
            "| speed-up | ideal |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in report["models"]:
            gen = row["generation"] or {}

            def speed(value: float | None, low: float | None, high: float | None, within: bool | None) -> str:
                if value is None:
                    return "-"
                text = f"{value:.2f}x"
                if low is not None and high is not None:
                    text += f" ({low:.2f}-{high:.2f}{', noise' if within else ''})"
                return text

            name = row["name"]
            base, _, q = name.partition("-layers-q")
            if q:
                label = f"{desc.get(base + '-layers', name)}, {q} query heads per layer"
            else:
                written = (cuts.get(name, {}).get("decilm") or {}).get("query_heads")
                label = desc.get(name, name) + (f", {written} query heads per layer" if written else "")
            lines.append(
                f"| {label} | {row['heads']} ({row['kv_heads']}) "
                f"| {gen.get('kv_bytes_per_token', 0):,.0f} | {row['tokens_per_s']:,.0f} "
                f"| {speed(row['speedup'], row['speedup_p25'], row['speedup_p75'], row['within_noise'])} "
                f"| {_x(row['flop_ratio'])} | {gen.get('tokens_per_s', 0):,.1f} "
                f"| {speed(gen.get('speedup'), gen.get('speedup_p25'), gen.get('speedup_p75'), gen.get('within_noise'))} "
                f"| {_x(gen.get('ideal_speedup'))} |"
            )
        lines.append("")
    padded = {n: c.get("decilm") for n, c in cuts.items() if c.get("decilm")}
    if padded:
        lines.append("The DeciLM forms' padding when measured (the prune reports' `formats.decilm`; the other plan of")
        lines.append("each is its `alternatives` entry):")
        lines.append("")
        for name, facts in padded.items():
            lines.append(f"- {desc.get(name, name)}: {json.dumps(facts.get('padding', facts), sort_keys=True)}")
        lines.append("")
    return "\n".join(lines)
