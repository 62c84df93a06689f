"""``headcut prune``'s summary: heads per block, before and after, the trajectory, training, rounds, refit and
recovery, ``--target-speedup``'s and a byte budget's lines."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from ...formatting import metric_text as _fmt
from ...outputs.reports import STOPPED
from .checkpoint import checkpoint_lines, formats_lines


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f} MiB"


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
    from ...pruning import get_method

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
    protected = report.get("protect")
    if protected is not None:
        out.append(protect_line(protected))
    merge = report.get("merge")
    if merge is not None:
        out += merge_lines(merge, metric)
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


def merge_lines(merge: dict[str, Any], metric: dict[str, Any] | None) -> list[Any]:
    """The ``merge`` stage: the blocks merged, the KV heads and bytes before and after, each candidate's cost."""
    merged = [row for row in merge["layers"] if row["merged"]]
    to = merged[0]["to"] if merged else None
    line = (
        f"merge: the KV heads of {len(merged)} block{'s' if len(merged) != 1 else ''} merged into {to} each "
        f"(every query head kept): KV heads {merge['kv_heads']['before']} -> {merge['kv_heads']['after']}"
    )
    kv = merge.get("kv_bytes")
    if kv and kv.get("after") is not None:
        line += f", KV cache at {kv['context']:,} tokens {kv['before']:,} -> {kv['after']:,} bytes"
    line += (
        f"; calibration {merge['metric']} {_fmt(merge['metric_before'])} -> {_fmt(merge['metric_after'])} "
        f"(blocks kept whole above {merge['max_cost']:.1%} alone)"
    )
    if metric is not None and metric.get("after_merge") is not None:
        line += f"; {metric['name']} after the merge {_fmt(metric['after_merge'])}"
    table = Table(title="merge: each block's cost alone", box=box.SIMPLE_HEAD)
    for col in ("block", "KV heads", "cost", "key error", "value error", "merged"):
        table.add_column(col, justify="left" if col == "block" else "right")
    for row in sorted(merge["layers"], key=lambda r: r["cost"]):
        table.add_row(
            row["block"],
            f"{row['kv_heads']} -> {row['to']}",
            f"{row['cost']:+.2%}",
            f"{row['key_error']:.3f}",
            f"{row['value_error']:.3f}",
            "yes" if row["merged"] else ("no (over)" if row["over_threshold"] else "no"),
        )
    return [line, table]


def protect_line(protected: dict[str, Any]) -> str:
    """The ``protect`` stage: the blocks whose cut alone cost more than the threshold, kept whole or cut anyway."""
    costs: dict[str, float] = {}
    for measured in protected["measured"]:
        costs.update(measured)
    whole = [b for b in protected["protected"] if b not in protected["cut_anyway"]]
    line = (
        f"protect: each block's cut measured alone ({len(costs)} block{'s' if len(costs) != 1 else ''}, calibration "
        f"{protected['metric']} {_fmt(protected['metric_before'])} uncut); over {protected['threshold']:.1%}: "
    )
    if not protected["protected"]:
        return line + "none"
    line += ", ".join(f"{b} ({costs[b]:+.1%})" for b in protected["protected"])
    if whole:
        line += f"; kept whole: {', '.join(whole)}"
    if protected["cut_anyway"]:
        line += f"; cut anyway (the budget needs them): {', '.join(protected['cut_anyway'])}"
    return line
