"""How ``headcut bench`` times models: :class:`BenchConfig`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from ..catalog import ATTN_IMPLEMENTATIONS, DTYPE_NAMES
from ..errors import HeadcutError, HeadcutValueError
from ..options import check_fields, option
from .checks import _count, check_choice

#: ``headcut bench --runtime`` values (comma-separated: ``torch,onnxruntime`` times both)
BENCH_RUNTIMES = ("torch", "onnxruntime")


@dataclass
class BenchConfig:
    """How to benchmark. ``dtype``/``attn_implementation`` None: the checkpoint's own. ``runtime``:
    ``torch``, ``onnxruntime`` or both comma-separated (one row per model and runtime). ``interleave``:
    time the models in rounds (one forward of each per round, the order rotated), every model in memory
    at once; False: one after the other (see :mod:`headcut.jobs.bench_run`)."""

    device: str = "cpu"
    batch_size: int = 8
    seq_len: int = 128
    runs: int = 20
    warmup: int = 3
    threads: int | None = None
    dtype: str | None = None
    attn_implementation: str | None = None
    gen_tokens: int = 32
    gen_runs: int = 3
    seed: int = 0
    runtime: str = "torch"
    interleave: bool = option(
        True,
        flag="--interleave/--no-interleave",
        panel="Options",
        help="Time the MODELs "
        "in rounds of one forward (and generation) of each, the order rotated each round (the "
        "default); this holds every MODEL in memory at once. --no-interleave times one MODEL "
        "after the other, one in memory at a time: back to back, the speed-ups are not "
        "comparable under a changing load.",
    )

    def runtimes(self) -> tuple[str, ...]:
        """The runtimes of ``runtime`` in a stable order (torch first); one-line errors."""
        parts = [p.strip().lower() for p in str(self.runtime).split(",") if p.strip()]
        unknown = [p for p in parts if p not in BENCH_RUNTIMES]
        if not parts or unknown:
            raise HeadcutValueError(
                f"unknown --runtime {(unknown or [self.runtime])[0]!r}; choose "
                f"{', '.join(BENCH_RUNTIMES)} or both comma-separated (torch,onnxruntime)"
            )
        return tuple(r for r in BENCH_RUNTIMES if r in parts)

    def validate(self) -> list[str]:
        """Refuse impossible settings (one-line HeadcutError); return warnings for doubtful ones."""
        for name, low in (
            ("batch_size", 1),
            ("seq_len", 1),
            ("runs", 1),
            ("warmup", 0),
            ("gen_tokens", 0),
            ("gen_runs", 1),
        ):
            _count(f"--{name.replace('_', '-')}", getattr(self, name), low)
        if self.threads is not None:
            # more threads than CPUs only slows the timing down; many more make OpenMP abort the process
            _count("--threads", self.threads, 1, os.cpu_count() or 2**31 - 1)
        check_fields(self, ("interleave",))
        if self.dtype is not None:
            check_choice("--dtype", self.dtype, DTYPE_NAMES)
        if self.attn_implementation is not None:
            check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        from ..devices import check_device

        check_device(self.device, auto=False)
        if "onnxruntime" in self.runtimes():
            self._check_onnxruntime()
        notes = []
        if self.device == "cpu" and self.dtype == "float16":
            notes.append("float16 on CPU is often much slower than float32 and some kernels lack it")
        return notes

    def _check_onnxruntime(self) -> None:
        from ..extras import imported

        hint = "pip install 'headcut[onnx]' (onnx, onnxscript, onnxruntime)"
        try:
            onnxruntime = imported(
                "onnxruntime", "--runtime onnxruntime", hint, missing=f"--runtime onnxruntime needs onnxruntime: {hint}"
            )
        except HeadcutError as exc:
            raise HeadcutValueError(Exception.__str__(exc)) from None
        if self.device.startswith("cuda"):
            providers = onnxruntime.get_available_providers()
            if "CUDAExecutionProvider" not in providers:
                raise HeadcutValueError(
                    f"--runtime onnxruntime --device {self.device} needs onnxruntime's CUDAExecutionProvider; this "
                    f"onnxruntime {onnxruntime.__version__} has {', '.join(providers)}: pip install onnxruntime-gpu"
                )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
