"""``headcut bench``: measure what removing heads buys, on synthetic inputs.

Every number is measured on the model as it is, none is estimated from its shape:

* **latency**: ``warmup`` untimed forwards, then ``runs`` timed forwards of one batch
  (``batch_size`` x ``seq_len`` tokens, or ``batch_size`` images) under ``torch.inference_mode``.
  On CPU each forward is timed with ``time.perf_counter``; on CUDA with a pair of
  ``torch.cuda.Event(enable_timing=True)`` recorded after ``torch.cuda.synchronize()`` (the device is
  idle when each run starts; kernel launch time counts). Reported: median and 90th percentile (linear
  interpolation) in milliseconds, and every run.
* **throughput**: ``examples_per_s = batch_size / median`` and, for text inputs,
  ``tokens_per_s = batch_size * seq_len / median`` (encoder tokens for encoder-decoder models).
* **speed-up** and **FLOP ratio**: the first model's median latency (FLOPs) divided by this model's,
  so both read the same way and are 1.0 for the first model: a speed-up of 1.25 means 1.25x faster,
  a FLOP ratio of 1.25 means 20 % fewer FLOPs per forward. Generation speed-up: this model's
  generation tokens/s divided by the first model's.
* **FLOPs**: one forward of the whole batch counted by ``torch.utils.flop_counter.FlopCounterMode``:
  matrix multiplications (linear layers, attention scores and values, the output head) and fused
  attention kernels, 2 FLOPs per multiply-add; element-wise work (softmax, norms, activations) is not
  counted. CPU's fused attention kernel, which PyTorch's counter does not know, is counted with
  PyTorch's own attention formula, so eager and sdpa attention give the same count.
* **memory**: on CUDA ``torch.cuda.max_memory_allocated`` over the warmup and timed forwards (after
  ``reset_peak_memory_stats``): weights, inputs and activations (``peak_memory_kind``
  ``cuda_max_memory_allocated``). On Linux CPUs the peak resident set size (``VmHWM``, reset by
  writing 5 to ``/proc/self/clear_refs``) during those forwards minus the resident size just before
  them, after returning freed heap memory to the system: what the forwards add on top of the loaded
  model (``cpu_peak_rss_increase``; weights are reported apart as ``weights_bytes``). Elsewhere
  ``null`` (``unavailable``).
* **generation** (models with ``can_generate()``): cached greedy decoding of exactly ``gen_tokens``
  new tokens (``min_new_tokens = max_new_tokens``, no sampling, one beam) from the same prompt; one
  untimed call, then ``gen_runs`` timed calls. ``tokens_per_s = batch_size * new tokens / median``;
  the time includes the prompt's prefill. The KV cache is the ``past_key_values`` the untimed call
  returns: the bytes of the distinct tensor storages it holds, divided by ``batch_size`` and the number
  of cached positions (``get_seq_length()``: prompt plus new tokens minus one for decoders, new tokens
  for encoder-decoder decoders). Encoder-decoder models report their cross-attention cache apart
  (per encoder position).

**runtimes** (``runtime``: ``torch``, ``onnxruntime`` or both): each model gets one row per runtime, in
the same table and with the same statistics, inputs and baseline (the first row). An ``onnxruntime`` row
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
import tempfile
import time
from collections.abc import Callable, Sequence
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

#: ``--dtype`` values
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: ``--attn`` values (transformers attention implementations)

#: a progress callback: (model index, model name, stage, steps done, steps in the stage)
ProgressFn = Callable[[int, str, str, int, int], None]


@dataclass
class GenerationResult:
    """Cached greedy generation of one model (see the module docstring)."""

    new_tokens: int
    runs_ms: list[float]
    median_ms: float
    tokens_per_s: float
    kv_cache_bytes: int
    kv_cache_positions: int
    kv_bytes_per_token: float
    cross_kv_cache_bytes: int | None = None
    cross_kv_cache_positions: int | None = None
    cross_kv_bytes_per_token: float | None = None
    speedup: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchResult:
    """Everything measured for one model; ``speedup``/``flop_ratio`` are filled by :func:`bench`."""

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
    examples_per_s: float
    tokens_per_s: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str
    generation: GenerationResult | None = None
    speedup: float | None = None
    flop_ratio: float | None = None
    notes: list[str] = field(default_factory=list)
    runtime: str = "torch"

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


def time_calls(fn: Callable[[], Any], runs: int, device: torch.device,
               step: Callable[[int], None] | None = None) -> list[float]:
    """Milliseconds of ``runs`` calls of ``fn`` (CUDA events on CUDA, perf_counter on CPU)."""
    times: list[float] = []
    for i in range(runs):
        if device.type == "cuda":
            with torch.cuda.device(device):  # events record on the current device's stream
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000.0)
        if step is not None:
            step(i + 1)
    return times


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


def bench_generation(model: nn.Module, inputs: dict[str, torch.Tensor], config: BenchConfig,
                     step: Callable[[int], None] | None = None) -> GenerationResult:
    """Time cached greedy generation of ``config.gen_tokens`` tokens and measure its KV cache."""
    device = torch.device(config.device)
    prompt = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    out = _generate(model, prompt, config.gen_tokens, return_dict_in_generate=True)
    if getattr(model.config, "is_encoder_decoder", False):
        new_tokens = out.sequences.shape[1] - 1  # decoder outputs start with the decoder start token
    else:
        new_tokens = out.sequences.shape[1] - prompt["input_ids"].shape[1]  # decoder-only outputs repeat the prompt
    size = kv_cache_size(returned_cache(out))
    del out
    times = time_calls(lambda: _generate(model, prompt, config.gen_tokens), config.gen_runs, device, step)
    median = statistics.median(times)
    b = config.batch_size
    positions = int(size["positions"] or 0)
    result = GenerationResult(
        new_tokens=int(new_tokens), runs_ms=times, median_ms=median,
        tokens_per_s=b * new_tokens / (median / 1000.0),
        kv_cache_bytes=int(size["bytes"] or 0), kv_cache_positions=positions,
        kv_bytes_per_token=(size["bytes"] or 0) / (b * positions) if positions else 0.0,
    )
    if size["cross_bytes"] is not None:
        cross_positions = int(size["cross_positions"] or 0)
        result.cross_kv_cache_bytes = int(size["cross_bytes"])
        result.cross_kv_cache_positions = cross_positions
        result.cross_kv_bytes_per_token = size["cross_bytes"] / (b * cross_positions) if cross_positions else 0.0
    return result


def _heads(model: nn.Module) -> tuple[int | None, int | None]:
    from ..adapters import adapter_for

    try:
        blocks = adapter_for(model).blocks(model.base_model)
    except HeadcutError:
        return None, None
    return sum(b.heads for b in blocks), sum(b.kv_heads for b in blocks)


def bench_model(model: nn.Module, config: BenchConfig, name: str | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> BenchResult:
    """Benchmark a loaded model (moved in place to ``config.device`` / ``config.dtype`` if given).

    ``progress(stage, done, total)`` is called as the stages advance (a :meth:`headcut.progress.Reporter.stages`
    shows them as tasks). Bad settings and forwards that fail on the synthetic inputs raise a one-line
    :class:`HeadcutError`."""
    config.validate()
    notes: list[str] = []
    device = torch.device(config.device)
    model.to(device=device, dtype=DTYPES[config.dtype] if config.dtype else None)
    if config.attn_implementation:
        model.set_attn_implementation(config.attn_implementation)
    model.eval()
    label = name or type(model).__name__.removeprefix("Headcut")

    def report(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(stage, done, total)

    generates = bool(config.gen_tokens) and bool(getattr(model, "can_generate", lambda: False)())
    _check_positions(model, config, generates)
    inputs = make_inputs(model, config)
    old_threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        report("flops", 0, 1)
        try:
            flops, by_op = count_flops(model, inputs)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            raise HeadcutError(
                f"{label}: the forward fails on inputs {_describe(inputs)}: {first_line(exc)}"
            ) from None
        report("flops", 1, 1)

        def forward() -> Any:
            with torch.inference_mode():
                return model(**inputs)

        rss = _RssPeak()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            kind = "cuda_max_memory_allocated"
        else:
            rss.start()
            kind = rss.kind if rss.before is not None else "unavailable"
        time_calls(forward, config.warmup, device, lambda i: report("warmup", i, config.warmup))
        times = time_calls(forward, config.runs, device, lambda i: report("runs", i, config.runs))
        if device.type == "cuda":
            peak: int | None = int(torch.cuda.max_memory_allocated(device))
        else:
            peak = rss.stop()
            if peak is None:
                kind = "unavailable"
        generation = None
        if generates:
            report("generate", 0, config.gen_runs)
            try:
                generation = bench_generation(model, inputs, config,
                                              lambda i: report("generate", i, config.gen_runs))
            except (RuntimeError, ValueError, IndexError) as exc:
                raise HeadcutError(f"{label}: generation fails: {first_line(exc)}") from None
            if generation.new_tokens != config.gen_tokens:
                notes.append(f"generation produced {generation.new_tokens} tokens, not {config.gen_tokens}")
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
    median = statistics.median(times)
    b = config.batch_size
    heads, kv_heads = _heads(model)
    text = "input_ids" in inputs
    return BenchResult(
        name=label,
        architecture=type(model).__name__.removeprefix("Headcut"),
        model_type=str(getattr(model.config, "model_type", "")),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        device=str(device),
        threads=threads,
        inputs={k: list(v.shape) for k, v in inputs.items()},
        heads=heads,
        kv_heads=kv_heads,
        params=count_params(model),
        weights_bytes=weights_bytes(model),
        flops=flops,
        flops_by_op=by_op,
        runs_ms=times,
        median_ms=median,
        p90_ms=percentile(times, 90),
        examples_per_s=b / (median / 1000.0),
        tokens_per_s=b * config.seq_len / (median / 1000.0) if text else None,
        peak_memory_bytes=peak,
        peak_memory_kind=kind,
        generation=generation,
        notes=notes,
    )


def compare(results: list[BenchResult]) -> list[BenchResult]:
    """Fill ``speedup`` and ``flop_ratio`` (and generation speed-ups) relative to the first result; a
    single model has no baseline, so they stay None."""
    if len(results) < 2:
        return results
    first = results[0]
    for r in results:
        r.speedup = first.median_ms / r.median_ms if r.median_ms > 0 else None
        r.flop_ratio = first.flops / r.flops if r.flops > 0 else None
        if r.generation is not None and first.generation is not None and first.generation.tokens_per_s > 0:
            r.generation.speedup = r.generation.tokens_per_s / first.generation.tokens_per_s
    return results


def _onnx_dtype_note(model: nn.Module, dtype: str) -> list[str]:
    torch_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return [] if torch_dtype == dtype else [f"onnxruntime runs the {dtype} ONNX graph; PyTorch ran {torch_dtype}"]


def bench_onnx_generation(runner: Any, inputs: dict[str, torch.Tensor], config: BenchConfig,
                          step: Callable[[int], None] | None = None) -> GenerationResult:
    """Time greedy generation of ``config.gen_tokens`` tokens through an exported graph's KV cache."""
    ids, mask = inputs["input_ids"].cpu().numpy(), inputs["attention_mask"].cpu().numpy()
    tokens, presents = runner.generate(ids, mask, config.gen_tokens)
    positions = int(next(iter(presents.values())).shape[2]) if presents else 0
    cache_bytes = int(sum(v.nbytes for v in presents.values()))
    times = time_calls(lambda: runner.generate(ids, mask, config.gen_tokens), config.gen_runs, torch.device("cpu"),
                       step)
    median = statistics.median(times)
    b = config.batch_size
    new_tokens = int(tokens.shape[1])
    return GenerationResult(
        new_tokens=new_tokens, runs_ms=times, median_ms=median, tokens_per_s=b * new_tokens / (median / 1000.0),
        kv_cache_bytes=cache_bytes, kv_cache_positions=positions,
        kv_bytes_per_token=cache_bytes / (b * positions) if positions else 0.0,
    )


