"""The tables the commands show (rich renderables built from the API's results and reports)."""

from __future__ import annotations

import json
import math
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..formatting import metric_text as _fmt
from ..outputs.reports import STOPPED


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f} MiB"


# ---- info ---------------------------------------------------------------------------------------------


def info_table(model: str, result: Any) -> list[Any]:
    table = Table(box=box.SIMPLE_HEAD)
    for col in ("block", "kind", "layer", "heads", "kv heads", "head dim"):
        table.add_column(col, justify="left" if col in ("block", "kind") else "right")
    for b in result.blocks:
        kind = b.kind if b.mixer == "attention" else f"{b.kind} ({b.mixer})"
        table.add_row(b.name, kind, str(b.layer), str(b.heads), str(b.kv_heads), str(b.head_dim))
    total = f"{result.total_heads} heads in {len(result.blocks)} blocks, {result.params:,} parameters" + (
        " (slimmed by headcut)" if result.cut else ""
    )
    return [f"{model}: {result.architecture} ({result.family})", table, total, *(f"note: {n}" for n in result.notes)]


# ---- eval ---------------------------------------------------------------------------------------------


def _metric(name: str, value: float) -> str:
    if name == "tokens":
        return f"{value:,.0f}"
    if name in ("accuracy", "macro_f1", "mcc"):
        return f"{value:.4f}"
    return f"{value:,.4f}"


def metrics_table(title: str, result: Any) -> Table:
    """The metrics of one evaluation, primary metric first."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("metric")
    table.add_column("value", justify="right")
    arrow = "higher is better" if result.higher_is_better else "lower is better"
    table.add_row(f"{result.primary} ({arrow})", _metric(result.primary, result.value))
    for name, value in result.metrics.items():
        if name != result.primary:
            table.add_row(name, _metric(name, value))
    table.add_row("examples", f"{result.examples:,}")
    table.add_row("examples/s", f"{result.examples_per_s:,.1f}")
    table.add_row("seconds", f"{result.seconds:,.2f}")
    return table


def windows_table(title: str, results: dict[int, Any]) -> Table:
    """Perplexity per window length (``headcut eval --windows``), one row per window length."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for col in ("window", "perplexity (lower is better)", "loss", "windows", "tokens scored", "seconds"):
        table.add_column(col, justify="right")
    for window, result in results.items():
        table.add_row(
            f"{window:,} tokens",
            _metric("perplexity", result.metrics["perplexity"]),
            _metric("loss", result.metrics["loss"]),
            f"{result.examples:,}",
            _metric("tokens", result.metrics["tokens"]),
            f"{result.seconds:,.2f}",
        )
    return table


def harness_table(harness: Any) -> Table:
    """lm-evaluation-harness results: a row per task and metric, with the standard error and the examples."""
    table = Table(box=box.SIMPLE_HEAD)
    for col in ("task", "metric", "value", "stderr", "examples", "shots"):
        table.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for name, entry in harness.tasks.items():
        shown = f"{name} (group)" if entry["group"] else name
        for metric, numbers in entry["metrics"].items():
            value, stderr = numbers["value"], numbers["stderr"]
            table.add_row(
                shown,
                metric,
                "-" if value is None else f"{value:.4f}",
                "-" if stderr is None else f"± {stderr:.4f}",
                "-" if entry["samples"] is None else f"{entry['samples']:,}",
                "-" if entry["num_fewshot"] is None else str(entry["num_fewshot"]),
            )
            shown = ""
    return table


# ---- score --------------------------------------------------------------------------------------------


def _importance_colour(value: float, low: float, high: float) -> str:
    share = 0.0 if high <= low else (value - low) / (high - low)
    level = int(40 + 180 * share)
    return f"on rgb({level // 3},{level // 2},{level})"


