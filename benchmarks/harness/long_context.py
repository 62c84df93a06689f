"""The long-context section of the page: the tables of ``benchmarks/results/long_context.json``, measured by the
``long_context`` study (``python -m benchmarks.studies.long_context``, which prints them with ``--render``)."""

from __future__ import annotations

import statistics
from typing import Any

#: tokens generated after each prompt
GEN_TOKENS = 128

IDEAL_TEXT = (
    "Ideal speed-up: decode is memory-bound, so the work of one generated token is the bytes it reads: the weights "
    "of everything it passes through (every linear layer's weight and bias, the LM head in full even when tied to "
    "the embeddings, the norms; the embedding lookup reads one row) plus the KV-cache bytes attention reads at that "
    "step (kept KV heads x head_dim x 2 (K and V) x positions attended, capped at the 512-position window in "
    "sliding layers; an emptied layer reads nothing). A run's work is the sum over its 128 steps; ideal = "
    "work(unpruned) / work(pruned), in the runtime's bytes per value (PyTorch: the checkpoint's dtype; llama.cpp: "
    "2 for the f16 matrices and KV cache, 4 for the norms)."
)


#: measured while preparing this benchmark (2026-11-26, same machine, same decode functions), when other jobs
#: kept the 1-minute load at 4-5 on the 2 cores: why the runs use 1 thread
THREAD_NOTE = (
    "Threads under load (measured before the run, 1-minute load 4-5 from other jobs): Gemma 3 270M decoding 8 tokens "
    "after 600 prompt tokens in PyTorch: 4.4 tokens/s with 1 thread, 0.58 with 2 (torch.profiler: the 2-thread run "
    "spent 56 ms per sdpa call and 7 ms per cache torch.cat, microseconds with 1 thread: each parallel op waits for a "
    "core); llama.cpp SmolLM2 f16, 32 tokens after 512: 28-83 tokens/s with 1 thread, 0.3-0.5 with 2. With the "
    "machine quieter (load below 3) 2 threads were 10-25 % faster (the probe in this file)."
)


def _fmt_ctx(ctx: int) -> str:
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)


