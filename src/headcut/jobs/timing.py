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

Inputs are synthetic and reproducible from ``seed``: token ids drawn uniformly from the vocabulary
without the special tokens (pad, bos, eos, decoder start) and a full attention mask; encoder-decoder
inputs end with the eos token and get ``seq_len`` decoder ids starting with the decoder start token;
image models get ``pixel_values`` of ``(batch_size, num_channels, image_size, image_size)`` from the
config, drawn from a standard normal distribution.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from ..config import BenchConfig
from ..errors import HeadcutError, first_line
from ..model.runtime import returned_cache
from ..model.surgery import count_params, weights_bytes
from ..files.leftovers import scratch_folder

#: ``--dtype`` values
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: ``--attn`` values (transformers attention implementations)

#: a progress callback: (model index, model name, stage, steps done, steps in the stage); the interleaved
#: rounds of all the models come with index -1 and the name :data:`ALL_MODELS`
ProgressFn = Callable[[int, str, str, int, int], None]


@dataclass
class GenerationResult:
    """Cached greedy generation of one model (see the module docstring)."""

    new_tokens: int
    runs_ms: list[float]
    median_ms: float
    p25_ms: float
    p75_ms: float
    tokens_per_s: float
    kv_cache_bytes: int
    kv_cache_positions: int
    kv_bytes_per_token: float
    cross_kv_cache_bytes: int | None = None
    cross_kv_cache_positions: int | None = None
    cross_kv_bytes_per_token: float | None = None
    speedup: float | None = None
    #: the 25th..75th percentile of the per-round tokens/s ratios to the first row (interleaved rows after it)
    speedup_p25: float | None = None
    speedup_p75: float | None = None
    #: whether that interval contains 1.0 (None: no pairs, or a single round)
    within_noise: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchResult:
    """Everything measured for one model (in one runtime); ``speedup``/``flop_ratio`` and the paired interval
    ``speedup_p25``..``speedup_p75`` with its ``within_noise`` verdict are filled by :func:`compare`."""

    name: str
    architecture: str
    model_type: str
    dtype: str
    attn_implementation: str | None
    device: str
    threads: int
    inputs: dict[str, list[int]]
    heads: int | None
    kv_heads: int | None
    params: int
    weights_bytes: int
    flops: int
    flops_by_op: dict[str, int]
    runs_ms: list[float]
    median_ms: float
    p90_ms: float
    p25_ms: float
    p75_ms: float
    examples_per_s: float
    tokens_per_s: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str
    generation: GenerationResult | None = None
    speedup: float | None = None
    flop_ratio: float | None = None
    notes: list[str] = field(default_factory=list)
    runtime: str = "torch"
    #: the 25th..75th percentile of the per-round speed-ups against the first row (interleaved rows after it)
    speedup_p25: float | None = None
    speedup_p75: float | None = None
    #: whether that interval contains 1.0: the difference is within run-to-run noise (None: no pairs, or one round)
    within_noise: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["generation"] = self.generation.to_json() if self.generation is not None else None
        return out


# ----------------------------------------------------------------------------------------------
# measurements


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _sdpa_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None,
                **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _custom_flop_formulas() -> dict[Any, Any]:
    """Fused attention kernels PyTorch's counter has no formula for (CPU flash attention)."""
    out: dict[Any, Any] = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            out[op] = _sdpa_flops
    return out