def bench_onnx(model: nn.Module, onnx_file: str | Path, config: BenchConfig, name: str | None = None,
               progress: Callable[[str, int, int], None] | None = None,
               flops: tuple[int, dict[str, int]] | None = None) -> BenchResult:
    """Benchmark ``onnx_file`` (an export of ``model``) in onnxruntime, like :func:`bench_model` does
    PyTorch: same inputs and statistics. ``model`` gives the inputs, FLOPs (unless ``flops`` is given),
    parameters and heads; ``progress(stage, done, total)`` reports the ``onnxruntime ...`` stages."""
    from ..outputs.formats.onnx import OnnxRunner

    config.validate()
    label = name or type(model).__name__.removeprefix("Headcut")

    def report(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(f"onnxruntime {stage}", done, total)

    path = Path(onnx_file)
    threads = config.threads or torch.get_num_threads()
    runner = OnnxRunner(path, device=config.device, threads=threads)
    generates = bool(config.gen_tokens) and runner.decoder
    _check_positions(model, config, generates)
    inputs = make_inputs(model, replace(config, device="cpu"))
    if flops is None:
        where = next(model.parameters()).device
        report("flops", 0, 1)
        flops = count_flops(model, {k: v.to(where) for k, v in inputs.items()})
        report("flops", 1, 1)
    feeds = runner.feeds(inputs)
    call = runner.prepare(feeds)

    def forward() -> Any:
        try:
            return call()
        except Exception as exc:  # onnxruntime's own exception types
            raise HeadcutError(f"{label}: onnxruntime fails on inputs {_describe(inputs)}: {first_line(exc)}") \
                from None

    rss = _RssPeak()
    kind = "unavailable"
    if not config.device.startswith("cuda"):
        rss.start()
        kind = rss.kind if rss.before is not None else "unavailable"
    cpu = torch.device("cpu")  # a run blocks until its outputs are ready, on CUDA too
    time_calls(forward, config.warmup, cpu, lambda i: report("warmup", i, config.warmup))
    times = time_calls(forward, config.runs, cpu, lambda i: report("runs", i, config.runs))
    peak = None if config.device.startswith("cuda") else rss.stop()
    if peak is None:
        kind = "unavailable"
    notes = _onnx_dtype_note(model, runner.dtype)
    generation = None
    if generates:
        report("generate", 0, config.gen_runs)
        try:
            generation = bench_onnx_generation(runner, inputs, config, lambda i: report("generate", i, config.gen_runs))
        except HeadcutError:
            raise
        except Exception as exc:
            raise HeadcutError(f"{label}: generation in onnxruntime fails: {first_line(exc)}") from None
    median = statistics.median(times)
    b = config.batch_size
    heads, kv_heads = _heads(model)
    files = [path] + [f for f in (path.with_name(path.name + ".data"),) if f.is_file()]
    return BenchResult(
        name=label, architecture=type(model).__name__.removeprefix("Headcut"),
        model_type=str(getattr(model.config, "model_type", "")), dtype=runner.dtype, attn_implementation=None,
        device=config.device, threads=threads,
        inputs={k: list(v.shape) for k, v in feeds.items() if not k.startswith("past_key_values.")},
        heads=heads, kv_heads=kv_heads, params=count_params(model), weights_bytes=sum(f.stat().st_size for f in files),
        flops=flops[0], flops_by_op=flops[1], runs_ms=times, median_ms=median, p90_ms=percentile(times, 90),
        examples_per_s=b / (median / 1000.0),
        tokens_per_s=b * config.seq_len / (median / 1000.0) if "input_ids" in inputs else None,
        peak_memory_bytes=peak, peak_memory_kind=kind, generation=generation, notes=notes, runtime="onnxruntime",
    )


def _onnx_for(item: Any, model: nn.Module, stack: contextlib.ExitStack,
              progress: Callable[[str, int, int], None]) -> tuple[Path, str | None]:
    """The ``model.onnx`` of a checkpoint folder, or an export into a temporary folder (and a note)."""
    from ..outputs.formats.onnx import ONNX_FILE, export_onnx

    folder = Path(item).expanduser() if isinstance(item, (str, os.PathLike)) else None
    if folder is not None and (folder / ONNX_FILE).is_file():
        return folder / ONNX_FILE, None
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="headcut-onnx-")))
    progress("onnx export", 0, 1)
    exported = export_onnx(model, tmp)
    progress("onnx export", 1, 1)
    where = f"no {ONNX_FILE} in the folder" if folder is not None and folder.is_dir() else "no ONNX file"
    check = f"; max abs difference from PyTorch {exported.parity:.1e}" if exported.parity is not None else ""
    return tmp / ONNX_FILE, (f"{where}: exported one to a temporary folder for onnxruntime "
                             f"({exported.seconds:.1f} s{check})")


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
    """Benchmark checkpoints (loaded one at a time with :func:`headcut.model.loading.load`) or loaded models, in
    each runtime of ``config.runtime`` (one result per model and runtime, in that order).

    Speed-up and FLOP ratio are relative to the first result. ``progress(index, name, stage, done,
    total)`` reports each stage (``load``, ``flops``, ``warmup``, ``runs``, ``generate``; ``onnx export``
    and ``onnxruntime ...`` for onnxruntime)."""
    from ..model import loading as io
    from ..arguments import bench_config, bench_models, values

    bench_models(models, names)
    bench_config("config", config)
    with values():
        config.validate()
        runtimes = config.runtimes()
    results: list[BenchResult] = []
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
        measured = None
        if "torch" in runtimes:
            measured = bench_model(model, config, name=name, progress=step)
            results.append(measured)
        if "onnxruntime" in runtimes:
            with contextlib.ExitStack() as stack:
                onnx_file, note = _onnx_for(item, model, stack, step)
                flops = (measured.flops, measured.flops_by_op) if measured is not None else None
                result = bench_onnx(model, onnx_file, config, name=name, progress=step, flops=flops)
                result.notes[:0] = [note] if note else []
            results.append(result)
        if not isinstance(item, nn.Module):
            del model
            gc.collect()
            if config.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return compare(results)


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
    """The ``--json`` document: settings, environment and one entry per model."""
    from .. import __version__

    return {
        "config": config.to_json(),
        "device": config.device,
        "device_name": device_name(config.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "headcut": __version__,
        "warnings": config.validate(),
        "models": [r.to_json() for r in results],
    }


__all__ = [
    "DTYPES", "BenchResult", "GenerationResult", "bench",
    "bench_generation", "bench_model", "bench_onnx", "bench_onnx_generation", "compare", "count_flops", "device_name", "kv_cache_size",
    "make_inputs", "percentile", "report_json", "time_calls",
]
