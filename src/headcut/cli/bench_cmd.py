"""``headcut bench``: latency, throughput, FLOPs, memory and KV cache of one or more models."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .. import io
from ..bench import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    BenchConfig,
    BenchResult,
    device_name,
    report_json,
)
from ..bench import bench as run_bench
from . import app
from .common import (
    AllowPickle,
    JsonOut,
    Task,
    TrustRemote,
    console,
    handle_errors,
    plan_outputs,
    write_json,
)

_D = BenchConfig()

#: the command's help; typer keeps single line breaks, so each paragraph or list item is one line
BENCH_HELP = "\n\n".join([
    "Benchmark models on synthetic inputs; speed-up and FLOP ratio are relative to the first MODEL.",
    f"Each MODEL gets --warmup ({_D.warmup}) untimed and --runs ({_D.runs}) timed forwards of one batch of "
    "--batch-size x --seq-len random tokens (image models: random images of the config's size) under inference "
    "mode. CPU forwards are timed with perf_counter, CUDA forwards with CUDA events after a synchronise. Models "
    "that generate also run cached greedy decoding of exactly --gen-tokens new tokens from the same prompt (one "
    "untimed call, then --gen-runs timed ones).",
    "\n".join([
        "Columns:",
        "heads: attention heads left in the model.",
        "params: distinct parameters (tied weights once).",
        "GFLOPs: one forward of the whole batch, counted by torch's FlopCounterMode (matmuls and attention "
        "kernels, 2 per multiply-add; element-wise ops not counted).",
        "FLOP ratio: first model's FLOPs / this model's (1.25 = 20 % fewer FLOPs).",
        "median ms, p90 ms: time per forward of the batch.",
        "examples/s: batch size / median time.",
        "speed-up: first model's median / this model's.",
        "peak MiB: CUDA: max memory allocated during the forwards (weights included); CPU (Linux): peak "
        "resident memory the forwards add on top of the loaded model.",
        "gen tok/s: batch size x new tokens / median generation time (prefill included).",
        "KV B/token: bytes of the keys and values in the returned KV cache / batch size / cached positions.",
    ]),
    "--json PATH|- writes the same numbers and more: every run's time, tokens/s, FLOPs per op, weights bytes, "
    "cache sizes, encoder-decoder cross-attention cache per encoder token, generation speed-up.",
])

Models = Annotated[
    list[str], typer.Argument(help="Checkpoint folders (or Hugging Face Hub ids); the first is the baseline.",
                              show_default=False)
]


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f}"


def _count(n: int) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def results_table(results: list[BenchResult], config: BenchConfig) -> Table:
    """One row per model with the numbers of ``headcut bench`` (see its help)."""
    first = results[0] if results else None
    kind = first.peak_memory_kind if first is not None else ""
    memory_note = {
        "cuda_max_memory_allocated": "peak MiB: max CUDA memory allocated during the forwards (weights included)",
        "cpu_peak_rss_increase": "peak MiB: resident memory the forwards add on top of the loaded model",
    }.get(kind, "peak MiB: not measurable here")
    threads = first.threads if first is not None else 0
    dtypes = sorted({r.dtype for r in results})
    dtype = dtypes[0] if len(dtypes) == 1 else "dtypes " + "/".join(dtypes)
    table = Table(
        title=f"{config.device} ({device_name(config.device)}, {threads} thread{'s' if threads != 1 else ''}), "
              f"{dtype}, batch {config.batch_size} x {config.seq_len}",
        caption=memory_note,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ("model", "heads", "params", "GFLOPs", "FLOP\nratio", "median\nms", "p90\nms", "examples\n/s",
               "speed-\nup", "peak\nMiB", "gen\ntok/s", "KV B/\ntoken")
    for col in columns:
        if col == "model":
            table.add_column(col, overflow="fold")
        else:
            table.add_column(col, justify="right", no_wrap=True)
    for r in results:
        gen = r.generation
        table.add_row(
            r.name,
            "-" if r.heads is None else str(r.heads),
            _count(r.params),
            f"{r.flops / 1e9:,.3f}",
            _num(r.flop_ratio, ".3f"),
            f"{r.median_ms:,.2f}",
            f"{r.p90_ms:,.2f}",
            f"{r.examples_per_s:,.1f}",
            _num(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
            _mib(r.peak_memory_bytes),
            "-" if gen is None else f"{gen.tokens_per_s:,.1f}",
            "-" if gen is None else f"{gen.kv_bytes_per_token:,.0f}",
        )
    return table


@app.command(help=BENCH_HELP)
@handle_errors
def bench(
    models: Models,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda (cuda:N).")] = _D.device,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Examples per forward.")] = _D.batch_size,
    seq_len: Annotated[
        int, typer.Option("--seq-len", help="Tokens per example (the prompt length for generation).")
    ] = _D.seq_len,
    runs: Annotated[int, typer.Option("--runs", help="Timed forwards per model.")] = _D.runs,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed forwards before the timed ones.")] = _D.warmup,
    threads: Annotated[
        Optional[int],
        typer.Option("--threads", help="CPU threads (torch.set_num_threads) during the runs; default: torch's."),
    ] = None,
    dtype: Annotated[
        Optional[str],
        typer.Option("--dtype", help=f"Load in this dtype ({', '.join(DTYPES)}); default: the checkpoint's."),
    ] = None,
    attn: Annotated[
        Optional[str],
        typer.Option(
            "--attn", help=f"Attention implementation ({', '.join(ATTN_IMPLEMENTATIONS)}); default: transformers'."
        ),
    ] = None,
    gen_tokens: Annotated[
        int,
        typer.Option("--gen-tokens", help="New tokens per cached greedy generation (models that generate); 0: skip."),
    ] = _D.gen_tokens,
    gen_runs: Annotated[int, typer.Option("--gen-runs", help="Timed generations per model.")] = _D.gen_runs,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the synthetic inputs.")] = _D.seed,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Benchmark MODELS (see BENCH_HELP): a table on stderr, the same numbers and more with --json."""
    config = BenchConfig(
        device=device, batch_size=batch_size, seq_len=seq_len, runs=runs, warmup=warmup, threads=threads,
        dtype=dtype, attn_implementation=attn, gen_tokens=gen_tokens, gen_runs=gen_runs, seed=seed,
    )
    for warning in config.validate():
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for model in models:  # refuse a missing folder before spending minutes on the others
        io.check_checkpoint(model, allow_pickle)
    plan_outputs(reads={f"MODEL {m}": m for m in models}, files={"--json": json_out})
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )
    task_id = progress.add_task("starting", total=1)

    def on_progress(index: int, name: str, stage: str, done: int, total: int) -> None:
        progress.update(task_id, description=escape(f"[{index + 1}/{len(models)}] {name}: {stage}"),
                        completed=done, total=max(total, 1))

    with progress:
        results = run_bench(models, config, task=task, allow_pickle=allow_pickle,
                            trust_remote_code=trust_remote_code, progress=on_progress)
    # a pipe or a log file has no width: give the table the room it needs instead of 80 columns
    out = console if console.is_terminal else Console(stderr=True, width=200)
    out.print(results_table(results, config))
    for r in results:
        for note in r.notes:
            console.print(f"note: {r.name}: {note}", highlight=False, markup=False, soft_wrap=True)
    data: dict[str, Any] = report_json(results, config)
    write_json(data, json_out)
