"""``headcut bench``: measure what removing heads buys, on synthetic inputs.

Every number is measured on the model as it is, none is estimated from its shape:

* **schedule**: by default (``interleave``) every model is loaded and prepared first (one row per model
  and runtime: inputs made, FLOPs counted, warmed up), then the rows are timed in **rounds**: round
  ``r`` runs one timed forward of every row, in an order rotated by one each round (A B C, then B C A,
  then C A B, then A B C again; with two rows A B, B A, ...), so that over as many rounds as there are
  rows each row runs once in every position and order effects (a cache the previous row warmed or
  cooled, a clock boost) cancel. ``runs`` is the number of rounds. A change in the machine's load (other
  jobs on a shared CPU) then hits every row of a round alike, instead of the rows timed while it lasted.
  Generation is timed the same way after the forwards: ``gen_runs`` rounds of one call per row that
  generates. This holds every model in memory at once. ``interleave=False`` (``--no-interleave``) loads
  and times one model after the other ("back to back": each row's warmup, runs and generations, then the
  next row's), holding one model at a time; its speed-ups are not comparable under a changing load.
  A single row is timed the same way in both schedules.
* **latency**: ``warmup`` untimed forwards of each row, then ``runs`` timed forwards of one batch
  (``batch_size`` x ``seq_len`` tokens, or ``batch_size`` images) under ``torch.inference_mode``.
  On CPU each forward is timed with ``time.perf_counter``; on CUDA with a pair of
  ``torch.cuda.Event(enable_timing=True)`` recorded after ``torch.cuda.synchronize()`` (the device is
  idle when each run starts; kernel launch time counts). Reported: median, 90th percentile and the
  interquartile range (25th and 75th percentiles; linear interpolation) in milliseconds, and every run
  (``runs_ms``, in round order).
* **throughput**: ``examples_per_s = batch_size / median`` and, for text inputs,
  ``tokens_per_s = batch_size * seq_len / median`` (encoder tokens for encoder-decoder models).
* **speed-up** and **FLOP ratio**: the first row's median latency (FLOPs) divided by this row's,
  so both read the same way and are 1.0 for the first row: a speed-up of 1.25 means 1.25x faster,
  a FLOP ratio of 1.25 means 20 % fewer FLOPs per forward. Generation speed-up: this row's
  generation tokens/s divided by the first row's.
* **noise** (interleaved rows after the first; :func:`paired_speedup`): the paired speed-up of each
  round, the first row's time in round ``r`` divided by this row's time in round ``r`` (both timed
  within the same round, under the same load), summarised by their 25th and 75th percentiles
  (``speedup_p25``, ``speedup_p75``); ``within_noise`` is true when that interval contains 1.0: the
  difference is within the run-to-run noise of this machine. The same for generation (per-round
  tokens/s ratios). ``within_noise`` is ``null`` with a single round (one ratio tells nothing of the
  noise), and all three are ``null`` for the first row and for back-to-back timings (no pairs).
* **FLOPs**: one forward of the whole batch counted by ``torch.utils.flop_counter.FlopCounterMode``:
  matrix multiplications (linear layers, attention scores and values, the output head) and fused
  attention kernels, 2 FLOPs per multiply-add; element-wise work (softmax, norms, activations) is not
  counted. CPU's fused attention kernel, which PyTorch's counter does not know, is counted with
  PyTorch's own attention formula, so eager and sdpa attention give the same count.
* **memory**: measured per row over its untimed warmup forwards (one untimed forward after the timed
  rounds with ``warmup=0``), outside the rounds and while no other row runs. On CUDA the peak of
  ``torch.cuda.max_memory_allocated`` during those forwards (after ``reset_peak_memory_stats``) minus
  what was allocated before them, plus the row's own weights, buffers and inputs: weights, inputs and
  activations of this model, not counting the other models held for interleaving (``peak_memory_kind``
  ``cuda_max_memory_allocated``). On Linux CPUs the peak resident set size (``VmHWM``, reset by
  writing 5 to ``/proc/self/clear_refs``) during those forwards minus the resident size just before
  them, after returning freed heap memory to the system: what the forwards add on top of the loaded
  models (``cpu_peak_rss_increase``; weights are reported apart as ``weights_bytes``). Elsewhere
  ``null`` (``unavailable``).
* **generation** (models with ``can_generate()``): cached greedy decoding of exactly ``gen_tokens``
  new tokens (``min_new_tokens = max_new_tokens``, no sampling, one beam) from the same prompt; one
  untimed call per row, then ``gen_runs`` timed calls (rounds). ``tokens_per_s = batch_size * new
  tokens / median``, with the interquartile range of the calls' times; the time includes the prompt's
  prefill. The KV cache is the ``past_key_values`` the untimed call returns: the bytes of the distinct
  tensor storages it holds, divided by ``batch_size`` and the number of cached positions
  (``get_seq_length()``: prompt plus new tokens minus one for decoders, new tokens for encoder-decoder
  decoders). Encoder-decoder models report their cross-attention cache apart (per encoder position).

**runtimes** (``runtime``: ``torch``, ``onnxruntime`` or both): each model gets one row per runtime, in
the same table and with the same statistics, inputs and baseline (the first row); interleaved, every
row of every runtime takes its turn in the same rounds. An ``onnxruntime`` row
runs the folder's ``model.onnx`` (see :mod:`headcut.outputs.formats.onnx`), or, when the folder has none (or
the model is given as a module), an export written into a temporary folder first (a note says so):
a float32 graph, whatever ``dtype`` the PyTorch rows use. Its session uses the same number of
intra-op threads as PyTorch. Each run is timed with ``time.perf_counter`` around
``InferenceSession.run`` (blocking; on CUDA the inputs and outputs stay on the device through an IO
binding). FLOPs, parameters and heads are those of the PyTorch model (the same computation);
``weights_bytes`` is the size of the ONNX files; the CPU memory is measured as for PyTorch, on CUDA
it is ``unavailable``. Generation is a greedy loop over the exported graph feeding each step's
``present.*`` back as ``past_key_values.*`` (on CUDA through host memory), with the same token counts
as PyTorch's; its KV cache is the bytes of the last step's presents.

Inputs are synthetic and reproducible from ``seed`` (see :mod:`headcut.model.inputs`).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from ...arguments.fields import bench_config
from ...arguments.kinds import values
from ...arguments.table import bench_models
from ...config import BenchConfig
from ...errors import HeadcutError
from ...model import loading as io
from .onnx_rows import OnnxRow, onnx_for
from .results import BenchResult, compare
from .rows import Row, TorchRow, measure, torch_threads
from .vllm_rows import VllmRow

#: a progress callback: (model index, model name, stage, steps done, steps in the stage); the interleaved
#: rounds of all the models come with index -1 and the name :data:`ALL_MODELS`
ProgressFn = Callable[[int, str, str, int, int], None]


#: the name :func:`bench` reports the stages of the interleaved rounds under (with index -1)
ALL_MODELS = "all models"


def bench(
    models: Sequence[str | Path | nn.Module],
    config: BenchConfig,
    *,
    names: Sequence[str] | None = None,
    task: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    progress: ProgressFn | None = None,
) -> list[BenchResult]:
    """Benchmark checkpoints (loaded with :func:`headcut.model.loading.load`) or loaded models, in each runtime
    of ``config.runtime`` (one result per model and runtime, in that order).

    ``config.interleave`` (the default): every model is loaded and prepared first and all rows are timed
    in rounds, the order rotated each round (:func:`round_order`; see the module docstring), so every model
    is held in memory at once; False: one model after the other ("back to back"), one in memory at a time.
    Speed-up and FLOP ratio are relative to the first result, and, interleaved, the interval of the
    per-round speed-ups with its ``within_noise`` verdict (:func:`compare`). ``progress(index, name, stage,
    done, total)`` reports each model's stages (``load``, ``flops``, ``warmup``, ``generate warmup``,
    ``memory`` with ``warmup=0``; ``onnx export`` and ``onnxruntime ...`` for onnxruntime) and the rounds
    of all of them as ``rounds`` and ``generate rounds`` with index -1 and name :data:`ALL_MODELS`; back
    to back (or with a single row) each model's timed calls are its own ``runs`` and ``generate``
    stages. The arguments are checked first (:func:`headcut.bench` checks them at its edge and calls
    :func:`timed`)."""
    bench_models(models, names)
    bench_config("config", config)
    with values():
        config.validate()
    return timed(
        models,
        config,
        names=names,
        task=task,
        allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code,
        progress=progress,
    )


def timed(
    models: Sequence[str | Path | nn.Module],
    config: BenchConfig,
    *,
    names: Sequence[str] | None = None,
    task: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    progress: ProgressFn | None = None,
) -> list[BenchResult]:
    """:func:`bench` on checked arguments: ``models`` and ``names`` as :func:`headcut.arguments.table.bench_models`
    checks them and a validated ``config`` (``BenchConfig.validate``)."""
    runtimes = config.runtimes()

    def rounds(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(-1, ALL_MODELS, stage, done, total)

    results: list[BenchResult] = []
    rows: list[Row] = []
    with contextlib.ExitStack() as stack, torch_threads(config):
        for i, item in enumerate(models):
            name = (
                names[i]
                if names is not None
                else (
                    os.fspath(item)
                    if isinstance(item, (str, os.PathLike))
                    else type(item).__name__.removeprefix("Headcut")
                )
            )

            def step(stage: str, done: int, total: int, i: int = i, name: str = name) -> None:
                if progress is not None:
                    progress(i, name, stage, done, total)

            model: nn.Module | None = None
            if isinstance(item, nn.Module):
                model = item
            elif runtimes != ("vllm",):  # vLLM reads the folder itself
                step("load", 0, 1)
                model = io.load(
                    item,
                    task,
                    allow_pickle=allow_pickle,
                    trust_remote_code=trust_remote_code,
                    dtype=config.dtype,
                    device=config.device,
                    attn_implementation=config.attn_implementation,
                )
                step("load", 1, 1)
            with contextlib.ExitStack() as own:  # back to back: a temporary export lives as long as its model
                keep = stack if config.interleave else own
                torch_row = None
                if "torch" in runtimes:
                    assert model is not None
                    torch_row = TorchRow(model, config, name, step)
                    rows.append(torch_row)
                    if not config.interleave:
                        results += measure(rows, config)
                        rows.clear()
                if "onnxruntime" in runtimes:
                    assert model is not None
                    onnx_file, note = onnx_for(item, model, keep, step)
                    flops = torch_row.flops if torch_row is not None else None
                    rows.append(OnnxRow(model, onnx_file, config, name, step, flops, note))
                    if not config.interleave:
                        results += measure(rows, config)
                        rows.clear()
                if "vllm" in runtimes:
                    if isinstance(item, nn.Module):
                        raise HeadcutError(f"{name}: --runtime vllm serves checkpoint folders, not a loaded model")
                    caches = config.cache_dtypes()
                    engines = len(models) * len(caches) if config.interleave else 1
                    for cache in caches:
                        label = name if caches == ("auto",) else f"{name} [kv {cache}]"
                        row = VllmRow(
                            item,
                            config,
                            label,
                            step,
                            engines=engines,
                            trust_remote_code=trust_remote_code,
                            cache_dtype=cache,
                        )
                        keep.callback(row.close)
                        rows.append(row)
                        if not config.interleave:
                            results += measure(rows, config)
                            rows.clear()
            del torch_row, model
            if not config.interleave and not isinstance(item, nn.Module):
                gc.collect()
                if config.device.startswith("cuda"):
                    torch.cuda.empty_cache()
        if rows:
            results = measure(rows, config, rounds)
            rows.clear()
    return compare(results, paired=config.interleave)
