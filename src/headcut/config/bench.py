"""How ``headcut bench`` times models: :class:`BenchConfig`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from ..catalog import ATTN_IMPLEMENTATIONS, DTYPE_NAMES
from ..devices import check_device
from ..errors import HeadcutError, HeadcutValueError
from ..extras import imported, vllm_interpreter
from ..options import OptionError, check_fields, option, specs

#: ``headcut bench --runtime`` values (comma-separated: ``torch,onnxruntime`` times both)
BENCH_RUNTIMES = ("torch", "onnxruntime", "vllm")
#: ``headcut bench --kv-cache-dtype`` values: vLLM's ``kv_cache_dtype`` (auto: the model's dtype; fp8: 8 bits)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
#: the --help section of bench's options
P = "Options"
#: the largest count torch takes (it unpacks them into a C ``long long``)
LARGEST_COUNT = 2**63 - 1
#: seconds a vLLM worker may take for one answer (``--vllm-timeout``; :mod:`headcut.jobs.bench.vllm_rows`)
VLLM_TIMEOUT_S = 3600.0


def check_vllm_python(python: str | None) -> str:
    """The interpreter ``--runtime vllm`` runs vLLM with (:func:`headcut.extras.vllm_interpreter`), as a
    one-line HeadcutValueError when it has no vLLM."""
    try:
        return vllm_interpreter(python)
    except HeadcutError as exc:
        raise HeadcutValueError(Exception.__str__(exc)) from None


@dataclass
class BenchConfig:
    """How to benchmark. ``dtype``/``attn_implementation`` None: the checkpoint's own. ``runtime``:
    ``torch``, ``onnxruntime`` or both comma-separated (one row per model and runtime). ``interleave``:
    time the models in rounds (one forward of each per round, the order rotated), every model in memory
    at once; False: one after the other (see :mod:`headcut.jobs.bench.run`)."""

    device: str = option(
        "cpu", metavar="DEVICE", panel=P, complete=("cpu", "cuda", "mps"), help="cpu, cuda, cuda:N or mps."
    )
    batch_size: int = option(8, low=1, metavar="N", panel=P, help="Examples per forward.")
    seq_len: int = option(
        128, low=1, metavar="N", panel=P, help="Tokens per example (the prompt length for generation)."
    )
    runs: int = option(
        20, low=1, metavar="N", panel=P, help="Timed forwards per model (interleaved: rounds of one forward of each)."
    )
    warmup: int = option(3, low=0, metavar="N", panel=P, help="Untimed forwards before the timed ones.")
    threads: int | None = option(
        None,
        low=1,
        metavar="N",
        panel=P,
        help="CPU threads (torch.set_num_threads) during the runs; default: torch's.",
    )
    dtype: str | None = option(
        None,
        choices=DTYPE_NAMES,
        metavar="DTYPE",
        panel=P,
        help=f"Load in this dtype ({', '.join(DTYPE_NAMES)}); default: the checkpoint's.",
    )
    attn_implementation: str | None = option(
        None,
        flag="--attn",
        choices=ATTN_IMPLEMENTATIONS,
        metavar="IMPL",
        panel=P,
        help=f"Attention implementation ({', '.join(ATTN_IMPLEMENTATIONS)}); default: transformers'.",
    )
    gen_tokens: int = option(
        32,
        low=0,
        metavar="N",
        panel=P,
        help="New tokens per cached greedy generation (models that generate); 0: skip.",
    )
    gen_runs: int = option(
        3,
        low=1,
        metavar="N",
        panel=P,
        help="Timed generations per model (interleaved: rounds of one generation of each).",
    )
    seed: int = 0
    runtime: str = option(
        "torch",
        metavar="RUNTIME",
        panel=P,
        complete=BENCH_RUNTIMES + ("torch,onnxruntime", "torch,vllm"),
        help="torch, onnxruntime, vllm, or several comma-separated: one row per MODEL and runtime (onnxruntime: "
        "the folder's model.onnx, else a temporary export; extra [onnx]; vllm: the folder served by a vLLM "
        "engine, see --vllm-python).",
    )
    vllm_python: str | None = option(
        None,
        metavar="PYTHON",
        panel=P,
        help="The Python interpreter of the environment vLLM is installed in, for --runtime vllm (vLLM pins its "
        "own torch and transformers, so it often has its own virtualenv); default: this one.",
    )
    vllm_timeout: float = option(
        VLLM_TIMEOUT_S,
        low=1,
        metavar="SECONDS",
        panel=P,
        help="Seconds the vLLM worker of --runtime vllm may take for one answer (loading a MODEL, one timed prefill "
        "or decode) before it is stopped; a worker that sends nothing for 90 s, not even its heartbeat, is stopped "
        "as hung sooner.",
    )
    kv_cache_dtype: str = option(
        "auto",
        metavar="DTYPES",
        panel=P,
        complete=KV_CACHE_DTYPES + ("auto,fp8",),
        help="The KV cache's dtype in vLLM (--runtime vllm): auto (the model's), fp8 (8 bits: half of 16-bit "
        "bytes), fp8_e4m3, fp8_e5m2, or several comma-separated: one row per MODEL and cache dtype.",
    )
    interleave: bool = option(
        True,
        flag="--interleave/--no-interleave",
        panel=P,
        help="Time the MODELs "
        "in rounds of one forward (and generation) of each, the order rotated each round (the "
        "default); this holds every MODEL in memory at once. --no-interleave times one MODEL "
        "after the other, one in memory at a time: back to back, the speed-ups are not "
        "comparable under a changing load.",
    )

    def runtimes(self) -> tuple[str, ...]:
        """The runtimes of ``runtime`` in a stable order (torch first); one-line errors."""
        parts = _listed(self.runtime, BENCH_RUNTIMES, "--runtime", "torch,onnxruntime")
        return tuple(r for r in BENCH_RUNTIMES if r in parts)

    def cache_dtypes(self) -> tuple[str, ...]:
        """The cache dtypes of ``kv_cache_dtype``, in the order given, each once; one-line errors."""
        return tuple(dict.fromkeys(_listed(self.kv_cache_dtype, KV_CACHE_DTYPES, "--kv-cache-dtype", "auto,fp8")))

    def validate(self) -> list[str]:
        """Refuse impossible settings (one-line HeadcutError); return warnings for doubtful ones."""
        check_fields(self)  # types, choices and ranges, as declared
        for spec in specs(BenchConfig):
            value = getattr(self, spec.name)
            if spec.kind == "int" and value is not None:
                # more threads than CPUs only slows the timing down; many more make OpenMP abort the process
                high = (os.cpu_count() or 2**31 - 1) if spec.name == "threads" else LARGEST_COUNT
                if value > high:
                    raise OptionError(
                        "{%s} must be at most {h} (got {v!r})" % spec.name,
                        v=value,
                        h="2**63 - 1" if high == LARGEST_COUNT else high,
                    )

        check_device(self.device, auto=False)
        if "onnxruntime" in self.runtimes():
            self._check_onnxruntime()
        if self.cache_dtypes() != ("auto",) and "vllm" not in self.runtimes():
            raise HeadcutValueError(
                f"--kv-cache-dtype {self.kv_cache_dtype} sets vLLM's KV cache: it needs --runtime vllm"
            )
        if "vllm" in self.runtimes():
            check_vllm_python(self.vllm_python)
        notes = []
        if self.device == "cpu" and self.dtype == "float16":
            notes.append("float16 on CPU is often much slower than float32 and some kernels lack it")
        return notes

    def _check_onnxruntime(self) -> None:

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


def _listed(value: str, allowed: tuple[str, ...], flag: str, example: str) -> list[str]:
    """The comma-separated names of ``value`` (lower case), each one of ``allowed``; a one-line error naming
    ``flag`` otherwise."""
    parts = [p.strip().lower() for p in str(value).split(",") if p.strip()]
    unknown = [p for p in parts if p not in allowed]
    if not parts or unknown:
        raise HeadcutValueError(
            f"unknown {flag} {(unknown or [value])[0]!r}; choose {', '.join(allowed)} or several comma-separated "
            f"({example})"
        )
    return parts


@dataclass
class CardOptions:
    """What ``bench`` writes besides its report (:func:`headcut.bench`'s keyword of the same name):
    ``update_cards``: the measured speed-up into the model card of every headcut output after the first."""

    update_cards: bool = option(
        False,
        flag="--update-card",
        panel=P,
        help="Write the measured speed-up into the model card (README.md) of every "
        "headcut output after the first MODEL (the baseline); replaced atomically.",
    )