def heatmap_tables(blocks: list[Any], scores: Any) -> list[Table]:
    """One table per attention kind: a row per layer, a cell per head, shaded by importance."""
    importance = scores.importance()
    tables = []
    for kind in dict.fromkeys(b.kind for b in blocks):
        of_kind = [b for b in blocks if b.kind == kind]
        values = [v for b in of_kind for v in importance[b.name]]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        width = max((b.heads for b in of_kind), default=0)
        # one power of ten per table keeps the cells short: a cell shows score / 10**exp
        biggest = max((abs(v) for b in of_kind for v in scores.blocks[b.name]), default=0.0)
        exp = math.floor(math.log10(biggest)) if biggest > 0 and math.isfinite(biggest) else 0
        unit = f" (x 1e{exp})" if exp else ""
        table = Table(title=f"{scores.scorer} scores{unit}: {kind} attention", box=box.SIMPLE_HEAD, padding=(0, 1))
        table.add_column("layer", justify="right", no_wrap=True)
        for h in range(width):
            table.add_column(str(h), justify="right", no_wrap=True)
        for b in of_kind:
            cells: list[Any] = []
            for h, raw in enumerate(scores.blocks[b.name]):
                shade = _importance_colour(importance[b.name][h], low, high)
                cells.append(Text(f"{raw / 10**exp:.2f}", style=shade))
            cells += ["-"] * (width - b.heads)
            table.add_row(str(b.layer), *cells)
        tables.append(table)
    return tables


def write_plot(path: str, blocks: list[Any], scores: Any) -> None:
    """A PNG heatmap per attention kind (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(dict.fromkeys(b.kind for b in blocks))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        of_kind = [b for b in blocks if b.kind == kind]
        width = max((b.heads for b in of_kind), default=0)
        grid = np.full((len(of_kind), max(width, 1)), np.nan)
        for i, b in enumerate(of_kind):
            grid[i, : b.heads] = scores.blocks[b.name]
        image = ax.imshow(grid, aspect="auto", cmap="viridis" if scores.higher_is_important else "viridis_r")
        ax.set_xticks(range(width))
        ax.set_yticks(range(len(of_kind)), [str(b.layer) for b in of_kind])
        ax.set_title(f"{scores.scorer}: {kind}")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


# ---- prune --------------------------------------------------------------------------------------------


def speed_lines(speed: dict[str, Any]) -> list[Any]:
    """``--target-speedup``'s lines: the budgets timed and the one chosen."""
    table = Table(
        title=f"decoding {speed['tokens']} tokens at {speed['context']:,} on {speed['device']}: paired speed-ups, "
        f"{speed['rounds']} rounds",
        box=box.SIMPLE_HEAD,
    )
    for col in ("--kv-budget", "heads", "KV bytes", "median", "p25", "p75", f"p25 >= {speed['target']:g}x"):
        table.add_column(col, justify="right")
    for t in sorted(speed["tried"], key=lambda t: -t["fraction"]):
        table.add_row(
            f"{t['fraction']:g}",
            f"{t['heads']:,}",
            f"{t['kv_bytes']:,}",
            f"{t['speedup_median']:.3g}x",
            f"{t['speedup_p25']:.3g}x",
            f"{t['speedup_p75']:.3g}x",
            "yes" if t["reached"] else "no",
        )
    reached = speed["reached"]
    line = (
        f"target speed-up {speed['target']:g}x: --kv-budget {speed['chosen_fraction']:g}, the least cut timed at least "
        f"that fast ({reached['speedup_median']:.3g}x median, {reached['speedup_p25']:.3g}x 25th percentile)"
    )
    return [table, line]


