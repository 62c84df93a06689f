"""The page section "KV-cache budgets: heads placed by cost", from ``results/kv_budget.json``
(``benchmarks/studies/kv_budget.py``)."""

from __future__ import annotations

from typing import Any

NAMES = {
    "gemma3": "Gemma 3 270M",
    "smollm": "SmolLM2-135M-Instruct",
    "gemma1b": "synthetic Gemma 3 1B shape (random weights, bfloat16)",
}


def _num(value: float) -> str:
    """A perplexity: two decimals, or three significant digits past 100,000 (a broken model)."""
    return f"{value:.3g}" if abs(value) >= 1e5 else f"{value:.2f}"


def _ppl(row: dict[str, Any], window: str) -> float | None:
    return (row.get("perplexity") or {}).get(window)


def increase_reduction(cost: float, count: float, unpruned: float) -> float | None:
    """How much less the cost-aware cut raised perplexity than the count-based one: 1 - (cost - u) / (count - u)."""
    if count - unpruned <= 0:
        return None
    return 1.0 - (cost - unpruned) / (count - unpruned)


def _removed(row: dict[str, Any]) -> str:
    """The KV heads the cut removed, per layer kind (e.g. ``2 global, 7 sliding``)."""
    kinds: dict[str, int] = {}
    for block in row["kv_budget"]["blocks"]:
        gone = block["kv_heads"][0] - block["kv_heads"][1]
        if gone:
            kind = "global" if block["window"] is None else "sliding"
            kinds[kind] = kinds.get(kind, 0) + gone
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"


def render_markdown(data: dict[str, Any], unpruned: dict[str, dict[str, float]]) -> str:
    """The section: one table of quality per model and context, the per-layer costs and removals, decode speed."""
    rows = data.get("rows", {})
    lines = ["## KV-cache budgets: heads placed by cost", ""]
    lines.append(
        "`headcut prune MODEL --kv-budget 0.5 --context N` keeps at most half the bytes of the KV cache of one sequence "
        "of N tokens, each layer counted as its kind holds it (a sliding layer at most its window). Both allocations "
        "rank the units by the same scores (the default decoder recipe: one-shot gradient, whole KV groups, 64 blocks "
        "of 256 tokens of the convention speeches, seed 0): `--allocation count` removes them in score order until "
        "the bytes fit (every head counted alike), `--allocation cost` (the default) places them by score per byte "
        "saved and keeps the candidate of least calibration loss (docs/commands.md). Perplexity: the first 16,384 "
        "tokens of hamlet.txt in windows of 128 and 2,048 tokens (the decoder-recipe study's function and tokens; "
        "unpruned from its rows). Measured by `python -m benchmarks.studies.kv_budget cuts` on 2 CPU cores."
    )
    lines.append("")
    lines.append(
        "| model | context | allocation | KV bytes kept | heads kept | KV heads removed | ppl@128 | ppl@2048 | "
        "increase@128 | increase@2048 | prune |"
    )
    lines.append("|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|")
    summaries = []
    for model in ("gemma3", "smollm"):
        base = unpruned.get(model) or {}
        for context in sorted({r["context"] for r in rows.values() if r["model"] == model}):
            pair = {a: rows.get(f"{model}/{context}/{a}") for a in ("count", "cost")}
            for allocation, row in pair.items():
                if row is None:
                    continue
                kv = row["kv_budget"]
                cells = []
                for w in ("128", "2048"):
                    p, u = _ppl(row, w), base.get(w)
                    cells.append("-" if p is None else _num(p))
                incs = []
                for w in ("128", "2048"):
                    p, u = _ppl(row, w), base.get(w)
                    incs.append("-" if p is None or u is None else f"+{_num(p - u)}")
                lines.append(
                    f"| {NAMES.get(model, model)} | {context:,} | {allocation} | {kv['reached']:.3f} "
                    f"({kv['bytes_after'] / 2**20:.1f} of {kv['bytes_before'] / 2**20:.1f} MiB) | "
                    f"{kv['heads_after']} of {kv['heads_before']} | {_removed(row)} | {cells[0]} | {cells[1]} | "
                    f"{incs[0]} | {incs[1]} | {row['prune_seconds'] / 60:.1f} min |"
                )
            if pair["count"] and pair["cost"]:
                parts = []
                for w in ("128", "2048"):
                    c, n, u = _ppl(pair["cost"], w), _ppl(pair["count"], w), base.get(w)
                    red = None if None in (c, n, u) else increase_reduction(c, n, u)  # type: ignore[arg-type]
                    parts.append(f"{'-' if red is None else f'{100 * red:.1f} %'} ({int(w):,}-token windows)")
                summaries.append(
                    f"- {NAMES.get(model, model)} at {context:,} tokens: the cost-aware cut raised perplexity "
                    f"{' and '.join(parts)} less than the count-based cut."
                )
    lines += [
        "",
        "Unpruned perplexity: "
        + "; ".join(
            f"{NAMES.get(m, m)} {u.get('128', float('nan')):.2f} (128), {u.get('2048', float('nan')):.2f} (2,048)"
            for m, u in unpruned.items()
            if u
        )
        + ".",
        "",
    ]
    lines += summaries
    lines += ["", *_layers(rows), *_speed(data)]
    return "\n".join(lines) + "\n"