def render_markdown(data: dict[str, Any]) -> str:
    """The page section "Long context: decode speed and KV cache": one table per runtime."""
    lines = ["## Long context: decode speed and KV cache", ""]
    m = data.get("machine", {})
    s = data.get("settings", {})
    lines.append(
        f"Decoding {s.get('gen_tokens', GEN_TOKENS)} tokens greedily after a prompt of "
        f"{', '.join(_fmt_ctx(c) for c in s.get('contexts', []))} tokens, batch 1, on {m.get('cpu')} "
        f"({m.get('cores')} cores; PyTorch {s.get('threads')} thread(s), llama.cpp {s.get('llamacpp_threads')} thread(s); "
        "no GPU was "
        f"used), {m.get('date')}; torch {m.get('torch')}, "
        f"transformers {m.get('transformers')}, llama-cpp-python {m.get('llama_cpp_python')}. Whole KV groups "
        "removed (a KV head with its query heads): 1/3 and 1/2 of them. Tokens/s: median over "
        f"{s.get('rounds')} interleaved rounds (every model of a base decodes once per round, the order rotated), "
        "with the p25-p75 of the rounds; speed-up: median tokens/s over the unpruned model's, and in brackets the "
        "median of the paired per-round ratios; 'noise' marks a speed-up whose paired ratios' p25-p75 contains 1. "
        f"KV cache: the bytes of the cache after the {s.get('gen_tokens', GEN_TOKENS)} tokens (PyTorch: measured, and asserted equal to kept KV "
        "heads x head_dim x 2 x positions x bytes per value; llama.cpp: what it allocates for n_ctx = prompt + 256, "
        "f16, computed per layer and asserted equal to its log line; without flash attention llama.cpp pads every "
        "layer's V cache to the widest layer's when the layers differ, so a non-uniform cut shrinks only K there)."
    )
    lines.append("")
    for runtime, title in (
        ("torch", "PyTorch (transformers, eager decode loop)"),
        ("llamacpp", "llama.cpp (f16 GGUF, flash attention off: llama-cpp-python's default)"),
        ("llamacpp-fa", "llama.cpp (f16 GGUF, flash attention on)"),
    ):
        rt = data.get("runtimes", {}).get(runtime)
        if not rt:
            continue
        lines += [
            f"### {title}",
            "",
            "| model | cut | KV heads kept | context | KV cache MiB | tokens/s (p25-p75) | speed-up (paired) "
            "| ideal | speed-up / ideal | noise |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for base, entry in rt.items():
            for ctx, c in entry["contexts"].items():
                for row in c["rows"]:
                    first = row["cut"] == "unpruned"
                    lines.append(
                        f"| {base} | {row['cut']} | {row['kv_heads_kept']}/{row['kv_heads_total']} | {_fmt_ctx(int(ctx))} "
                        f"| {row['kv_cache_bytes'] / 2**20:.2f} | {row['tokens_per_s']:.2f} "
                        f"({row['tokens_per_s_p25']:.2f}-{row['tokens_per_s_p75']:.2f}) "
                        f"| {row['speedup']:.2f} ({row['paired_ratio_median']:.2f}) | {row['ideal']:.3f} "
                        f"| {row['speedup_over_ideal']:.2f} | {'' if first else ('noise' if row['within_noise'] else '')} |"
                    )
        lines.append("")
        for base, entry in rt.items():
            lines.append(
                f"- {base}: {data.get('models', {}).get(base, {}).get('label', base)}; "
                + (
                    f"{entry.get('dtype')}, attention {entry.get('attn_implementation')}, {entry.get('prefill')}."
                    if runtime == "torch"
                    else f"KV cache {entry.get('kv_type')}, {entry.get('threads')} thread(s), flash attention "
                    f"{'on' if entry.get('flash_attn') else 'off'}."
                )
            )
        lines.append("")
    lines.append(IDEAL_TEXT)
    lines.append("")
    cuts = []
    for base, info in data.get("models", {}).items():
        for c in info.get("cuts", []):
            if c["name"] != "unpruned":
                extra = (
                    f"; attention emptied in layers {', '.join(map(str, c['emptied_layers']))}"
                    if c["emptied_layers"]
                    else ""
                )
                cuts.append(
                    f"{base} {c['name']}: {c['groups_removed']} of {c['groups_total']} KV groups removed "
                    f"({c['how']}){extra}"
                )
    if cuts:
        lines.append("Cuts: " + "; ".join(cuts) + ".")
        lines.append("")
    notes = data.get("notes", []) + data.get("quality", [])
    if data.get("settings", {}).get("skipped"):
        notes.append("Left out for time: " + ", ".join(data["settings"]["skipped"]) + ".")
    probe = data.get("thread_probe")
    if probe:
        parts = []
        for rt in ("torch", "llamacpp"):
            for th in (1, 2):
                v = [r["tokens_per_s"] for r in probe.get(rt, []) if r["threads"] == th]
                if v:
                    parts.append(f"{rt} {th} thread(s) {statistics.median(v):.1f} tokens/s")
        loads = [r["load_before"][0] for rt in ("torch", "llamacpp") for r in probe.get(rt, [])]
        notes.append(
            f"Threads: {probe.get('what')}: "
            + ", ".join(parts)
            + (f" (1-minute load {min(loads):.1f}-{max(loads):.1f})." if loads else ".")
            + " 1 thread was chosen because 2 threads collapse when other jobs load the 2 cores "
            "(see the notes of the results file)."
        )
    if notes:
        lines += [f"- {n}" for n in notes]
        lines.append("")
    loads = [
        x
        for rt in data.get("runtimes", {}).values()
        for e in rt.values()
        for c in e["contexts"].values()
        for x in c["load"]
    ]
    if loads:
        ones = [v for x in loads for v in (x["before"][0], x["after"][0])]
        lines.append(
            f"Machine load (1-minute load average, before/after each round, {len(loads)} rounds): "
            f"{min(ones):.2f} to {max(ones):.2f} on {m.get('cores')} cores; other agents ran jobs on this "
            "machine during the run, so the times carry their noise (hence the interleaved rounds and the "
            f"paired ratios). Random: {data.get('random', '')} No GPU was used. The run took "
            f"{data.get('minutes', 0):.0f} min."
        )
    return "\n".join(lines) + "\n"
