"""``headcut bench``'s table."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text


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