def kv_lines(kv: dict[str, Any]) -> list[Any]:
    """A byte budget's lines: asked for and reached, the allocation's candidates, and the cache per layer."""
    asked = f"{kv['fraction']:.4g} asked ({kv['bytes_target']:,} B at most)"
    line = (
        f"KV cache of one sequence of {kv['context']:,} tokens: {kv['bytes_before']:,} -> {kv['bytes_after']:,} bytes, "
        f"{kv['reached']:.4g} kept ({asked}), heads {kv['heads_before']:,} -> {kv['heads_after']:,}"
    )
    out: list[Any] = [line]
    if kv.get("uniform_level") is not None:
        out.append(f"allocation: the same {kv['uniform_level']} heads in every block (--uniform)")
    elif kv["candidates"]:
        parts = [
            f"{c['name']} {c['bytes']:,} B" + ("" if c["loss"] is None else f" loss {c['loss']:.6g}")
            for c in kv["candidates"]
        ]
        how = (
            "every candidate made the same cut"
            if kv.get("candidates_agree")
            else "by calibration loss"
            if any(c["loss"] is not None for c in kv["candidates"])
            else "no data to measure a loss on"
        )
        out.append(f"allocation {kv['allocation']}: {kv['chosen']} chosen ({how}) of {'; '.join(parts)}")
    table = Table(title="KV cache per layer", box=box.SIMPLE_HEAD)
    for col in ("block", "kind", "window", "KV heads", "bytes before", "bytes after"):
        table.add_column(col, justify="left" if col in ("block", "kind") else "right")
    for row in kv["blocks"]:
        table.add_row(
            row["block"],
            row["kind"],
            "-" if row["window"] is None else f"{row['window']:,}",
            f"{row['kv_heads'][0]} -> {row['kv_heads'][1]}",
            f"{row['bytes'][0]:,}",
            f"{row['bytes'][1]:,}",
        )
    out.append(table)
    return out


