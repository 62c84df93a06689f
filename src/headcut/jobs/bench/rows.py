"""The timing of PyTorch rows: a model prepared for timing (inputs made, FLOPs counted), its warmup,
timed forwards and generation, and the measurement of prepared rows alone or interleaved in rounds (see
:mod:`headcut.jobs.bench.run`)."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ...adapters import adapter_for
from ...adapters.runtime import returned_cache
from ...config import BenchConfig
from ...errors import HeadcutError, first_line
from ...model.inputs import check_positions, describe_inputs, make_inputs, special_ids
from ...model.measure import (
    RssPeak,
    count_flops,
    kv_cache_size,
    storages_bytes,
    time_calls,
    time_rounds,
)
from ...model.surgery import count_params, weights_bytes
from ...stats import percentile
from .results import BenchResult, GenerationResult

#: ``--dtype`` values
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _generate(model: nn.Module, inputs: dict[str, torch.Tensor], tokens: int, **extra: Any) -> Any:
    special = special_ids(model)
    pad = (special["pad_token_id"] or special["eos_token_id"] or [0])[0]
    with torch.inference_mode():
        return model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            num_beams=1,
            use_cache=True,
            pad_token_id=pad,
            **extra,
        )


def latency(times: list[float], config: BenchConfig, text: bool) -> dict[str, Any]:
    """The latency and throughput fields of a :class:`BenchResult` from its runs."""
    median = statistics.median(times)
    b = config.batch_size
    return dict(
        runs_ms=times,
        median_ms=median,
        p90_ms=percentile(times, 90),
        p25_ms=percentile(times, 25),
        p75_ms=percentile(times, 75),
        examples_per_s=b / (median / 1000.0),
        tokens_per_s=b * config.seq_len / (median / 1000.0) if text else None,
    )


def generation_result(
    new_tokens: int,
    times: list[float],
    batch: int,
    size: dict[str, int | None],
    weights: int | None = None,
    prefill_included: bool = True,
) -> GenerationResult:
    """A :class:`GenerationResult` from the timed calls and the cache size of :func:`kv_cache_size`'s form;
    ``weights``: the bytes of weights one decoding step reads (for ``bytes_per_token``)."""
    median = statistics.median(times)
    positions = int(size["positions"] or 0)
    cache_bytes = int(size["bytes"] or 0)
    per_position = cache_bytes / (batch * positions) if positions else 0.0
    mean_cached = max(positions - new_tokens / 2, 0.0)
    result = GenerationResult(
        new_tokens=int(new_tokens),
        runs_ms=times,
        median_ms=median,
        p25_ms=percentile(times, 25),
        p75_ms=percentile(times, 75),
        tokens_per_s=batch * new_tokens / (median / 1000.0),
        kv_cache_bytes=cache_bytes,
        kv_cache_positions=positions,
        kv_bytes_per_token=per_position,
        prefill_included=prefill_included,
        bytes_per_token=(weights + batch * per_position * mean_cached) / batch if weights and new_tokens else None,
    )
    if size.get("cross_bytes") is not None:
        cross_bytes, cross_positions = int(size["cross_bytes"] or 0), int(size.get("cross_positions") or 0)
        result.cross_kv_cache_bytes = cross_bytes
        result.cross_kv_cache_positions = cross_positions
        result.cross_kv_bytes_per_token = cross_bytes / (batch * cross_positions) if cross_positions else 0.0
    return result


def _probe_generation(
    model: nn.Module, prompt: dict[str, torch.Tensor], tokens: int
) -> tuple[int, dict[str, int | None]]:
    """The untimed generation call: the new tokens it made and the size of the KV cache it returned."""
    out = _generate(model, prompt, tokens, return_dict_in_generate=True)
    if getattr(model.config, "is_encoder_decoder", False):
        new_tokens = out.sequences.shape[1] - 1  # decoder outputs start with the decoder start token
    else:
        new_tokens = out.sequences.shape[1] - prompt["input_ids"].shape[1]  # decoder-only outputs repeat the prompt
    size = kv_cache_size(returned_cache(out))
    del out
    return int(new_tokens), size


def head_counts(model: nn.Module) -> tuple[int | None, int | None]:
    try:
        blocks = adapter_for(model).blocks(model.base_model)
    except HeadcutError:
        return None, None
    return sum(b.heads for b in blocks), sum(b.kv_heads for b in blocks)


#: a stage callback: (stage, steps done, steps in the stage)
StageFn = Callable[[str, int, int], None]


def silent(stage: str, done: int, total: int) -> None:
    return None


@contextlib.contextmanager
def torch_threads(config: BenchConfig) -> Iterator[None]:
    """``config.threads`` CPU threads for torch inside the block; torch's own number restored after it."""
    old = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class Row:
    """One model in one runtime, prepared for timing (inputs made, FLOPs counted): what :func:`measure` needs
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
        """Run ``calls`` untimed forwards and measure the peak memory they take (see :mod:`headcut.jobs.bench.run`)."""
        if self.clock.type == "cuda":
            self._cuda_memory(calls, step)
            return
        rss = RssPeak()
        rss.start()
        time_calls(self.forward, calls, self.clock, step)
        self.peak = rss.stop()
        self.kind = rss.kind if self.peak is not None else "unavailable"

    #: the bytes of weights one decoding step reads (None: not known)
    weights_read: int | None = None
    #: whether a timed generation includes the prompt's prefill
    prefill_included = True

    def generation(self, times: list[float] | None, batch: int) -> GenerationResult | None:
        if times is None:
            return None
        return generation_result(
            self.new_tokens, times, batch, self.cache, self.weights_read, prefill_included=self.prefill_included
        )


class TorchRow(Row):
    """A model in PyTorch: moved to the device and dtype, attention set, inputs made, FLOPs counted."""

    def __init__(self, model: nn.Module, config: BenchConfig, label: str, report: StageFn) -> None:
        super().__init__()
        self.model, self.config, self.label, self.report = model, config, label, report
        self.clock = torch.device(config.device)
        model.to(device=self.clock, dtype=DTYPES[config.dtype] if config.dtype else None)
        self.weights_read = weights_bytes(model)
        if config.attn_implementation:
            model.set_attn_implementation(config.attn_implementation)
        model.eval()
        self.generates = bool(config.gen_tokens) and bool(getattr(model, "can_generate", lambda: False)())
        check_positions(model, config, self.generates)
        self.inputs = make_inputs(model, config)
        self.prompt = {k: v for k, v in self.inputs.items() if k in ("input_ids", "attention_mask")}
        report("flops", 0, 1)
        try:
            self.flops = count_flops(model, self.inputs)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            raise HeadcutError(
                f"{label}: the forward fails on inputs {describe_inputs(self.inputs)}: {first_line(exc)}"
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
        own = weights_bytes(self.model) + storages_bytes(list(self.inputs.values()))
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
        heads, kv_heads = head_counts(model)
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
            **latency(times, config, "input_ids" in self.inputs),
            peak_memory_bytes=self.peak,
            peak_memory_kind=self.kind,
            generation=generation,
            notes=list(self.notes),
        )


def measure(rows: Sequence[Row], config: BenchConfig, rounds: StageFn | None = None) -> list[BenchResult]:
    """Warm up and time prepared ``rows`` (see :mod:`headcut.jobs.bench.run`), one result per row, in order.

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
            row.measure_memory(config.warmup, _reporter(row, "warmup", config.warmup))
    report("runs", "rounds", 0, config.runs)
    times = time_rounds(
        [r.forward for r in rows],
        config.runs,
        [r.clock for r in rows],
        lambda i: report("runs", "rounds", i, config.runs),
    )
    if not config.warmup:
        for row in rows:
            row.measure_memory(1, _reporter(row, "memory", 1))
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
        timed = time_rounds(
            [rows[k].generate for k in generating],
            config.gen_runs,
            [rows[k].clock for k in generating],
            lambda i: report("generate", "generate rounds", i, config.gen_runs),
        )
        gen_times = dict(zip(generating, timed))
    return [row.result(times[k], row.generation(gen_times.get(k), config.batch_size)) for k, row in enumerate(rows)]


def _reporter(row: Row, stage: str, total: int) -> Callable[[int], None]:
    """``row``'s progress callback for ``total`` calls of ``stage``."""
    return lambda i: row.report(stage, i, total)


def bench_model(
    model: nn.Module,
    config: BenchConfig,
    name: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> BenchResult:
    """Benchmark a loaded model alone (moved in place to ``config.device`` / ``config.dtype`` if given).

    ``progress(stage, done, total)`` is called as the stages advance (a :meth:`headcut.progress.Reporter.stages`
    shows them as tasks). Bad settings and forwards that fail on the synthetic inputs raise a one-line
    :class:`HeadcutError`. Several models: :func:`bench` times them interleaved."""
    config.validate()
    label = name or type(model).__name__.removeprefix("Headcut")
    with torch_threads(config):
        row = TorchRow(model, config, label, progress or silent)
        (result,) = measure([row], config)
    return result