def count_flops(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[int, dict[str, int]]:
    """FLOPs of one forward of ``model`` on ``inputs``: total and per aten op."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=_custom_flop_formulas())
    # the counter's module tracker hooks tensors that require grad, which fails in inference mode
    # when a model passes a parameter between modules (DeBERTa's relative embeddings)
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        with torch.inference_mode(), counter:
            model(**inputs)
    finally:
        for p in trainable:
            p.requires_grad_(True)
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return int(counter.get_total_flops()), dict(sorted(by_op.items()))


class _RssPeak:
    """Peak resident memory increase of this process on Linux (VmHWM after a reset via clear_refs)."""

    kind = "cpu_peak_rss_increase"

    def __init__(self) -> None:
        self.before: int | None = None

    @staticmethod
    def _status(field_name: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
        raise OSError(f"{field_name} not in /proc/self/status")

    def start(self) -> None:
        gc.collect()
        try:  # give freed heap memory back to the system so it cannot hide the forwards' peak
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.before = self._status("VmRSS")
        except OSError:
            self.before = None

    def stop(self) -> int | None:
        if self.before is None:
            return None
        try:
            return max(0, self._status("VmHWM") - self.before)
        except OSError:
            return None


def _time_one(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call of ``fn`` (CUDA events on CUDA, perf_counter elsewhere)."""
    if device.type == "cuda":
        with torch.cuda.device(device):  # events record on the current device's stream
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def time_calls(fn: Callable[[], Any], runs: int, device: torch.device,
               step: Callable[[int], None] | None = None) -> list[float]:
    """Milliseconds of ``runs`` calls of ``fn`` (CUDA events on CUDA, perf_counter on CPU)."""
    times: list[float] = []
    for i in range(runs):
        times.append(_time_one(fn, device))
        if step is not None:
            step(i + 1)
    return times


def round_order(count: int, round_index: int) -> list[int]:
    """The order of ``count`` rows in round ``round_index`` (from 0) of an interleaved bench: rotated by one
    each round (0 1 2, 1 2 0, 2 0 1, 0 1 2, ...; two rows alternate), so over ``count`` consecutive rounds
    every row runs once in every position."""
    if count < 1:
        return []
    return [(round_index + i) % count for i in range(count)]


def time_rounds(calls: Sequence[Callable[[], Any]], rounds: int, clocks: Sequence[torch.device],
                step: Callable[[int], None] | None = None) -> list[list[float]]:
    """Milliseconds of ``rounds`` interleaved rounds: round ``r`` makes one timed call of each of ``calls`` in
    :func:`round_order` (``clocks[i]`` times call ``i``, as :func:`time_calls` does). Returns one list per
    call, in round order: ``[i][r]`` is call ``i`` in round ``r``. ``step(r)`` after round ``r`` (from 1)."""
    if len(clocks) != len(calls):
        raise ValueError(f"{len(calls)} calls but {len(clocks)} clocks")
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        for i in round_order(len(calls), r):
            times[i].append(_time_one(calls[i], clocks[i]))
        if step is not None:
            step(r + 1)
    return times


def paired_speedup(baseline_ms: Sequence[float], model_ms: Sequence[float],
                   scale: float = 1.0) -> tuple[float, float, bool | None] | None:
    """The per-round speed-ups of an interleaved bench, ``scale * baseline_ms[r] / model_ms[r]`` (both timed in
    round ``r``), summarised as ``(p25, p75, within_noise)``: their 25th and 75th percentiles (see
    :func:`percentile`) and whether that interval contains 1.0, i.e. the difference is within run-to-run noise.
    ``within_noise`` is None with a single pair (one ratio tells nothing of the noise); the whole result is
    None when no round has two positive times. ``scale``: the work of one of this model's calls over the
    baseline's (generation: its new tokens / the baseline's), so the ratio reads as a throughput ratio."""
    if len(baseline_ms) != len(model_ms):
        raise ValueError(f"paired times need as many rounds: {len(baseline_ms)} and {len(model_ms)}")
    ratios = [scale * b / m for b, m in zip(baseline_ms, model_ms) if b > 0 and m > 0]
    if not ratios:
        return None
    low, high = percentile(ratios, 25), percentile(ratios, 75)
    return low, high, (low <= 1.0 <= high) if len(ratios) > 1 else None


def _storages_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    """The key and value tensors of a transformers cache (or every tensor of a legacy tuple of tuples)."""
    if cache is None:
        return []
    if isinstance(cache, torch.Tensor):
        return [cache]
    if isinstance(cache, (tuple, list)):
        return [t for item in cache for t in _cache_tensors(item)]
    layers = getattr(cache, "layers", None)
    if layers is not None:
        out = []
        for layer in layers:
            out += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                    if isinstance(t, torch.Tensor)]
        return out
    raise HeadcutError(f"cannot read a KV cache of type {type(cache).__name__}")


def kv_cache_size(cache: Any) -> dict[str, int | None]:
    """Bytes and cached positions of a ``past_key_values`` (self-attention and cross-attention apart)."""
    self_cache = getattr(cache, "self_attention_cache", cache)
    cross_cache = getattr(cache, "cross_attention_cache", None)
    out: dict[str, int | None] = {
        "bytes": _storages_bytes(_cache_tensors(self_cache)),
        "positions": int(self_cache.get_seq_length()),
        "cross_bytes": None,
        "cross_positions": None,
    }
    if cross_cache is not None:
        out["cross_bytes"] = _storages_bytes(_cache_tensors(cross_cache))
        out["cross_positions"] = int(cross_cache.get_seq_length())
    return out


