"""The timing of onnxruntime rows: an exported graph timed like a PyTorch row (same inputs and statistics),
and its greedy generation through the graph's KV cache (see :mod:`headcut.jobs.bench.run`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...config import BenchConfig
from ...errors import HeadcutError, first_line
from ...files.leftovers import scratch_folder
from ...model.inputs import check_positions, describe_inputs, make_inputs
from ...model.measure import count_flops, time_calls
from ...model.surgery import count_params
from ...outputs.formats.onnx import ONNX_FILE, OnnxRunner, export_onnx
from .results import BenchResult, GenerationResult
from .rows import (
    Row,
    StageFn,
    head_counts,
    latency,
    measure,
    silent,
    torch_threads,
)


def _onnx_dtype_note(model: nn.Module, dtype: str) -> list[str]:
    torch_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return [] if torch_dtype == dtype else [f"onnxruntime runs the {dtype} ONNX graph; PyTorch ran {torch_dtype}"]


def _onnx_cache(presents: dict[str, Any]) -> dict[str, int | None]:
    positions = int(next(iter(presents.values())).shape[2]) if presents else 0
    return {
        "bytes": int(sum(v.nbytes for v in presents.values())),
        "positions": positions,
        "cross_bytes": None,
        "cross_positions": None,
    }


class OnnxRow(Row):
    """An exported graph in an onnxruntime session, with the inputs and FLOPs of its PyTorch model."""

    def __init__(
        self,
        model: nn.Module,
        onnx_file: str | Path,
        config: BenchConfig,
        label: str,
        report: StageFn,
        flops: tuple[int, dict[str, int]] | None = None,
        note: str | None = None,
    ) -> None:
        super().__init__()
        self.model, self.config, self.label = model, config, label
        self.report = lambda stage, done, total: report(f"onnxruntime {stage}", done, total)
        self.path = Path(onnx_file)
        self.threads = config.threads or torch.get_num_threads()
        self.runner = OnnxRunner(self.path, device=config.device, threads=self.threads)
        self.clock = torch.device("cpu")  # a run blocks until its outputs are ready, on CUDA too
        self.generates = bool(config.gen_tokens) and self.runner.decoder
        check_positions(model, config, self.generates)
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
        self.weights_read = sum(f.stat().st_size for f in self._files())

    def _files(self) -> list[Path]:
        return [self.path] + [f for f in (self.path.with_name(self.path.name + ".data"),) if f.is_file()]

    def forward(self) -> Any:
        try:
            return self.call()
        except Exception as exc:  # onnxruntime's own exception types
            raise HeadcutError(
                f"{self.label}: onnxruntime fails on inputs {describe_inputs(self.inputs)}: {first_line(exc)}"
            ) from None

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
        heads, kv_heads = head_counts(model)
        files = self._files()
        return BenchResult(
            name=self.label,
            architecture=type(model).__name__.removeprefix("Headcut"),
            model_type=str(getattr(model.config, "model_type", "")),
            dtype=self.runner.dtype,
            attn_implementation=None,
            device=config.device,
            threads=self.threads,
            inputs={k: list(v.shape) for k, v in self.feeds.items() if not k.startswith("past_key_values.")},
            heads=heads,
            kv_heads=kv_heads,
            params=count_params(model),
            weights_bytes=sum(f.stat().st_size for f in files),
            flops=self.flops[0],
            flops_by_op=self.flops[1],
            **latency(times, config, "input_ids" in self.inputs),
            peak_memory_bytes=self.peak,
            peak_memory_kind=self.kind,
            generation=generation,
            notes=list(self.notes),
            runtime="onnxruntime",
        )


def bench_onnx(
    model: nn.Module,
    onnx_file: str | Path,
    config: BenchConfig,
    name: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    flops: tuple[int, dict[str, int]] | None = None,
) -> BenchResult:
    """Benchmark ``onnx_file`` (an export of ``model``) alone in onnxruntime, like :func:`bench_model` does
    PyTorch: same inputs and statistics. ``model`` gives the inputs, FLOPs (unless ``flops`` is given),
    parameters and heads; ``progress(stage, done, total)`` reports the ``onnxruntime ...`` stages."""
    config.validate()
    label = name or type(model).__name__.removeprefix("Headcut")
    with torch_threads(config):
        row = OnnxRow(model, onnx_file, config, label, progress or silent, flops)
        (result,) = measure([row], config)
    return result


def onnx_for(
    item: Any, model: nn.Module, stack: contextlib.ExitStack, progress: Callable[[str, int, int], None]
) -> tuple[Path, str | None]:
    """The ``model.onnx`` of a checkpoint folder, or an export into a temporary folder (and a note)."""
    folder = Path(item).expanduser() if isinstance(item, (str, os.PathLike)) else None
    if folder is not None and (folder / ONNX_FILE).is_file():
        return folder / ONNX_FILE, None
    tmp = stack.enter_context(scratch_folder("onnx"))
    progress("onnx export", 0, 1)
    exported = export_onnx(model, tmp)
    progress("onnx export", 1, 1)
    where = f"no {ONNX_FILE} in the folder" if folder is not None and folder.is_dir() else "no ONNX file"
    check = f"; max abs difference from PyTorch {exported.parity:.1e}" if exported.parity is not None else ""
    return tmp / ONNX_FILE, (
        f"{where}: exported one to a temporary folder for onnxruntime ({exported.seconds:.1f} s{check})"
    )