def _layers(rows: dict[str, Any]) -> list[str]:
    """Per layer of Gemma 3: its kind, the bytes one KV head holds at each context, and which cut removed it."""
    out: list[str] = []
    for model in ("gemma3",):
        contexts = sorted({r["context"] for r in rows.values() if r["model"] == model})
        if not contexts:
            continue
        out += [
            f"{NAMES[model]}, per layer: the bytes its KV head holds at each context (float32 keys and values) and "
            "the cuts that removed it (C: cost-aware, N: count-based).",
            "",
            "| layer | kind | "
            + " | ".join(f"bytes at {c:,}" for c in contexts)
            + " | "
            + " | ".join(f"removed at {c:,}" for c in contexts)
            + " |",
            "|---:|---|" + "---:|" * len(contexts) + "---|" * len(contexts),
        ]
        first = rows.get(f"{model}/{contexts[0]}/cost") or rows.get(f"{model}/{contexts[0]}/count")
        assert first is not None
        for i, block in enumerate(first["kv_budget"]["blocks"]):
            sizes, marks = [], []
            for c in contexts:
                row = rows.get(f"{model}/{c}/cost") or rows.get(f"{model}/{c}/count")
                b = row["kv_budget"]["blocks"][i] if row else None
                sizes.append("-" if b is None else f"{b['bytes'][0] // max(b['kv_heads'][0], 1):,}")
                got = []
                for a, tag in (("cost", "C"), ("count", "N")):
                    r = rows.get(f"{model}/{c}/{a}")
                    if r and r["kv_budget"]["blocks"][i]["kv_heads"][1] < r["kv_budget"]["blocks"][i]["kv_heads"][0]:
                        got.append(tag)
                marks.append(" ".join(got))
            kind = "global" if block["window"] is None else f"sliding ({block['window'] + 1})"
            out.append(f"| {block['layer']} | {kind} | " + " | ".join(sizes) + " | " + " | ".join(marks) + " |")
        out.append("")
    return out


def _speed(data: dict[str, Any]) -> list[str]:
    speed = data.get("speed") or {}
    if not speed:
        return []
    out = [
        "Decode speed at that context (the study's `speed`: each model decodes 16 tokens greedily from a cache of that "
        "many random keys and values, timed as `--target-speedup` times it, in 5 interleaved rounds on 2 threads; "
        "tokens/s the median; speed-up the median of the paired per-round ratios over the unpruned model, with their "
        "p25-p75). The synthetic model is cut by the data-free magnitude scores (its outputs mean nothing):",
        "",
        "| model | context | cut | heads kept | KV bytes kept | tokens/s | speed-up | p25-p75 |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    cuts = data.get("rows", {})
    order = list(NAMES)

    def place(name: str) -> tuple[int, int]:
        model, context = name.split("/")
        return (order.index(model) if model in order else len(order), int(context))

    for name, block in sorted(speed.items(), key=lambda item: place(item[0])):
        model, context = name.split("/")
        rows = block["rows"]
        base = rows[0]
        for row in rows:
            rates = row["tokens_per_s_rounds"]
            pairs = sorted(r / b for r, b in zip(rates, base["tokens_per_s_rounds"]))
            median = sorted(rates)[len(rates) // 2]
            q = (pairs[len(pairs) // 4], pairs[(3 * len(pairs)) // 4]) if pairs else (None, None)
            spread = "-" if row is base else f"{q[0]:.2f}-{q[1]:.2f}"
            speedup = "1.00" if row is base else f"{sorted(pairs)[len(pairs) // 2]:.2f}x"
            cut = cuts.get(f"{model}/{context}/{row['name']}")
            kv = cut["kv_budget"] if cut else None
            heads = "all" if kv is None else f"{kv['heads_after']} of {kv['heads_before']}"
            kept = "1" if kv is None else f"{kv['reached']:.3f}"
            out.append(
                f"| {NAMES.get(model, model)} | {int(context):,} | {row['name']} | {heads} | {kept} | {median:.2f} | "
                f"{speedup} | {spread} |"
            )
    out.append("")
    return out
