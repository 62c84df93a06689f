"""vLLM rows of ``headcut bench --runtime vllm``, and serving a checkpoint folder in vLLM for a check.

vLLM runs in a process of its own, with the interpreter of the environment it is installed in (``--vllm-python``;
see :func:`headcut.extras.vllm_interpreter`), driven over a pipe by :mod:`headcut.jobs.vllm_worker`: one engine
per row, each loaded once and kept until the rows are measured, so vLLM rows take their turns in the same rounds as
the torch and onnxruntime ones (the interleaving and noise rules of :mod:`headcut.jobs.bench_run`).

What a vLLM row measures (all timed inside the worker with ``time.perf_counter``, without the pipe):

* **prefill** (the row's forward, ``runs``): ``batch_size`` prompts of ``seq_len`` random tokens (from ``seed``),
  one new token each, the engine stepped until all are done; no prefix caching, so every run computes the whole
  prompt. ``tokens_per_s`` is prefill tokens per second.
* **decode** (the row's generation, ``gen_runs``): the same prompts prefilled untimed (engine steps until every
  request has its first token), then the steps that decode ``gen_tokens`` more tokens per request are timed: the
  generation's tokens/s is decode-only (``prefill_included`` false), at a context of ``seq_len`` to ``seq_len +
  gen_tokens`` tokens.
* **KV cache**: computed from the attention layers vLLM built (each layer's KV heads, head size and sliding window;
  the cache dtype), exactly as the engine allocates it per token: ``2 x kv_heads x head_size x bytes`` per layer,
  at most ``window`` positions in a sliding layer; ``kv_cache_bytes`` at the last decoded position of all the
  sequences.
* **FLOPs** of one prefill, from the layers vLLM built: ``2 x in x out`` per token for every linear layer, the
  output head once per sequence (vLLM computes logits only where it samples), and attention ``4 x heads x
  head_size`` per pair of positions attended (causal, capped by a sliding window). The FLOP ratio against the
  first row is the ideal prefill speed-up of a compute-bound prefill.
* **bytes per token** (the ideal beside the decode speed): the weights one decoding step reads (every linear
  layer and the output head, in the serving dtype) shared by the batch, plus each sequence's KV cache at the mean
  cached length of the decoding steps; the first row's bytes over a row's is the speed-up a memory-bound decoder
  would show.
* the memory column is not measured for vLLM rows (the engine preallocates its KV cache).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import torch

from ..config import BenchConfig
from ..config.bench import check_vllm_python
from ..errors import HeadcutError
from ..model.measure import SelfTimed, time_calls
from ..outputs.reports import weights_bytes as folder_weights_bytes
from .bench_results import BenchResult, GenerationResult
from .bench_rows import Row, StageFn, latency

#: the worker script (run by path with vLLM's interpreter)
WORKER = Path(__file__).with_name("vllm_worker.py")
#: bytes per value of vLLM's dtypes
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _tail(path: Path, lines: int = 6) -> str:
    """The last error-looking lines of a worker's log (its traceback's end)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    kept = [line.strip() for line in text if line.strip() and not line.startswith(("INFO", "(", "WARNING"))]
    return " | ".join(kept[-lines:])[-600:]