def prune_summary(report: dict[str, Any], result: Any, report_name: str) -> list[Any]:
    """What ``headcut prune`` shows: the stop reason, heads per block, before/after, the trajectory and the
    training curve."""
    out: list[Any] = []
    heads, params, size, metric = report["heads"], report["params"], report["size_bytes"], report["metric"]
    recipe = (report.get("recipe") or {}).get("name")
    who = report["method"] if recipe in (None, report["method"]) else f"recipe {recipe} ({report['method']})"
    out.append(
        f"{report['model']}: {who} kept {heads['after']} of {heads['before']} heads "
        f"({STOPPED.get(report['stopped'], report['stopped'])})"
    )
    blocks = Table(title="heads per block", box=box.SIMPLE_HEAD)
    for col in ("block", "before", "after", "kept heads"):
        blocks.add_column(col, justify="left" if col in ("block", "kept heads") else "right")
    for name, n in heads["per_block_before"].items():
        kept = report["mask"]["keep"][name]
        shown = ",".join(map(str, kept)) if len(kept) < n else "all"
        blocks.add_row(name, str(n), str(heads["per_block_after"][name]), shown or "none")
    out.append(blocks)
    summary = Table(title="summary", box=box.SIMPLE_HEAD)
    for col in ("", "before", "after"):
        summary.add_column(col, justify="left" if not col else "right")
    summary.add_row("heads", f"{heads['before']:,}", f"{heads['after']:,}")
    summary.add_row("parameters", f"{params['before']:,}", f"{params['after']:,}")
    summary.add_row("weights", _mib(size["before"]), _mib(size["after"]))
    if metric is not None:
        arrow = "higher is better" if metric["higher_is_better"] else "lower is better"
        summary.add_row(f"{metric['name']} ({arrow})", _fmt(metric["before"]), _fmt(metric["after"]))
    out.append(summary)
    speed = report.get("speed_target")
    if speed:
        out += speed_lines(speed)
    kv = report.get("kv_budget")
    if kv:
        out += kv_lines(kv)
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from ..pruning import get_method

    own = get_method(report["method"]).summary(report, result)  # a method's own lines (lottery, auber)
    if (
        metric is not None
        and (own is None or own.trajectory)
        and any(p.metric is not None and p.step > 0 for p in result.trajectory)
    ):
        curve = Table(title="trajectory", box=box.SIMPLE_HEAD)
        for col in ("step", "heads", metric["name"], "within"):
            curve.add_column(col, justify="right")
        for p in result.trajectory:
            mark = "" if p.within is None else ("yes" if p.within else "no")
            curve.add_row(str(p.step), str(p.heads), _fmt(p.metric), mark)
        out.append(curve)
    if params["unshared"]:
        out.append(f"unsharing weights added {params['unshared']:,} parameters before the cut")
    run = result.training
    if run is not None:
        evals = [e for e in run.history if isinstance(e.get("eval"), dict)]
        if evals and metric is not None:
            curve = Table(
                title=f"training ({run.mode}): {metric['name']} with the top-K mask of the moment", box=box.SIMPLE_HEAD
            )
            for col in ("step", "task loss", "open heads", metric["name"]):
                curve.add_column(col, justify="right")
            for e in evals:
                curve.add_row(
                    str(e["step"]),
                    f"{e.get('task_loss', e['loss']):.4f}",
                    f"{e.get('open', 0):g}",
                    _fmt(e["eval"].get(metric["name"])),
                )
            out.append(curve)
        first, last = run.history[0], run.history[-1]
        resumed = f", resumed at step {run.resumed_from}" if run.resumed_from is not None else ""
        loss = "task_loss" if "task_loss" in last else "loss"
        out.append(
            f"trained {run.steps} steps ({run.mode}{resumed}), task loss {first[loss]:.4f} -> "
            f"{last[loss]:.4f}, {run.seconds:.1f} s; kept the top {result.target} heads by {run.ranking}; "
            f"{report['seconds']:.1f} s in all; saved to {report['out']} (with {report_name})"
        )
    elif own is not None:
        out += own.items
        out.append(f"{own.lead}{report['seconds']:.1f} s in all; saved to {report['out']} (with {report_name})")
    else:
        out.append(
            f"{result.scorings} scoring pass{'es' if result.scorings != 1 else ''}, "
            f"{report['seconds']:.1f} s; saved to {report['out']} (with {report_name})"
        )
    layerwise = report.get("layerwise")
    if layerwise is not None:
        peak, size = layerwise["peak_rss_bytes"], layerwise["checkpoint_bytes"]
        out.append(
            f"layer-wise ({layerwise['reason']}): {layerwise['layers']} layers read one at a time (the largest "
            f"{_mib(layerwise['largest_layer_bytes'])}), activations in {layerwise['activations']}; peak memory "
            f"{_mib(peak)} for a checkpoint of {_mib(size)}; scoring {layerwise['score_seconds']:.1f} s, "
            f"writing {layerwise['write_seconds']:.1f} s into {layerwise['shards']} shard(s)"
        )
    for i, stage in enumerate(report.get("rounds") or [], 1):
        steps = [f"the cut {_fmt(stage['metric']['after_pruning'])}"]
        steps += [f"the refit {_fmt(stage['metric']['after_refit'])}"] if "after_refit" in stage["metric"] else []
        steps += [f"recovery {_fmt(stage['metric']['after'])}"] if "after" in stage["metric"] else []
        line = f"round {i}: cut to {stage['keep']} heads" + (
            f", {stage['recovery']['steps']} recovery steps" if stage.get("recovery") else ""
        )
        if metric is not None:
            line += f"; {metric['name']} after " + ", after ".join(steps)
        out.append(line + f"; round {i + 1}: the cut below")
    refit = report.get("refit")
    if refit is not None:
        fitted = refit["refitted"]
        before = sum(r["error_before"] for r in fitted) / max(len(fitted), 1)
        after = sum(r["error_after"] for r in fitted) / max(len(fitted), 1)
        whose = "first round's model's" if report.get("rounds") else "unpruned model's"
        line = (
            f"refit: {len(fitted)} output projection{'s' if len(fitted) != 1 else ''} fitted to the {whose} "
            f"on {refit['tokens']} tokens, mean relative error {before:.3f} -> {after:.3f}, "
            f"{refit['seconds']:.1f} s"
        )
        if metric is not None and metric.get("after_refit") is not None:
            line += f"; {metric['name']} after the cut {_fmt(metric['after_pruning'])}, after the refit {_fmt(metric['after_refit'])}"
        out.append(line)
    recovery = report.get("recovery")
    if recovery is not None:
        summary_ = recovery.get("history_summary") or {}
        first, last = summary_.get("first", {}), summary_.get("last", {})
        extra = recovery.get("recover_data")
        also = f" (alpha 1, with {extra['examples']} unlabelled rows of {extra['source']})" if extra else ""
        weight = (recovery.get("config") or {}).get("hidden_weight")
        also += f", hidden states matched (weight {weight:g})" if weight else ""
        average = (recovery.get("config") or {}).get("average_last")
        also += f", weights averaged over the last {average:g} of the steps (constant LR)" if average else ""
        line = (
            f"recovery: {recovery['steps']} steps distilled from the unpruned model{also}, loss "
            f"{_fmt(first.get('loss'))} -> {_fmt(last.get('loss'))}, {recovery['seconds']:.1f} s"
        )
        if metric is not None and metric.get("after_pruning") is not None:
            start, start_name = (
                (metric["after_refit"], "the refit")
                if metric.get("after_refit") is not None
                else (metric["after_pruning"], "the cut")
            )
            line += f"; {metric['name']} after {start_name} {_fmt(start)}, after recovery {_fmt(metric['after'])}"
        out.append(line)
    return out + checkpoint_lines(report) + formats_lines(report)


