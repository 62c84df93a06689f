"""vLLM rows of ``headcut bench --runtime vllm``, and serving a checkpoint folder in vLLM for a check.

vLLM runs in a process of its own, with the interpreter of the environment it is installed in (``--vllm-python``;
see :func:`headcut.extras.vllm_interpreter`), driven over a pipe by :mod:`headcut.jobs.bench.vllm_worker`: one engine
per row, each loaded once and kept until the rows are measured, so vLLM rows take their turns in the same rounds as
the torch and onnxruntime ones (the interleaving and noise rules of :mod:`headcut.jobs.bench.run`).

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

The worker process (:class:`VllmEngine`) is never waited for without a deadline, and nothing it started outlives it:

* it runs in a session of its own (``start_new_session``), so a terminal's Ctrl-C reaches headcut alone, and headcut
  ends it with its whole process group (``os.killpg``): SIGTERM, then SIGKILL :data:`TERM_S` seconds later, on
  every path out of it (an answer that is an error, a timeout, Ctrl-C/SIGTERM/SIGHUP, a normal close after
  ``quit``; :func:`headcut.processes.stop_group`), and at exit for any engine still open;
* while it runs a command it writes a heartbeat every :data:`HEARTBEAT_S` seconds (:mod:`.vllm_worker`, from before
  vLLM is imported), and headcut reads the pipe with a selector, never a blocking read: a worker silent for
  :data:`SILENCE_S` seconds (no answer, no heartbeat) is hung; one that keeps beating but has no answer after
  ``timeout`` seconds (``--vllm-timeout``) is stuck. The heartbeat only proves the process lives (a thread of its
  own writes it), hence the total deadline too; the silence deadline is what stops a worker that hangs (or is no
  vLLM worker at all) within a minute and a half instead of an hour;
* what it prints is checked: a line that is not a JSON object, or an answer without the fields its command
  answers, is a one-line error quoting it (printable characters only, cut: :func:`headcut.formatting.printable`);
  every message naming the worker names its interpreter and quotes its log's end.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any, NoReturn

import torch

from ...config import BenchConfig
from ...config.bench import VLLM_TIMEOUT_S, check_vllm_python
from ...data.tasks import max_positions
from ...errors import HeadcutError, shown
from ...errors import label as keyword
from ...formatting import printable
from ...interrupts import deferred_signals
from ...model.measure import SelfTimed, time_calls
from ...outputs.reports import weights_bytes as folder_weights_bytes
from ...processes import stop_group, wait_exit
from .results import BenchResult, GenerationResult
from .rows import Row, StageFn, latency

#: the worker script (run by path with vLLM's interpreter)
WORKER = Path(__file__).with_name("vllm_worker.py")
#: bytes per value of vLLM's dtypes
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
#: seconds between the worker's heartbeats while it runs a command (given to it as ``$HEADCUT_VLLM_HEARTBEAT_S``)
HEARTBEAT_S = 10.0
#: seconds without a line from the worker (an answer or a heartbeat) after which it is taken as hung: nine beats
#: missed, room for a machine so loaded that a thread waits seconds for its turn
SILENCE_S = 90.0
#: seconds for the answer to ``quit`` and then for the worker to exit by itself (vLLM tears its engine down)
QUIT_S = 20.0
#: seconds a worker that closed its end of the pipe gets to exit by itself before it is stopped
EXIT_S = 5.0
#: seconds between SIGTERM and SIGKILL to the worker's process group
TERM_S = 3.0
#: the longest line headcut reads from a worker (an answer with many log-probabilities is megabytes)
LONGEST_LINE = 512 * 2**20
#: the engines whose worker may still run: closed at exit if nothing else closed them
_OPEN: set[VllmEngine] = set()


def _tail(path: Path, lines: int = 6) -> str:
    """The last error-looking lines of a worker's log (its traceback's end), printable characters only."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    kept = [printable(line) for line in text if line.strip() and not line.startswith(("INFO", "(", "WARNING"))]
    return printable(" | ".join([line for line in kept if line][-lines:])[-600:], 600)


class VllmEngine:
    """A vLLM worker process (:mod:`headcut.jobs.bench.vllm_worker`, run by ``python``) holding one engine; :meth:`call`
    sends a command and returns its answer, a one-line HeadcutError when it fails, the process dies, prints what
    is not an answer, or misses a deadline (``timeout``: seconds for one answer; ``hint``: what to change about it,
    for the message; see the module for the deadlines). Its log (vLLM's own output) goes to a temporary file whose
    end is quoted in errors. :meth:`close` (also leaving a ``with`` block) ends it on every path."""

    def __init__(
        self,
        python: str,
        label: str,
        env: dict[str, str] | None = None,
        *,
        timeout: float = VLLM_TIMEOUT_S,
        hint: str = "",
    ) -> None:
        self.label, self.timeout, self.hint = label, float(timeout), hint
        self.who = f"the vLLM worker ({printable(python, 200)})"
        self._buffer = bytearray()
        self._pending: str | None = None  # the command sent and not answered: the worker reads no "quit" then
        self._stopped = False
        self._log: IO[bytes] = tempfile.NamedTemporaryFile(prefix="headcut-vllm-", suffix=".log", delete=False)
        self.log = Path(self._log.name)
        full_env = dict(
            os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", HEADCUT_VLLM_HEARTBEAT_S=f"{HEARTBEAT_S:g}", **(env or {})
        )
        try:
            with deferred_signals():  # started and registered, or not started: never a worker nobody stops
                self.proc = subprocess.Popen(
                    [python, str(WORKER)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self._log,
                    env=full_env,
                    start_new_session=True,
                )
                _OPEN.add(self)
        except OSError as exc:
            self._log.close()
            self.log.unlink(missing_ok=True)
            raise HeadcutError(
                f"{label}: {self.who} does not start ({type(exc).__name__}: {printable(str(exc))})"
            ) from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        os.set_blocking(self.proc.stdin.fileno(), False)  # written with a deadline (:meth:`_send`)

    def call(self, **msg: Any) -> dict[str, Any]:
        """Send ``msg`` and wait for the answer (at most ``timeout`` seconds, ``quit``: :data:`QUIT_S`)."""
        cmd = str(msg.get("cmd"))
        if self._stopped or self._pending is not None:
            raise HeadcutError(f"{self.label}: {self.who} was stopped; it cannot {cmd}")
        deadline = time.monotonic() + (QUIT_S if cmd == "quit" else self.timeout)
        self._pending = cmd
        self._send((json.dumps(msg) + "\n").encode(), cmd, deadline)
        silent_until = time.monotonic() + SILENCE_S
        while True:
            line = self._line(cmd, min(deadline, silent_until))
            if line is None:
                if time.monotonic() >= deadline:
                    limit = QUIT_S if cmd == "quit" else self.timeout
                    self._fail(f"did not answer {cmd} within {limit:g} s{self.hint}: stopped it")
                self._fail(
                    f"sent nothing for {SILENCE_S:g} s while it ran {cmd} (no answer, no heartbeat): hung, stopped it"
                )
            if not line.strip():
                continue
            answer = self._parse(line, cmd)
            if answer.get("alive") is True and "ok" not in answer:
                silent_until = time.monotonic() + SILENCE_S  # a heartbeat: it works on
                continue
            self._pending = None
            if not answer.get("ok"):
                error = printable(str(answer.get("error") or "no reason given"), 600)
                raise HeadcutError(f"{self.label}: vLLM fails to {cmd}: {error}")
            return answer

    def close(self) -> None:
        """Stop the worker (``quit`` when it is idle, then its process group, see the module) and remove its log;
        never waits more than about ``QUIT_S * 2 + TERM_S * 2`` seconds, and only an idle worker that answers
        ``quit`` that long. Called while an interruption (Ctrl-C, SIGTERM) is being handled, it stops the group at
        once."""
        if self._stopped:
            return
        grace = 0.0
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)  # Ctrl-C, SIGTERM: stop now, no quit
        try:
            if not interrupted and self._pending is None and not wait_exit(self.proc):
                try:
                    self.call(cmd="quit")
                    grace = QUIT_S
                except HeadcutError:
                    pass
        finally:
            self._stop(grace)

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the rest ---------------------------------------------------------------------------------
    def _stop(self, grace: float = 0.0) -> None:
        """End the process group (:func:`headcut.processes.stop_group`), close the pipes, remove the log."""
        if self._stopped:
            return
        try:
            stop_group(self.proc, grace, TERM_S)
        finally:
            self._stopped = True
            _OPEN.discard(self)
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
            self._log.close()
            self.log.unlink(missing_ok=True)

    def _fail(self, what: str) -> NoReturn:
        """Stop the worker and raise the one line saying ``what`` it did, with its log's end."""
        tail = _tail(self.log)
        self._stop()
        ends = f"; its log ends: {tail}" if tail else "; its log is empty"
        raise HeadcutError(f"{self.label}: {self.who} {what}{ends}")

    def _exited(self, cmd: str) -> NoReturn:
        """The worker closed its end of the pipe (it exits, or it is gone): its status once it has exited (within
        :data:`EXIT_S` seconds; else it is stopped)."""
        exited = wait_exit(self.proc, EXIT_S)
        tail = _tail(self.log)
        self._stop()
        code = self.proc.returncode
        if not exited or code is None:
            how = "closed its output without exiting: stopped it"
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            how = f"was killed by {name}"
        else:
            how = f"exited (status {code})"
        ends = f"; its log ends: {tail}" if tail else "; its log is empty"
        raise HeadcutError(f"{self.label}: {self.who} {how} before answering {cmd}{ends}")

    def _send(self, data: bytes, cmd: str, deadline: float) -> None:
        """Write ``data`` to the worker's stdin, waiting at most until ``deadline`` (and :data:`SILENCE_S`) for room."""
        assert self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        start = time.monotonic()
        until = min(deadline, start + SILENCE_S)
        view = memoryview(data)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    pass
                except OSError:  # a broken pipe: it is gone
                    self._exited(cmd)
                if view:
                    left = until - time.monotonic()
                    if left <= 0:
                        waited = time.monotonic() - start
                        self._fail(f"did not read the {cmd} command in {waited:.0f} s (its input is full): stopped it")
                    selector.select(left)

    def _line(self, cmd: str, until: float) -> bytes | None:
        """The worker's next line (without its end), None once ``until`` has passed without one."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        scanned = 0
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                end = self._buffer.find(b"\n", scanned)
                if end >= 0:
                    line = bytes(self._buffer[:end])
                    del self._buffer[: end + 1]
                    return line
                scanned = len(self._buffer)
                if scanned > LONGEST_LINE:
                    self._fail(f"printed {scanned} bytes without a line end while it ran {cmd}: stopped it")
                left = until - time.monotonic()
                if left <= 0:
                    return None
                if not selector.select(left):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    if self._buffer:  # the last line, without its end
                        line = bytes(self._buffer)
                        self._buffer.clear()
                        return line
                    self._exited(cmd)
                self._buffer += chunk

    def _parse(self, line: bytes, cmd: str) -> dict[str, Any]:
        """One line of the worker as its JSON object, or the one-line error quoting it."""
        text = line.decode("utf-8", errors="replace")
        try:
            answer = json.loads(text)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            quoted = printable(text, 120) or "an unprintable line"
            self._fail(
                f"printed '{quoted}' where headcut reads its answer to {cmd} (a line of JSON): not headcut's vLLM "
                "worker? stopped it"
            )
        return answer


@atexit.register
def _close_open() -> None:
    """Stop the engines still open when the interpreter exits, at once (no ``quit``: only a path that missed
    :meth:`VllmEngine.close` leaves one, such as an interruption while the engine was being made, before its owner
    held it)."""
    for engine in list(_OPEN):
        try:
            engine._stop()
        except (HeadcutError, OSError):
            pass


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


def model_positions(folder: Path) -> int | None:
    """The most positions the model of ``folder`` reads, from its config.json as headcut reads a loaded config
    (:func:`headcut.data.tasks.max_positions`: ``max_position_embeddings``, GPT-2's ``n_positions``, ...); None
    when it states none."""
    return max_positions(SimpleNamespace(**{str(k): v for k, v in _text_config(folder).items()}))


def check_length(folder: Path, label: str, prompt: int, new_tokens: int) -> None:
    """Refuse a prompt plus new tokens longer than the model's positions (:func:`model_positions`), before vLLM
    starts (vLLM would refuse it after loading)."""
    positions = model_positions(folder)
    if positions is not None and prompt + new_tokens + 1 > positions:
        raise HeadcutError(
            f"{label}: --seq-len {prompt} and --gen-tokens {new_tokens} (plus the prefill's token) exceed the "
            f"model's {positions} positions: give --seq-len {max(positions - new_tokens - 1, 1)} at most"
        )


def _whole(value: Any, default: int) -> int:
    """``value`` when it is a positive whole number (a config's size), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _kv_space_gib(folder: Path, batch: int, length: int, dtype_bytes: int) -> int:
    """GiB of CPU KV cache to ask vLLM for: ``batch`` sequences of ``length`` positions at the config's
    ``num_key_value_heads`` in every layer (an upper bound for a per-layer cut, whose config states its widest
    layer; sliding windows not counted), with a quarter more for vLLM's block rounding, at least 1 GiB."""
    text = _text_config(folder)
    layers = _whole(text.get("num_hidden_layers"), 32)
    heads = _whole(text.get("num_attention_heads"), 32)
    hidden = _whole(text.get("hidden_size"), 4096)
    head_dim = _whole(text.get("head_dim"), hidden // heads)
    per_token = 2 * layers * _whole(text.get("num_key_value_heads"), heads) * head_dim * dtype_bytes
    return max(1, int(math.ceil(1.25 * batch * length * per_token / 2**30)))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _milliseconds(answer: dict[str, Any], who: str, cmd: str) -> float:
    """The ``ms`` of a timed command's answer, or a one-line error (the worker is not headcut's)."""
    ms = answer.get("ms")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
        raise HeadcutError(f"{who} answered {cmd} without its time in milliseconds ({shown(ms)})")
    return float(ms)


#: what the facts of a loaded engine hold (:func:`read_facts`): per list, each entry's whole numbers
FACT_FIELDS = {
    "attention": ("heads", "kv_heads", "head_size"),
    "linear": ("in", "out"),
    "embeddings": ("vocab", "dim"),
}


def read_facts(answer: dict[str, Any], who: str) -> dict[str, Any]:
    """The facts the worker answers ``load`` with (:func:`headcut.jobs.bench.vllm_worker._facts`), checked: the layer
    lists with whole numbers (a sliding window a whole number or None) and the texts as printable strings (they reach
    the table and the notes); a one-line error naming ``who`` otherwise."""
    facts = dict(answer)
    for key, numbers in FACT_FIELDS.items():
        entries = facts.get(key)
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise HeadcutError(
                f"{who} answered load without its {key} layers ({shown(entries)}): not headcut's worker?"
            )
        for entry in entries:
            window = entry.get("sliding_window")
            if not all(_count(entry.get(n)) for n in numbers) or not (window is None or _count(window)):
                raise HeadcutError(f"{who} answered load with a {key} entry headcut cannot read: {shown(entry, 120)}")
            if "kind" in entry:
                entry["kind"] = printable(str(entry["kind"]), 60)
    for key in ("vllm", "platform", "dtype", "cache_dtype", "architecture"):
        value = facts.get(key)
        facts[key] = printable(str(value), 100) if value is not None else ""
    return facts


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
        cache_dtype: str = "auto",
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
        engine: VllmEngine | None = None
        try:
            with deferred_signals():  # the engine started and held here, or not started
                engine = self.engine = VllmEngine(
                    python, label, env, timeout=config.vllm_timeout, hint=f" (raise {keyword('vllm_timeout')})"
                )
            answer = engine.call(
                cmd="load",
                model=str(self.folder),
                dtype=config.dtype or "auto",
                max_model_len=length,
                max_num_seqs=config.batch_size,
                seed=config.seed,
                trust_remote_code=trust_remote_code,
                gpu_memory_utilization=round(0.85 / max(engines, 1), 3),
                kv_cache_dtype=cache_dtype,
            )
            self.facts = read_facts(answer, f"{label}: {engine.who}")
            self.report("load", 1, 1)
            platform = self.facts["platform"] or "cpu"
            if platform != torch.device(config.device).type:
                raise HeadcutError(
                    f"{label}: this vLLM runs on {platform}, not --device {config.device} (install the vLLM build "
                    "of that device in the --vllm-python environment)"
                )
        except BaseException:
            if engine is not None:
                engine.close()
            raise
        self.dtype = self.facts["dtype"] or config.dtype or "float32"
        cache = self.facts["cache_dtype"] or "auto"
        self.cache_bytes = DTYPE_BYTES.get(self.dtype if cache == "auto" else cache, DTYPE_BYTES.get(self.dtype, 4))
        self.flops = prefill_flops(self.facts, config.batch_size, config.seq_len)
        self.params, read = matrix_params(self.facts)
        self.weights_read = read * DTYPE_BYTES.get(self.dtype, 4)

    def forward(self) -> Any:
        answer = self.engine.call(
            cmd="prefill", batch=self.config.batch_size, context=self.config.seq_len, seed=self.config.seed
        )
        return SelfTimed(_milliseconds(answer, f"{self.label}: {self.engine.who}", "prefill"))

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
        who = f"{self.label}: {self.engine.who}"
        _milliseconds(answer, who, "decode")
        decoded = answer.get("decoded")
        if not isinstance(decoded, list) or not all(_count(n) for n in decoded):
            raise HeadcutError(f"{who} answered decode without the tokens it decoded ({shown(decoded)})")
        if any(n != config.gen_tokens for n in decoded):
            raise HeadcutError(f"{self.label}: vLLM decoded {shown(decoded)} tokens, not {config.gen_tokens} each")
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
    timeout: float = VLLM_TIMEOUT_S,
    kv_cache_dtype: str = "auto",
) -> dict[str, Any]:
    """Serve ``folder`` in a vLLM engine (``python``: the interpreter vLLM is installed in) and decode ``prompts``
    (token ids) greedily for ``max_tokens`` tokens: ``{"tokens": [...], "logprobs": [...], "prompt_logprobs":
    [...], "facts": {...}}``, the log-probabilities as ``{token id: logprob}`` per position (the top ``logprobs``
    / ``prompt_logprobs`` and the chosen token). What headcut's serving checks compare with transformers and
    :func:`headcut.load`. ``timeout``: seconds the worker may take for one answer (loading, generating; see the
    module for its other deadlines); ``kv_cache_dtype``: vLLM's (``fp8``: an 8-bit cache); a one-line HeadcutError
    naming the interpreter on any failure, with the worker and everything it started stopped. Prompts longer than the
    model's positions are refused before vLLM starts."""
    path = servable_folder(folder)
    longest_prompt = max((len(p) for p in prompts), default=0)
    longest = longest_prompt + max_tokens + 1
    positions = model_positions(path)
    if positions is not None and longest > positions:
        raise HeadcutError(
            f"{folder}: a prompt of {longest_prompt} tokens and {max_tokens} new ones (plus one) exceed the model's "
            f"{positions} positions"
        )
    length = max(longest, 64) if positions is None else min(max(longest, 64), positions)
    length = max_model_len or length
    env = {"VLLM_CPU_KVCACHE_SPACE": str(_kv_space_gib(path, len(prompts), length, DTYPE_BYTES.get(dtype, 4)))}
    python = check_vllm_python(python)
    engine: VllmEngine | None = None
    try:
        with deferred_signals():  # the engine started and held here, or not started
            engine = VllmEngine(python, str(folder), env, timeout=timeout, hint=" (raise serve's timeout=)")
        who = f"{folder}: {engine.who}"
        facts = read_facts(
            engine.call(
                cmd="load",
                model=str(path),
                dtype=dtype,
                max_model_len=length,
                max_num_seqs=max(len(prompts), 1),
                trust_remote_code=trust_remote_code,
                kv_cache_dtype=kv_cache_dtype,
            ),
            who,
        )
        out = engine.call(
            cmd="generate",
            prompts=[list(map(int, p)) for p in prompts],
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
    finally:
        if engine is not None:
            engine.close()
    for key in ("tokens", "logprobs", "prompt_logprobs"):
        if not isinstance(out.get(key), list):
            raise HeadcutError(f"{who} answered generate without its {key} ({shown(out.get(key))})")
    out.pop("ok", None)
    out["facts"] = facts
    return out
