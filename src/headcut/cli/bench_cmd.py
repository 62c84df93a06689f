"""``headcut bench``: latency, throughput, FLOPs, memory; generation speed and KV cache for decoders."""

from __future__ import annotations

from typing import Annotated

import typer

from ..config import BenchConfig, CardOptions
from ..config.run import ModelSource, RunSettings
from ..files.plan import plan_outputs
from .app import app
from .completion import complete_folders
from .declared import with_settings, with_specs
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting

_D = BenchConfig()

BENCH_HELP = "\n\n".join(
    [
        "Benchmark models on synthetic inputs; with two models or more, speed-up and FLOP ratio are relative to the "
        "first MODEL.",
        f"Each MODEL gets --warmup ({_D.warmup}) untimed and --runs ({_D.runs}) timed forwards of one batch of "
        "--batch-size x --seq-len random tokens (image models: random images of the config's size) under inference "
        "mode. CPU forwards are timed with perf_counter, CUDA forwards with CUDA events after a synchronise. Models "
        "that generate also run cached greedy decoding of exactly --gen-tokens new tokens from the same prompt (one "
        "untimed call, then --gen-runs timed ones).",
        "The models are timed interleaved: all are loaded and warmed up first, then each of --runs rounds runs one "
        "timed forward of every MODEL (and every runtime row), the order rotated by one each round (A B C, B C A, "
        "C A B, ...), and the same for generation; a change in the machine's load then hits every model of a round "
        "alike. This holds every MODEL in memory at once; --no-interleave times one MODEL after the other (back to "
        "back), whose speed-ups are not comparable on a loaded machine.",
        "\n".join(
            [
                "Columns:",
                "runtime (with --runtime onnxruntime or vllm): torch, onnxruntime running the ONNX graph, or vllm.",
                "heads: attention heads left in the model.",
                "params: distinct parameters (tied weights once).",
                "GFLOPs: one forward of the whole batch, counted by torch's FlopCounterMode (matmuls and attention "
                "kernels, 2 per multiply-add; element-wise ops not counted).",
                "FLOP ratio: first model's FLOPs / this model's (1.25 = 20 % fewer FLOPs); only with a baseline.",
                "median ms, p90 ms: time per forward of the batch; p25-p75 ms: the interquartile range of the runs.",
                "examples/s: batch size / median time.",
                "speed-up: first model's median / this model's; only with a baseline. In brackets, interleaved: the 25th "
                "to 75th percentile of the per-round speed-ups (first model's time / this model's, in the same round); "
                "'within noise' when that interval contains 1: the difference is within this machine's run-to-run noise.",
                "peak MiB: CUDA: max memory allocated during the forwards (weights included); CPU (Linux): peak "
                "resident memory the forwards add on top of the loaded model.",
                "gen tok/s: batch size x new tokens / median generation time (prefill included; vllm rows: the "
                "decoding steps only).",
                "gen speed-up: this model's gen tok/s / the first model's, with the same interval and verdict.",
                "gen ideal: the gen speed-up that the bytes read per new token predict for a memory-bound decoder "
                "(weights read once per step for the batch, plus each sequence's KV cache at its mean cached length): "
                "the first model's bytes / this model's.",
                "KV B/token: bytes of the keys and values in the returned KV cache / batch size / cached positions.",
            ]
        ),
        "--runtime onnxruntime times the folder's model.onnx in onnxruntime (written by --format onnx; a folder "
        "without one is exported to a temporary folder first, with a note) on the same inputs, with the same "
        "statistics, in rows beside the PyTorch ones; --runtime torch,onnxruntime gives both rows for every MODEL. "
        "The ONNX graph is float32 whatever --dtype says; --device cuda uses onnxruntime's CUDAExecutionProvider "
        "(onnxruntime-gpu). FLOPs, params and heads are the PyTorch model's; the first row is the baseline.",
        "--runtime vllm serves each MODEL folder in a vLLM engine of its own (one process per MODEL, all loaded "
        "first and timed in the same rounds; vLLM's interpreter: --vllm-python, as vLLM pins its own torch and "
        "transformers). Its forward is a prefill of --batch-size prompts of --seq-len random tokens (no prefix "
        "caching) and its generation the steps that decode --gen-tokens more tokens after that prefill (timed "
        "inside vLLM's process); FLOPs (the FLOP ratio is the ideal prefill speed-up) and the KV cache are computed "
        "from the layers vLLM built. A cut in headcut's own form is refused: serve a stock cut (--uniform) or a "
        "--format decilm folder. A vLLM process that sends nothing for 90 s (it writes a heartbeat every 10 s while "
        "it works) or takes more than --vllm-timeout for one answer is stopped with everything it started, as it is "
        "on Ctrl-C or SIGTERM.",
        "--json PATH|- writes the same numbers and more: every run's time, tokens/s, FLOPs per op, weights bytes, "
        "cache sizes, encoder-decoder cross-attention cache per encoder token, generation speed-up.",
    ]
)


@app.command(
    cls=TidyCommand,
    help=BENCH_HELP,
    epilog=examples(
        "headcut bench model/ slim/ --device cpu",
        "headcut bench model/ slim/ --device cuda --dtype float16 --batch-size 32 --json -",
        "headcut bench lm/ lm-slim/ --batch-size 1 --seq-len 128 --gen-tokens 64",
        "headcut bench model/ slim/ --runtime torch,onnxruntime",
        "headcut bench lm/ lm-slim/ --runtime vllm --vllm-python vllm-env/bin/python --batch-size 1 --seq-len 2048",
        "headcut bench model/ slim/ --update-card",
    ),
)
@handle_errors
@with_specs(BenchConfig, "settings", skip=("seed",))  # --seed: the shared one (RunSettings)
@with_specs(CardOptions, "cards")
@with_settings(RunSettings, "run", skip=("device", "resume"))
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def bench(
    models: Annotated[
        list[str],
        typer.Argument(
            help="Checkpoint folders (or Hugging Face Hub ids); the first is the baseline.",
            metavar="MODEL...",
            show_default=False,
            autocompletion=complete_folders,
        ),
    ],
    settings: dict | None = None,
    run: RunSettings = RunSettings(),
    cards: dict | None = None,
    reporting: Reporting = Reporting(),
    source: ModelSource = ModelSource(),
) -> None:
    """Benchmark MODELS (see BENCH_HELP): a table on stdout, the same numbers and more with --json."""
    json_out = reporting.json_out
    log = Out(json_out, reporting.quiet)  # first: the log's 30 s clock starts with the command
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api
    from ..jobs.bench import device_name
    from .render.bench import bench_table

    update_cards = CardOptions(**(cards or {})).update_cards
    reads: dict[str, str | None] = {f"MODEL {m}": m for m in models}
    reads["--vllm-python"] = (settings or {}).get("vllm_python")  # an input too: never written over
    plan_outputs(reads=reads, files={"--json": json_out})
    try:
        measured = api.bench(
            models,
            seed=run.seed,
            task=source.task,
            progress=log.progress,
            allow_pickle=source.allow_pickle,
            trust_remote_code=source.trust_remote_code,
            update_cards=update_cards,
            on_warning=lambda warning: log.log.print(
                f"warning: {warning}", highlight=False, markup=False, soft_wrap=True
            ),
            **(settings or {}),  # the flags given, checked once by the API (the others: the declared defaults)
        )
    finally:
        log.close()
    log.show(bench_table(measured.results, measured.config, device_name(measured.config.device)))
    for card in measured.cards:
        log.show(f"speed written to {card}")
    log.notes(measured.notes)
    log.json(measured.report)