class VllmEngine:
    """A vLLM worker process (:mod:`headcut.jobs.vllm_worker`) holding one engine; :meth:`call` sends a command
    and returns its answer, a one-line HeadcutError when it fails or the process dies. Its log (vLLM's own
    output) goes to a temporary file whose end is quoted in errors."""

    def __init__(self, python: str, label: str, env: dict[str, str] | None = None) -> None:
        self.label = label
        self._log: IO[bytes] = tempfile.NamedTemporaryFile(prefix="headcut-vllm-", suffix=".log", delete=False)
        self.log = Path(self._log.name)
        full_env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
        self.proc = subprocess.Popen(
            [python, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=full_env,
            text=True,
        )

    def call(self, **msg: Any) -> dict[str, Any]:
        """Send ``msg`` and wait for the answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            code = self.proc.wait()
            raise HeadcutError(f"{self.label}: the vLLM process exited (status {code}): {_tail(self.log)}")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise HeadcutError(f"{self.label}: vLLM fails to {msg.get('cmd')}: {answer.get('error')}")
        return answer

    def close(self) -> None:
        """Stop the process and remove its log."""
        if self.proc.poll() is None:
            try:
                self.call(cmd="quit")
            except HeadcutError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.log.unlink(missing_ok=True)

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def servable_folder(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder vLLM can be pointed at, or a one-line HeadcutError: vLLM reads a folder (not a module),
    and not headcut's own form of a cut (its modelling code is headcut's)."""
    folder = Path(path).expanduser()
    config = folder / "config.json"
    if not config.is_file():
        raise HeadcutError(f"{path}: --runtime vllm serves a checkpoint folder with a config.json")
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise HeadcutError(f"{config}: not readable JSON ({exc})") from None
    if isinstance(data, dict) and data.get("headcut") is not None:
        extra = " (or serve its decilm/ folder)" if (folder / "decilm" / "config.json").is_file() else ""
        raise HeadcutError(
            f"{path} is a cut in headcut's own form (different head counts per layer), which needs headcut's "
            f"modelling code: vLLM cannot serve it{extra}; prune with --uniform for a stock checkpoint, or write "
            "a Llama-layout cut with --format decilm"
        )
    return folder


def kv_bytes(layers: Sequence[dict[str, Any]], positions: float, cache_bytes: int) -> float:
    """Bytes of one sequence's KV cache holding ``positions`` positions in ``layers`` (a sliding layer holds at
    most its window)."""
    total = 0.0
    for layer in layers:
        window = layer.get("sliding_window")
        held = min(positions, window) if window else positions
        total += 2 * layer["kv_heads"] * layer["head_size"] * cache_bytes * held
    return total


def attention_pairs(length: int, window: int | None) -> int:
    """Query-key pairs of a causal prefill of ``length`` tokens (each position attends to itself and the ones
    before it, at most ``window`` of them)."""
    if not window or window >= length:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def prefill_flops(facts: dict[str, Any], batch: int, length: int) -> tuple[int, dict[str, int]]:
    """FLOPs of one prefill of ``batch`` prompts of ``length`` tokens by the layers vLLM built (see the module)."""
    linear = sum(2 * x["in"] * x["out"] for x in facts["linear"]) * batch * length
    head = next((e for e in facts["embeddings"] if e["kind"] == "ParallelLMHead"), None)
    logits = 2 * head["vocab"] * head["dim"] * batch if head else 0
    attention = sum(
        4 * a["heads"] * a["head_size"] * attention_pairs(length, a.get("sliding_window")) for a in facts["attention"]
    )
    attention *= batch
    return linear + logits + attention, {"linear": linear, "lm_head": logits, "attention": attention}


def matrix_params(facts: dict[str, Any]) -> tuple[int, int]:
    """Parameters of the matrices vLLM built (linear layers, embedding, the output head when not tied) and those
    one decoding step reads (linear layers and the output head: the embedding only gathers rows)."""
    linear = sum(x["in"] * x["out"] for x in facts["linear"])
    tables = {e["kind"]: e["vocab"] * e["dim"] for e in facts["embeddings"]}
    embedding = tables.get("VocabParallelEmbedding", 0)
    head = tables.get("ParallelLMHead", embedding)
    own_head = 0 if facts.get("tie_word_embeddings") else head
    return linear + embedding + own_head, linear + head


def _text_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json (its ``text_config`` where it has one), or {}."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg


def check_length(folder: Path, label: str, prompt: int, new_tokens: int) -> None:
    """Refuse a prompt plus new tokens longer than the model's positions (vLLM would refuse it after loading)."""
    positions = _text_config(folder).get("max_position_embeddings")
    if isinstance(positions, int) and prompt + new_tokens + 1 > positions:
        raise HeadcutError(
            f"{label}: --seq-len {prompt} and --gen-tokens {new_tokens} (plus the prefill's token) exceed the "
            f"model's {positions} positions: give --seq-len {max(positions - new_tokens - 1, 1)} at most"
        )


def _kv_space_gib(folder: Path, batch: int, length: int, dtype_bytes: int) -> int:
    """GiB of CPU KV cache to ask vLLM for: ``batch`` sequences of ``length`` positions at the config's
    ``num_key_value_heads`` in every layer (an upper bound for a per-layer cut, whose config states its widest
    layer; sliding windows not counted), with a quarter more for vLLM's block rounding, at least 1 GiB."""
    text = _text_config(folder)
    layers = int(text.get("num_hidden_layers") or 32)
    heads = int(text.get("num_attention_heads") or 32)
    hidden = int(text.get("hidden_size") or 4096)
    head_dim = int(text.get("head_dim") or hidden // max(heads, 1))
    per_token = 2 * layers * int(text.get("num_key_value_heads") or heads) * head_dim * dtype_bytes
    return max(1, int(math.ceil(1.25 * batch * length * per_token / 2**30)))


class VllmRow(Row):
    """A checkpoint folder served by a vLLM engine (see the module)."""

    prefill_included = False

    def __init__(
        self,
        folder: str | os.PathLike[str],
        config: BenchConfig,
        label: str,
        report: StageFn,
        *,
        engines: int = 1,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        self.config, self.label = config, label
        self.report = lambda stage, done, total: report(f"vllm {stage}", done, total)
        self.folder = servable_folder(folder)
        self.clock = torch.device("cpu")  # the worker times its own steps (SelfTimed)
        self.generates = bool(config.gen_tokens)
        self.threads = config.threads or torch.get_num_threads()
        check_length(self.folder, label, config.seq_len, config.gen_tokens)
        length = config.seq_len + config.gen_tokens + 1
        dtype_bytes = DTYPE_BYTES.get(config.dtype or "float32", 4)
        env = {
            "OMP_NUM_THREADS": str(self.threads),
            "VLLM_CPU_KVCACHE_SPACE": str(_kv_space_gib(self.folder, config.batch_size, length, dtype_bytes)),
        }
        python = check_vllm_python(config.vllm_python)
        self.report("load", 0, 1)
        self.engine = VllmEngine(python, label, env)
        try:
            self.facts = self.engine.call(
                cmd="load",
                model=str(self.folder),
                dtype=config.dtype or "auto",
                max_model_len=length,
                max_num_seqs=config.batch_size,
                seed=config.seed,
                trust_remote_code=trust_remote_code,
                gpu_memory_utilization=round(0.85 / max(engines, 1), 3),
            )
        except BaseException:
            self.engine.close()
            raise
        self.report("load", 1, 1)
        platform = str(self.facts.get("platform") or "cpu")
        if platform != torch.device(config.device).type:
            self.engine.close()
            raise HeadcutError(
                f"{label}: this vLLM runs on {platform}, not --device {config.device} (install the vLLM build of "
                "that device in the --vllm-python environment)"
            )
        self.dtype = str(self.facts.get("dtype") or config.dtype or "float32")
        cache = str(self.facts.get("cache_dtype") or "auto")
        self.cache_bytes = DTYPE_BYTES.get(self.dtype if cache == "auto" else cache, DTYPE_BYTES.get(self.dtype, 4))
        self.flops = prefill_flops(self.facts, config.batch_size, config.seq_len)
        self.params, read = matrix_params(self.facts)
        self.weights_read = read * DTYPE_BYTES.get(self.dtype, 4)

    def forward(self) -> Any:
        answer = self.engine.call(
            cmd="prefill", batch=self.config.batch_size, context=self.config.seq_len, seed=self.config.seed
        )
        return SelfTimed(answer["ms"])

    def measure_memory(self, calls: int, step: Any) -> None:
        time_calls(self.forward, calls, self.clock, step)  # warmup; the engine's memory is preallocated
        self.peak, self.kind = None, "unavailable"

    def _decode(self) -> dict[str, Any]:
        config = self.config
        answer = self.engine.call(
            cmd="decode",
            batch=config.batch_size,
            context=config.seq_len,
            new_tokens=config.gen_tokens,
            seed=config.seed,
        )
        if any(n != config.gen_tokens for n in answer["decoded"]):
            raise HeadcutError(f"{self.label}: vLLM decoded {answer['decoded']} tokens, not {config.gen_tokens} each")
        return answer

    def generate(self) -> Any:
        return SelfTimed(self._decode()["ms"])

    def probe_generation(self) -> None:
        self._decode()
        config = self.config
        positions = config.seq_len + config.gen_tokens
        self.new_tokens = config.gen_tokens
        per_sequence = kv_bytes(self.facts["attention"], positions, self.cache_bytes)
        self.cache = {
            "bytes": int(round(per_sequence * config.batch_size)),
            "positions": positions,
            "cross_bytes": None,
            "cross_positions": None,
        }

    def result(self, times: list[float], generation: GenerationResult | None) -> BenchResult:
        config = self.config
        attention = self.facts["attention"]
        try:
            model_type = str(json.loads((self.folder / "config.json").read_text()).get("model_type", ""))
        except (OSError, ValueError):
            model_type = ""
        notes = list(self.notes)
        heads = sum(a["heads"] for a in attention)
        return BenchResult(
            name=self.label,
            architecture=str(self.facts.get("architecture") or ""),
            model_type=model_type,
            dtype=self.dtype,
            attn_implementation=None,
            device=config.device,
            threads=self.threads,
            inputs={"input_ids": [config.batch_size, config.seq_len]},
            heads=heads,
            kv_heads=sum(a["kv_heads"] for a in attention),
            params=self.params,
            weights_bytes=folder_weights_bytes(self.folder) or 0,
            flops=self.flops[0],
            flops_by_op=self.flops[1],
            **latency(times, config, True),
            peak_memory_bytes=None,
            peak_memory_kind="unavailable",
            generation=generation,
            notes=notes + [f"served by vLLM {self.facts.get('vllm')} ({self.facts.get('platform')})"],
            runtime="vllm",
        )

    def close(self) -> None:
        self.engine.close()


def serve(
    folder: str | os.PathLike[str],
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    *,
    python: str | None = None,
    dtype: str = "float32",
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    trust_remote_code: bool = False,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """Serve ``folder`` in a vLLM engine (``python``: the interpreter vLLM is installed in) and decode ``prompts``
    (token ids) greedily for ``max_tokens`` tokens: ``{"tokens": [...], "logprobs": [...], "prompt_logprobs":
    [...], "facts": {...}}``, the log-probabilities as ``{token id: logprob}`` per position (the top ``logprobs``
    / ``prompt_logprobs`` and the chosen token). What headcut's serving checks compare with transformers and
    :func:`headcut.load`."""
    path = servable_folder(folder)
    longest = max((len(p) for p in prompts), default=1) + max_tokens + 1
    length = max_model_len or max(longest, 64)
    env = {"VLLM_CPU_KVCACHE_SPACE": str(_kv_space_gib(path, len(prompts), length, DTYPE_BYTES.get(dtype, 4)))}
    with VllmEngine(check_vllm_python(python), str(folder), env) as engine:
        facts = engine.call(
            cmd="load",
            model=str(path),
            dtype=dtype,
            max_model_len=length,
            max_num_seqs=max(len(prompts), 1),
            trust_remote_code=trust_remote_code,
        )
        out = engine.call(
            cmd="generate",
            prompts=[list(map(int, p)) for p in prompts],
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
    out.pop("ok", None)
    out["facts"] = facts
    return out