def checkpoint_lines(report: dict[str, Any]) -> list[str]:
    """How the written checkpoint loads (``report["checkpoint"]``): stock transformers, or headcut's form with
    the reason and, after a non-uniform prune, the ``--uniform`` budgets that would make it stock."""
    form = report.get("checkpoint")
    if not isinstance(form, dict):
        return []
    loader = str(form.get("loader")).replace('"OUT"', json.dumps(str(report.get("out") or "OUT")))
    if form.get("form") == "stock":
        line = (
            f"checkpoint: plain transformers {form.get('architecture')}, loads with {loader} "
            "(no trust_remote_code, no headcut)"
        )
        padding = form.get("padding")
        if isinstance(padding, dict) and padding.get("query_heads_added"):
            line += (
                f"; {padding['query_heads_added']} zero query heads added to hold one count per layer "
                f"({int(padding.get('params_added') or 0):,} parameters, KV cache unchanged)"
            )
        return [line] + serving_lines(report)
    line = (
        f"checkpoint: headcut's form, loads with {loader}; not a plain transformers checkpoint "
        f"because {form.get('why_not_stock')}"
    )
    near = report.get("uniform_budgets")
    if near:
        line += (
            "; --uniform would write a plain one: the nearest uniform budgets are "
            + " or ".join(f"--keep {k}" for k in near)
            + " (their quality was not measured)"
        )
    return [line] + serving_lines(report)


def serving_lines(report: dict[str, Any]) -> list[str]:
    """The serving engines that load the output (``report["engines"]``) beyond transformers, or, for a causal LM
    none loads, what would make it servable (``report["not_served"]``)."""
    served = [e for e in report.get("engines") or [] if e.get("engine") not in ("transformers",)]
    out = str(report.get("out") or "OUT")
    lines = []
    if served:
        lines.append("serves in: " + "; ".join(f"{e['engine']}: {str(e['how']).replace('OUT', out)}" for e in served))
    if report.get("not_served"):
        lines.append(str(report["not_served"]))
    return lines


# ---- finetune -----------------------------------------------------------------------------------------