# ----------------------------------------------------------------------------------------------
# inputs


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _special_ids(model: nn.Module) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    sources = [model.config.get_text_config(), getattr(model, "generation_config", None)]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        ids: list[int] = []
        for src in sources:
            if src is not None:
                ids += [i for i in _ids(getattr(src, key, None)) if i not in ids]
        out[key] = ids
    return out


def _forward_accepts(model: nn.Module, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def make_inputs(model: nn.Module, config: BenchConfig) -> dict[str, torch.Tensor]:
    """Synthetic inputs for one forward, reproducible from ``config.seed`` (see the module docstring)."""
    g = torch.Generator().manual_seed(config.seed)
    device = torch.device(config.device)
    cfg = model.config
    b, n = config.batch_size, config.seq_len
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = getattr(cfg, "image_size", None)
        if size is None:
            raise HeadcutError(f"{type(model).__name__} takes images but its config has no image_size")
        h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        channels = int(getattr(cfg, "num_channels", 3))
        dtype = next(model.parameters()).dtype
        return {"pixel_values": torch.randn(b, channels, h, w, generator=g).to(device=device, dtype=dtype)}
    if main != "input_ids":
        raise HeadcutError(f"headcut bench makes token or image inputs; {type(model).__name__} takes {main!r}")
    embeddings = model.get_input_embeddings()
    vocab = int(getattr(embeddings, "num_embeddings", 0) or cfg.get_text_config().vocab_size)
    special = _special_ids(model)
    banned = {i for ids in special.values() for i in ids}
    allowed = torch.tensor([i for i in range(vocab) if i not in banned] or list(range(vocab)))
    ids = allowed[torch.randint(len(allowed), (b, n), generator=g)]
    encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
    if encoder_decoder and special["eos_token_id"]:
        ids[:, -1] = special["eos_token_id"][0]
    inputs = {"input_ids": ids, "attention_mask": torch.ones(b, n, dtype=torch.long)}
    if encoder_decoder and _forward_accepts(model, "decoder_input_ids"):
        dec = allowed[torch.randint(len(allowed), (b, n), generator=g)]
        if special["decoder_start_token_id"]:
            dec[:, 0] = special["decoder_start_token_id"][0]
        inputs["decoder_input_ids"] = dec
    return {k: v.to(device) for k, v in inputs.items()}


def _check_positions(model: nn.Module, config: BenchConfig, generates: bool) -> None:
    text = model.config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if not isinstance(limit, int) or getattr(model, "main_input_name", "input_ids") != "input_ids":
        return
    if config.seq_len > limit:
        raise HeadcutError(f"--seq-len {config.seq_len} is longer than the model's {limit} positions")
    if not (generates and config.gen_tokens):
        return
    if getattr(model.config, "is_encoder_decoder", False):
        if config.gen_tokens + 1 > limit:  # the decoder starts from its start token
            raise HeadcutError(f"--gen-tokens {config.gen_tokens} is longer than the model's {limit} positions")
    elif config.seq_len + config.gen_tokens > limit:
        raise HeadcutError(
            f"--seq-len {config.seq_len} plus --gen-tokens {config.gen_tokens} is longer than the model's "
            f"{limit} positions"
        )


def _describe(inputs: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items())


# ----------------------------------------------------------------------------------------------
# benchmarking


def _generate(model: nn.Module, inputs: dict[str, torch.Tensor], tokens: int, **extra: Any) -> Any:
    special = _special_ids(model)
    pad = (special["pad_token_id"] or special["eos_token_id"] or [0])[0]
    with torch.inference_mode():
        return model.generate(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=tokens,
            min_new_tokens=tokens, do_sample=False, num_beams=1, use_cache=True, pad_token_id=pad, **extra,
        )


def _latency(times: list[float], config: BenchConfig, text: bool) -> dict[str, Any]:
    """The latency and throughput fields of a :class:`BenchResult` from its runs."""
    median = statistics.median(times)
    b = config.batch_size
    return dict(runs_ms=times, median_ms=median, p90_ms=percentile(times, 90), p25_ms=percentile(times, 25),
                p75_ms=percentile(times, 75), examples_per_s=b / (median / 1000.0),
                tokens_per_s=b * config.seq_len / (median / 1000.0) if text else None)


def _generation_result(new_tokens: int, times: list[float], batch: int, size: dict[str, int | None]) -> GenerationResult:
    """A :class:`GenerationResult` from the timed calls and the cache size of :func:`kv_cache_size`'s form."""
    median = statistics.median(times)
    positions = int(size["positions"] or 0)
    cache_bytes = int(size["bytes"] or 0)
    result = GenerationResult(
        new_tokens=int(new_tokens), runs_ms=times, median_ms=median, p25_ms=percentile(times, 25),
        p75_ms=percentile(times, 75), tokens_per_s=batch * new_tokens / (median / 1000.0),
        kv_cache_bytes=cache_bytes, kv_cache_positions=positions,
        kv_bytes_per_token=cache_bytes / (batch * positions) if positions else 0.0,
    )
    if size.get("cross_bytes") is not None:
        cross_bytes, cross_positions = int(size["cross_bytes"] or 0), int(size.get("cross_positions") or 0)
        result.cross_kv_cache_bytes = cross_bytes
        result.cross_kv_cache_positions = cross_positions
        result.cross_kv_bytes_per_token = cross_bytes / (batch * cross_positions) if cross_positions else 0.0
    return result


def _probe_generation(model: nn.Module, prompt: dict[str, torch.Tensor], tokens: int) -> tuple[int, dict[str, int | None]]:
    """The untimed generation call: the new tokens it made and the size of the KV cache it returned."""
    out = _generate(model, prompt, tokens, return_dict_in_generate=True)
    if getattr(model.config, "is_encoder_decoder", False):
        new_tokens = out.sequences.shape[1] - 1  # decoder outputs start with the decoder start token
    else:
        new_tokens = out.sequences.shape[1] - prompt["input_ids"].shape[1]  # decoder-only outputs repeat the prompt
    size = kv_cache_size(returned_cache(out))
    del out
    return int(new_tokens), size


def bench_generation(model: nn.Module, inputs: dict[str, torch.Tensor], config: BenchConfig,
                     step: Callable[[int], None] | None = None) -> GenerationResult:
    """Time cached greedy generation of ``config.gen_tokens`` tokens and measure its KV cache (one model
    alone: one untimed call, then ``config.gen_runs`` timed ones)."""
    prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    new_tokens, size = _probe_generation(model, prompt, config.gen_tokens)
    times = time_calls(lambda: _generate(model, prompt, config.gen_tokens), config.gen_runs,
                       torch.device(config.device), step)
    return _generation_result(new_tokens, times, config.batch_size, size)


def _heads(model: nn.Module) -> tuple[int | None, int | None]:
    from ..adapters import adapter_for

    try:
        blocks = adapter_for(model).blocks(model.base_model)
    except HeadcutError:
        return None, None
    return sum(b.heads for b in blocks), sum(b.kv_heads for b in blocks)


#: a stage callback: (stage, steps done, steps in the stage)
StageFn = Callable[[str, int, int], None]


def _silent(stage: str, done: int, total: int) -> None:
    return None


@contextlib.contextmanager
def _threads(config: BenchConfig) -> Iterator[None]:
    """``config.threads`` CPU threads for torch inside the block; torch's own number restored after it."""
    old = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class _Row:
    """One model in one runtime, prepared for timing (inputs made, FLOPs counted): what :func:`_measure` needs
    from it. Subclasses set ``label``, ``clock`` (the device that times its calls), ``generates`` and
    ``report`` (its stage callback), and give :meth:`forward`, :meth:`generate`, :meth:`probe_generation`
    and :meth:`result`."""

    label: str
    clock: torch.device
    generates: bool
    report: StageFn

    def __init__(self) -> None:
        self.peak: int | None = None
        self.kind = "unavailable"
        self.new_tokens = 0
        self.cache: dict[str, int | None] = {}
        self.notes: list[str] = []

    def forward(self) -> Any:
        raise NotImplementedError

    def generate(self) -> Any:
        raise NotImplementedError

    def probe_generation(self) -> None:
        """The untimed generation call: sets ``new_tokens`` and ``cache``."""
        raise NotImplementedError

    def result(self, times: list[float], generation: GenerationResult | None) -> BenchResult:
        raise NotImplementedError

    def _cuda_memory(self, calls: int, step: Callable[[int], None]) -> None:
        raise NotImplementedError

    def measure_memory(self, calls: int, step: Callable[[int], None]) -> None:
        """Run ``calls`` untimed forwards and measure the peak memory they take (see the module docstring)."""
        if self.clock.type == "cuda":
            self._cuda_memory(calls, step)
            return
        rss = _RssPeak()
        rss.start()
        time_calls(self.forward, calls, self.clock, step)
        self.peak = rss.stop()
        self.kind = rss.kind if self.peak is not None else "unavailable"

    def generation(self, times: list[float] | None, batch: int) -> GenerationResult | None:
        return None if times is None else _generation_result(self.new_tokens, times, batch, self.cache)


class _TorchRow(_Row):
    """A model in PyTorch: moved to the device and dtype, attention set, inputs made, FLOPs counted."""

    def __init__(self, model: nn.Module, config: BenchConfig, label: str, report: StageFn) -> None:
        super().__init__()
        self.model, self.config, self.label, self.report = model, config, label, report
        self.clock = torch.device(config.device)
        model.to(device=self.clock, dtype=DTYPES[config.dtype] if config.dtype else None)
        if config.attn_implementation:
            model.set_attn_implementation(config.attn_implementation)
        model.eval()
        self.generates = bool(config.gen_tokens) and bool(getattr(model, "can_generate", lambda: False)())
        _check_positions(model, config, self.generates)
        self.inputs = make_inputs(model, config)
        self.prompt = {k: v for k, v in self.inputs.items() if k in ("input_ids", "attention_mask")}
        report("flops", 0, 1)
        try:
            self.flops = count_flops(model, self.inputs)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            raise HeadcutError(
                f"{label}: the forward fails on inputs {_describe(self.inputs)}: {first_line(exc)}"
            ) from None
        report("flops", 1, 1)

    def forward(self) -> Any:
        with torch.inference_mode():
            return self.model(**self.inputs)

    def _cuda_memory(self, calls: int, step: Callable[[int], None]) -> None:
        device = self.clock
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        time_calls(self.forward, calls, device, step)
        torch.cuda.synchronize(device)
        own = weights_bytes(self.model) + _storages_bytes(list(self.inputs.values()))
        self.peak = int(torch.cuda.max_memory_allocated(device)) - before + own
        self.kind = "cuda_max_memory_allocated"

    def generate(self) -> Any:
        try:
            return _generate(self.model, self.prompt, self.config.gen_tokens)
        except (RuntimeError, ValueError, IndexError) as exc:
            raise HeadcutError(f"{self.label}: generation fails: {first_line(exc)}") from None

    def probe_generation(self) -> None:
        try:
            self.new_tokens, self.cache = _probe_generation(self.model, self.prompt, self.config.gen_tokens)
        except (RuntimeError, ValueError, IndexError) as exc:
            raise HeadcutError(f"{self.label}: generation fails: {first_line(exc)}") from None
        if self.new_tokens != self.config.gen_tokens:
            self.notes.append(f"generation produced {self.new_tokens} tokens, not {self.config.gen_tokens}")

    def result(self, times: list[float], generation: GenerationResult | None) -> BenchResult:
        model, config = self.model, self.config
        heads, kv_heads = _heads(model)
        return BenchResult(
            name=self.label,
            architecture=type(model).__name__.removeprefix("Headcut"),
            model_type=str(getattr(model.config, "model_type", "")),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            attn_implementation=getattr(model.config, "_attn_implementation", None),
            device=str(self.clock),
            threads=torch.get_num_threads(),
            inputs={k: list(v.shape) for k, v in self.inputs.items()},
            heads=heads,
            kv_heads=kv_heads,
            params=count_params(model),
            weights_bytes=weights_bytes(model),
            flops=self.flops[0],
            flops_by_op=self.flops[1],
            **_latency(times, config, "input_ids" in self.inputs),
            peak_memory_bytes=self.peak,
            peak_memory_kind=self.kind,
            generation=generation,
            notes=list(self.notes),
        )


def _measure(rows: Sequence[_Row], config: BenchConfig, rounds: StageFn | None = None) -> list[BenchResult]:
    """Warm up and time prepared ``rows`` (see the module docstring), one result per row, in order.

    Several rows are timed interleaved, in rounds (:func:`time_rounds`), their progress reported to
    ``rounds`` as ``rounds`` and ``generate rounds``, each row's untimed generation as its own ``generate
    warmup``. A single row is timed alone, its progress reported as its own ``runs`` and ``generate``
    stages. Memory is measured per row over its warmup forwards (or one untimed forward after the rounds)."""
    single = len(rows) == 1
    if not single and rounds is None:
        raise ValueError("interleaved rows need a progress callback for their rounds")

    def report(own: str, together: str, done: int, total: int) -> None:
        if single:
            rows[0].report(own, done, total)
        elif rounds is not None:
            rounds(together, done, total)

    if config.warmup:
        for row in rows:
            row.measure_memory(config.warmup, lambda i, row=row: row.report("warmup", i, config.warmup))
    report("runs", "rounds", 0, config.runs)
    times = time_rounds([r.forward for r in rows], config.runs, [r.clock for r in rows],
                        lambda i: report("runs", "rounds", i, config.runs))
    if not config.warmup:
        for row in rows:
            row.measure_memory(1, lambda i, row=row: row.report("memory", i, 1))
    generating = [k for k, row in enumerate(rows) if row.generates]
    gen_times: dict[int, list[float]] = {}
    if generating:
        for k in generating:
            if single:
                rows[k].report("generate", 0, config.gen_runs)
            else:
                rows[k].report("generate warmup", 0, 1)
            rows[k].probe_generation()
            if not single:
                rows[k].report("generate warmup", 1, 1)
        report("generate", "generate rounds", 0, config.gen_runs)
        timed = time_rounds([rows[k].generate for k in generating], config.gen_runs,
                            [rows[k].clock for k in generating],
                            lambda i: report("generate", "generate rounds", i, config.gen_runs))
        gen_times = dict(zip(generating, timed))
    return [row.result(times[k], row.generation(gen_times.get(k), config.batch_size)) for k, row in enumerate(rows)]


def bench_model(model: nn.Module, config: BenchConfig, name: str | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> BenchResult:
    """Benchmark a loaded model alone (moved in place to ``config.device`` / ``config.dtype`` if given).

    ``progress(stage, done, total)`` is called as the stages advance (a :meth:`headcut.progress.Reporter.stages`
    shows them as tasks). Bad settings and forwards that fail on the synthetic inputs raise a one-line
    :class:`HeadcutError`. Several models: :func:`bench` times them interleaved."""
    config.validate()
    label = name or type(model).__name__.removeprefix("Headcut")
    with _threads(config):
        row = _TorchRow(model, config, label, progress or _silent)
        (result,) = _measure([row], config)
    return result


def compare(results: list[BenchResult], *, paired: bool = False) -> list[BenchResult]:
    """Fill ``speedup`` and ``flop_ratio`` (and generation speed-ups) relative to the first result; a
    single model has no baseline, so they stay None. ``paired``: the results were timed interleaved (run
    ``r`` of every result in the same round), so each result after the first also gets the interval of its
    per-round speed-ups and its ``within_noise`` verdict (:func:`paired_speedup`)."""
    if len(results) < 2:
        return results
    first = results[0]
    for k, r in enumerate(results):
        r.speedup = first.median_ms / r.median_ms if r.median_ms > 0 else None
        r.flop_ratio = first.flops / r.flops if r.flops > 0 else None
        gen, base = r.generation, first.generation
        if gen is not None and base is not None and base.tokens_per_s > 0:
            gen.speedup = gen.tokens_per_s / base.tokens_per_s
        if not paired or k == 0:
            continue
        interval = paired_speedup(first.runs_ms, r.runs_ms)
        if interval is not None:
            r.speedup_p25, r.speedup_p75, r.within_noise = interval
        if gen is not None and base is not None and base.new_tokens > 0:
            interval = paired_speedup(base.runs_ms, gen.runs_ms, gen.new_tokens / base.new_tokens)
            if interval is not None:
                gen.speedup_p25, gen.speedup_p75, gen.within_noise = interval
    return results


def _onnx_dtype_note(model: nn.Module, dtype: str) -> list[str]:
    torch_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return [] if torch_dtype == dtype else [f"onnxruntime runs the {dtype} ONNX graph; PyTorch ran {torch_dtype}"]


def _onnx_cache(presents: dict[str, Any]) -> dict[str, int | None]:
    positions = int(next(iter(presents.values())).shape[2]) if presents else 0
    return {"bytes": int(sum(v.nbytes for v in presents.values())), "positions": positions,
            "cross_bytes": None, "cross_positions": None}


def bench_onnx_generation(runner: Any, inputs: dict[str, torch.Tensor], config: BenchConfig,
                          step: Callable[[int], None] | None = None) -> GenerationResult:
    """Time greedy generation of ``config.gen_tokens`` tokens through an exported graph's KV cache (one graph
    alone: one untimed call, then ``config.gen_runs`` timed ones)."""
    ids, mask = inputs["input_ids"].cpu().numpy(), inputs["attention_mask"].cpu().numpy()
    tokens, presents = runner.generate(ids, mask, config.gen_tokens)
    times = time_calls(lambda: runner.generate(ids, mask, config.gen_tokens), config.gen_runs, torch.device("cpu"),
                       step)
    return _generation_result(int(tokens.shape[1]), times, config.batch_size, _onnx_cache(presents))


class _OnnxRow(_Row):
    """An exported graph in an onnxruntime session, with the inputs and FLOPs of its PyTorch model."""

    def __init__(self, model: nn.Module, onnx_file: str | Path, config: BenchConfig, label: str, report: StageFn,
                 flops: tuple[int, dict[str, int]] | None = None, note: str | None = None) -> None:
        from ..outputs.formats.onnx import OnnxRunner

        super().__init__()
        self.model, self.config, self.label = model, config, label
        self.report = lambda stage, done, total: report(f"onnxruntime {stage}", done, total)
        self.path = Path(onnx_file)
        self.threads = config.threads or torch.get_num_threads()
        self.runner = OnnxRunner(self.path, device=config.device, threads=self.threads)
        self.clock = torch.device("cpu")  # a run blocks until its outputs are ready, on CUDA too
        self.generates = bool(config.gen_tokens) and self.runner.decoder
        _check_positions(model, config, self.generates)
        self.inputs = make_inputs(model, replace(config, device="cpu"))
        if flops is None:
            where = next(model.parameters()).device
            self.report("flops", 0, 1)
            flops = count_flops(model, {k: v.to(where) for k, v in self.inputs.items()})
            self.report("flops", 1, 1)
        self.flops = flops
        self.feeds = self.runner.feeds(self.inputs)
        self.call = self.runner.prepare(self.feeds)
        self.notes = ([note] if note else []) + _onnx_dtype_note(model, self.runner.dtype)

    def forward(self) -> Any:
        try:
            return self.call()
        except Exception as exc:  # onnxruntime's own exception types
            raise HeadcutError(f"{self.label}: onnxruntime fails on inputs {_describe(self.inputs)}: "
                               f"{first_line(exc)}") from None

    def measure_memory(self, calls: int, step: Callable[[int], None]) -> None:
        if self.config.device.startswith("cuda"):  # onnxruntime's device memory is not torch's to read
            time_calls(self.forward, calls, self.clock, step)
            self.peak, self.kind = None, "unavailable"
            return
        super().measure_memory(calls, step)

    def _generate_once(self) -> Any:
        ids = self.inputs["input_ids"].numpy()
        mask = self.inputs["attention_mask"].numpy()
        try:
            return self.runner.generate(ids, mask, self.config.gen_tokens)
        except HeadcutError:
            raise
        except Exception as exc:
            raise HeadcutError(f"{self.label}: generation in onnxruntime fails: {first_line(exc)}") from None

    def generate(self) -> Any:
        return self._generate_once()

    def probe_generation(self) -> None:
        tokens, presents = self._generate_once()
        self.new_tokens = int(tokens.shape[1])
        self.cache = _onnx_cache(presents)

    def result(self, times: list[float], generation: GenerationResult | None) -> BenchResult:
        model, config = self.model, self.config
        heads, kv_heads = _heads(model)
        files = [self.path] + [f for f in (self.path.with_name(self.path.name + ".data"),) if f.is_file()]
        return BenchResult(
            name=self.label, architecture=type(model).__name__.removeprefix("Headcut"),
            model_type=str(getattr(model.config, "model_type", "")), dtype=self.runner.dtype,
            attn_implementation=None, device=config.device, threads=self.threads,
            inputs={k: list(v.shape) for k, v in self.feeds.items() if not k.startswith("past_key_values.")},
            heads=heads, kv_heads=kv_heads, params=count_params(model),
            weights_bytes=sum(f.stat().st_size for f in files), flops=self.flops[0], flops_by_op=self.flops[1],
            **_latency(times, config, "input_ids" in self.inputs),
            peak_memory_bytes=self.peak, peak_memory_kind=self.kind, generation=generation, notes=list(self.notes),
            runtime="onnxruntime",
        )


def bench_onnx(model: nn.Module, onnx_file: str | Path, config: BenchConfig, name: str | None = None,
               progress: Callable[[str, int, int], None] | None = None,
               flops: tuple[int, dict[str, int]] | None = None) -> BenchResult:
    """Benchmark ``onnx_file`` (an export of ``model``) alone in onnxruntime, like :func:`bench_model` does
    PyTorch: same inputs and statistics. ``model`` gives the inputs, FLOPs (unless ``flops`` is given),
    parameters and heads; ``progress(stage, done, total)`` reports the ``onnxruntime ...`` stages."""
    config.validate()
    label = name or type(model).__name__.removeprefix("Headcut")
    with _threads(config):
        row = _OnnxRow(model, onnx_file, config, label, progress or _silent, flops)
        (result,) = _measure([row], config)
    return result


def _onnx_for(item: Any, model: nn.Module, stack: contextlib.ExitStack,
              progress: Callable[[str, int, int], None]) -> tuple[Path, str | None]:
    """The ``model.onnx`` of a checkpoint folder, or an export into a temporary folder (and a note)."""
    from ..outputs.formats.onnx import ONNX_FILE, export_onnx

    folder = Path(item).expanduser() if isinstance(item, (str, os.PathLike)) else None
    if folder is not None and (folder / ONNX_FILE).is_file():
        return folder / ONNX_FILE, None
    tmp = stack.enter_context(scratch_folder("onnx"))
    progress("onnx export", 0, 1)
    exported = export_onnx(model, tmp)
    progress("onnx export", 1, 1)
    where = f"no {ONNX_FILE} in the folder" if folder is not None and folder.is_dir() else "no ONNX file"
    check = f"; max abs difference from PyTorch {exported.parity:.1e}" if exported.parity is not None else ""
    return tmp / ONNX_FILE, (f"{where}: exported one to a temporary folder for onnxruntime "
                             f"({exported.seconds:.1f} s{check})")


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
    stages."""
    from ..model import loading as io
    from ..arguments import bench_config, bench_models, values

    bench_models(models, names)
    bench_config("config", config)
    with values():
        config.validate()
        runtimes = config.runtimes()

    def rounds(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(-1, ALL_MODELS, stage, done, total)

    results: list[BenchResult] = []
    rows: list[_Row] = []
    with contextlib.ExitStack() as stack, _threads(config):
        for i, item in enumerate(models):
            name = names[i] if names is not None else (
                os.fspath(item) if isinstance(item, (str, os.PathLike)) else type(item).__name__.removeprefix("Headcut"))

            def step(stage: str, done: int, total: int, i: int = i, name: str = name) -> None:
                if progress is not None:
                    progress(i, name, stage, done, total)

            if isinstance(item, nn.Module):
                model = item
            else:
                step("load", 0, 1)
                model = io.load(item, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                                dtype=config.dtype, device=config.device,
                                attn_implementation=config.attn_implementation)
                step("load", 1, 1)
            with contextlib.ExitStack() as own:  # back to back: a temporary export lives as long as its model
                keep = stack if config.interleave else own
                torch_row = None
                if "torch" in runtimes:
                    torch_row = _TorchRow(model, config, name, step)
                    rows.append(torch_row)
                    if not config.interleave:
                        results += _measure(rows, config)
                        rows.clear()
                if "onnxruntime" in runtimes:
                    onnx_file, note = _onnx_for(item, model, keep, step)
                    flops = torch_row.flops if torch_row is not None else None
                    rows.append(_OnnxRow(model, onnx_file, config, name, step, flops, note))
                    if not config.interleave:
                        results += _measure(rows, config)
                        rows.clear()
            del torch_row, model
            if not config.interleave and not isinstance(item, nn.Module):
                gc.collect()
                if config.device.startswith("cuda"):
                    torch.cuda.empty_cache()
        if rows:
            results = _measure(rows, config, rounds)
            rows.clear()
    return compare(results, paired=config.interleave)


def device_name(device: str) -> str:
    """A readable name of the device (GPU model, or the CPU model from /proc/cpuinfo)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def report_json(results: list[BenchResult], config: BenchConfig) -> dict[str, Any]:
    """The ``--json`` document: settings, environment, the schedule (``interleaved``: in rounds, the order
    rotated each round; ``back to back``: one model after the other) and one entry per model."""
    from .. import __version__

    return {
        "config": config.to_json(),
        "schedule": "interleaved" if config.interleave else "back to back",
        "device": config.device,
        "device_name": device_name(config.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "headcut": __version__,
        "warnings": config.validate(),
        "models": [r.to_json() for r in results],
    }


__all__ = [
    "ALL_MODELS", "DTYPES", "BenchResult", "GenerationResult", "bench",
    "bench_generation", "bench_model", "bench_onnx", "bench_onnx_generation", "compare", "count_flops", "device_name", "kv_cache_size",
    "make_inputs", "paired_speedup", "percentile", "report_json", "round_order", "time_calls", "time_rounds",
]