def formats_lines(report: dict[str, Any]) -> list[str]:
    """One line per ONNX / GGUF file an output holds (``report["formats"]``), with its check."""
    out = []
    formats = report.get("formats") or {}
    onnx = formats.get("onnx")
    if onnx:
        parity = onnx.get("parity")
        check = (
            f"max abs difference from PyTorch {parity:.1e} in {onnx.get('checked_with')}"
            if isinstance(parity, (int, float))
            else "not checked: onnxruntime is not installed"
        )
        out.append(f"wrote {onnx['file']} (opset {onnx.get('opset')}; {check})")
    gguf = formats.get("gguf")
    if gguf:
        out.append(
            f"wrote {gguf['file']} ({gguf.get('outtype')}, llama.cpp architecture {gguf.get('arch')}, "
            f"{gguf.get('bytes', 0) / 2**20:.1f} MiB)"
        )
    decilm = formats.get("decilm")
    if decilm:
        pad = decilm.get("padding") or {}
        kv = decilm.get("kv_bytes_per_token") or {}
        out.append(
            f"wrote {decilm['folder']}/ (DeciLM for vLLM: {decilm['query_heads']} query heads per layer, "
            f"{pad.get('kv_heads_written')} KV heads written, {pad.get('query_heads_added')} zero query heads and "
            f"{pad.get('kv_heads_added')} zero KV heads added, {int(pad.get('params_added') or 0):,} parameters; "
            f"KV cache {kv.get('written')} bytes per token, the cut's {kv.get('cut')}, unpruned {kv.get('unpruned')})"
        )
    if formats and "safetensors" not in formats:
        out.append("no safetensors weights written (--format leaves them out)")
    return out


def finetune_summary(report: dict[str, Any], result: Any, report_name: str) -> list[str]:
    summary = result.summary()
    first, last = summary.get("first", {}), summary.get("last", {})
    resumed = f" (resumed at step {result.resumed_from})" if result.resumed_from is not None else ""
    lines = [
        f"{report['model']}: {result.steps} steps{resumed}, loss {_fmt(first.get('loss'))} -> "
        f"{_fmt(last.get('loss'))}"
        + (f", KL {_fmt(first.get('kl'))} -> {_fmt(last.get('kl'))}" if "kl" in last else "")
    ]
    if result.metric is not None:
        arrow = "higher is better" if result.higher_is_better else "lower is better"
        lines.append(f"{result.metric} ({arrow}): {_fmt(result.metric_before)} -> {_fmt(result.metric_after)}")
    early = getattr(result, "early_stopping", None)
    if early is not None:
        where = f"stopped at step {early['stopped_at']}" if early["stopped_at"] is not None else "ran to the end"
        lines.append(
            f"early stopping ({early['patience']} evaluations): {where}; kept step {early['best_step']} "
            f"({early['metric']} {_fmt(early['best'])})"
        )
    lines += checkpoint_lines(report) + formats_lines(report)
    lines.append(f"saved to {report['out']} (with {report_name})")
    return lines


# ---- bench --------------------------------------------------------------------------------------------


def _mib1(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


def _count(n: int) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _speedup(speedup: float | None, low: float | None, high: float | None, within: bool | None) -> Text | str:
    """A speed-up over the interval of its per-round ratios, one per line to keep the table narrow: ``1.16x``
    / ``(1.10-1.21)``, and a third line ``within noise`` when the interval holds 1 (dim on a terminal; the
    words say it in plain text)."""
    if speedup is None:
        return "-"
    text = f"{speedup:.2f}x"
    if low is None or high is None:
        return text
    text += f"\n({low:.2f}-{high:.2f})"
    if within:
        return Text(text + "\nwithin noise", style="dim")
    return text


def bench_table(results: list[Any], config: Any, device_name: str) -> Table:
    """One row per model with the numbers of ``headcut bench`` (see its help). The relative columns
    (FLOP ratio, speed-up) appear only against a baseline: with two models or more; interleaved, each
    speed-up after the first carries the interval of its per-round ratios and says when it is within noise."""
    first = results[0] if results else None
    relative = len(results) > 1
    kind = first.peak_memory_kind if first is not None else ""
    notes = [
        {
            "cuda_max_memory_allocated": "peak MiB: max CUDA memory allocated during the forwards (weights included)",
            "cpu_peak_rss_increase": "peak MiB: resident memory the forwards add on top of the loaded model",
        }.get(kind, "peak MiB: not measurable here")
    ]
    if relative and getattr(config, "interleave", True):
        notes.append(
            "timed interleaved (rounds of one run of each model, the order rotated); speed-up (p25-p75 "
            "of the per-round speed-ups); within noise: that interval contains 1"
        )
    elif relative:
        notes.append(
            "timed back to back (--no-interleave): one model after the other, so the speed-ups are not "
            "comparable under a changing load"
        )
    threads = first.threads if first is not None else 0
    dtypes = sorted({r.dtype for r in results})
    dtype = dtypes[0] if len(dtypes) == 1 else "dtypes " + "/".join(dtypes)
    table = Table(
        title=f"{config.device} ({device_name}, {threads} thread{'s' if threads != 1 else ''}), "
        f"{dtype}, batch {config.batch_size} x {config.seq_len}",
        caption="\n".join(notes),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        padding=0,
    )
    columns = [
        "model",
        "runtime",
        "heads",
        "params",
        "GFLOPs",
        "FLOP\nratio",
        "median\nms",
        "p25-p75\nms",
        "p90\nms",
        "examples\n/s",
        "speed-\nup",
        "peak\nMiB",
        "gen\ntok/s",
        "gen\nspeed-up",
        "gen\nideal",
        "KV B/\ntoken",
    ]
    if not relative:
        columns = [c for c in columns if c not in ("FLOP\nratio", "speed-\nup")]
    if not any(r.generation is not None for r in results):  # no model generates: no generation columns
        columns = [c for c in columns if c not in ("gen\ntok/s", "gen\nspeed-up", "gen\nideal", "KV B/\ntoken")]
    elif not relative or not any(r.generation is not None and r.generation.speedup is not None for r in results):
        columns.remove("gen\nspeed-up")
    if "gen\nideal" in columns and not any(r.generation is not None and r.generation.ideal_speedup for r in results):
        columns.remove("gen\nideal")
    if all(getattr(r, "runtime", "torch") == "torch" for r in results):
        columns.remove("runtime")  # the column appears once another runtime is asked for
    for col in columns:
        if col == "model":
            table.add_column(col, overflow="fold", min_width=8)
        else:
            table.add_column(col, justify="right", no_wrap=True)
    for r in results:
        gen = r.generation
        cells: dict[str, Text | str] = {
            "model": r.name,
            "runtime": getattr(r, "runtime", "torch"),
            "heads": "-" if r.heads is None else str(r.heads),
            "params": _count(r.params),
            "GFLOPs": f"{r.flops / 1e9:,.3f}",
            "FLOP\nratio": _num(r.flop_ratio, ".3f"),
            "median\nms": f"{r.median_ms:,.2f}",
            "p25-p75\nms": f"{r.p25_ms:,.2f}-{r.p75_ms:,.2f}",
            "p90\nms": f"{r.p90_ms:,.2f}",
            "examples\n/s": f"{r.examples_per_s:,.1f}",
            "speed-\nup": _speedup(r.speedup, r.speedup_p25, r.speedup_p75, r.within_noise),
            "peak\nMiB": _mib1(r.peak_memory_bytes),
            "gen\ntok/s": "-" if gen is None else f"{gen.tokens_per_s:,.1f}",
            "gen\nspeed-up": "-"
            if gen is None
            else _speedup(gen.speedup, gen.speedup_p25, gen.speedup_p75, gen.within_noise),
            "gen\nideal": "-" if gen is None or gen.ideal_speedup is None else f"{gen.ideal_speedup:.2f}x",
            "KV B/\ntoken": "-" if gen is None else f"{gen.kv_bytes_per_token:,.0f}",
        }
        table.add_row(*(cells[c] for c in columns))
    return table
