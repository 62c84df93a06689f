"""The vLLM side of ``headcut bench --runtime vllm`` and of headcut's serving checks: a script that runs in the
Python environment vLLM is installed in (often its own virtualenv: vLLM pins its own torch and transformers), one
engine per process, driven by headcut over a pipe.

Run as ``python vllm_worker.py`` with that environment's interpreter; it imports only the standard library and
vLLM (never headcut, which that environment need not have). Protocol: one JSON object per line on stdin, one JSON
answer per line on the original stdout (vLLM's own logging is sent to stderr). Every answer has ``ok``; a failed
command answers ``{"ok": false, "error": "..."}`` and the worker goes on. Commands (``cmd``):

* ``load``: build ``vllm.LLM(model, dtype, max_model_len, seed, trust_remote_code)`` in this process (V1 engine
  without its multiprocessing, eager mode, no prefix caching: every timed prompt is computed in full). Answers
  the engine's facts: the platform, vLLM's version, the KV-cache capacity in tokens, and per attention layer its
  query and KV heads, head size, sliding window and cache dtype; per linear layer its input and output sizes, and
  the embedding's (what the FLOPs and bytes of a row are computed from).
* ``generate``: greedy decoding (temperature 0) of ``prompts`` (lists of token ids) for ``max_tokens`` tokens,
  with ``logprobs`` log-probabilities of the top tokens at each new and (``prompt_logprobs``) prompt position.
* ``prefill``: ``batch`` random prompts of ``context`` tokens (from ``seed``), one new token each; answers the
  milliseconds of the whole call, timed here with ``time.perf_counter``.
* ``decode``: ``batch`` random prompts of ``context`` tokens, prefilled untimed (engine steps until every request
  has its first token), then ``new_tokens`` more tokens decoded: answers the milliseconds of the decoding steps
  only, and the tokens each request decoded in them.
* ``quit``: exit.

While a command runs, a daemon thread writes a heartbeat on the protocol's channel every
``$HEADCUT_VLLM_HEARTBEAT_S`` seconds (default 10): ``{"alive": true, "cmd": ..., "s": seconds so far}``, never
after the command's answer. It starts before the first ``import vllm`` (which alone takes a while), so headcut can
tell a worker that works (a long load, a long prefill) from one that hangs or was never a vLLM worker: headcut
stops a worker that writes nothing at all for a while, and one that takes too long for an answer. When the
heartbeat cannot be written, headcut is gone (its end of the pipe closed): the worker then ends its process group
(itself and whatever vLLM started), as nobody is left to read what it computes.

A failed command's ``error`` is the exception's type and the meaningful part of its message (:func:`reason`:
pydantic's "Value error, ..." rather than its "For further information visit ..." line).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
from typing import IO, Any

#: seconds between two heartbeats while a command runs (headcut sets it in the environment)
HEARTBEAT_S = float(os.environ.get("HEADCUT_VLLM_HEARTBEAT_S") or 10.0)
#: the most characters of an exception's message an answer carries
REASON_CHARS = 600
#: lines of an exception's text that carry no reason: pydantic's pointer to its docs, a bare address
_BOILERPLATE = re.compile(r"^(for further information visit\b.*|(see )?https?://\S+\.?)$", re.IGNORECASE)
#: pydantic's first line of a ValidationError
_PYDANTIC_HEADER = re.compile(r"^\d+ validation errors? for \S+$")
#: the prefixes pydantic writes before a validator's own message
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def reason(text: str, limit: int = REASON_CHARS) -> str:
    """The meaningful part of an exception's message ``text``, on one line of at most ``limit`` characters.

    Lines that only point elsewhere (pydantic's "For further information visit https://errors.pydantic.dev/...", a
    bare URL) are dropped. A pydantic ValidationError (``N validation error(s) for Model``, then per error its
    location, its message and ``[type=..., input_value=...]``) gives its messages: the validator's own text without
    pydantic's "Value error, " prefix and the ``[type=...]`` suffix, a field's location before its message
    (``max_model_len: Input should be ...``). Other messages: their lines joined."""
    raw = [line.rstrip() for line in text.splitlines()]
    raw = [line for line in raw if line.strip() and not _BOILERPLATE.match(line.strip())]
    if raw and _PYDANTIC_HEADER.match(raw[0].strip()):
        parts: list[str] = []
        body = raw[1:]
        for i, line in enumerate(body):
            cut = line.rfind(" [type=")
            piece = (line[:cut] if cut >= 0 else line).strip()
            for prefix in _PYDANTIC_PREFIXES:
                piece = piece.removeprefix(prefix)
            located = not line[:1].isspace() and i + 1 < len(body) and body[i + 1].startswith("  ")
            if located and not body[i + 1].strip().startswith(_PYDANTIC_PREFIXES):
                piece += ":"  # a field's location, its message on the next (indented) line
            if piece:
                parts.append(piece)
        joined = " ".join(parts)
    else:
        joined = " ".join(line.strip() for line in raw)
    joined = " ".join(joined.split())
    return joined if len(joined) <= limit else joined[: limit - 3].rstrip() + "..."


class Channel:
    """The protocol's channel (headcut's pipe): answers, and the heartbeats of a running command, one line each,
    never interleaved."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.running: str | None = None
        self.started = 0.0

    def begin(self, cmd: str) -> None:
        with self.lock:
            self.running, self.started = cmd, time.monotonic()

    def answer(self, answer: dict[str, Any]) -> None:
        text = json.dumps(answer)
        with self.lock:
            self.running = None
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                _end_group()

    def beat(self) -> None:
        """One heartbeat if a command runs; headcut gone (a closed pipe): end this process group."""
        with self.lock:
            if self.running is None:
                return
            line = json.dumps({"alive": True, "cmd": self.running, "s": round(time.monotonic() - self.started, 1)})
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                _end_group()

    def beats(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            self.beat()


def _end_group() -> None:
    """End this process and what it started (its process group, when it leads one: headcut starts it so)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def _facts(llm: Any) -> dict[str, Any]:
    """What the engine built: attention layers, linear layers, embedding, KV-cache capacity."""

    def look(model: Any) -> dict[str, Any]:
        attention, linear, embeddings = [], [], []
        for name, module in model.named_modules():
            kind = type(module).__name__
            if kind == "Attention" and hasattr(module, "num_kv_heads") and hasattr(module, "head_size"):
                attention.append(
                    {
                        "name": name,
                        "heads": int(module.num_heads),
                        "kv_heads": int(module.num_kv_heads),
                        "head_size": int(module.head_size),
                        "sliding_window": getattr(module, "sliding_window", None),
                    }
                )
            elif kind in ("VocabParallelEmbedding", "ParallelLMHead"):
                embeddings.append(
                    {
                        "name": name,
                        "kind": kind,
                        "vocab": int(getattr(module, "org_vocab_size", 0) or module.num_embeddings),
                        "dim": int(module.embedding_dim),
                    }
                )
            elif hasattr(module, "input_size") and hasattr(module, "output_size"):
                linear.append({"name": name, "in": int(module.input_size), "out": int(module.output_size)})
        return {"attention": attention, "linear": linear, "embeddings": embeddings}

    facts = llm.apply_model(look)[0]
    engine = llm.llm_engine
    cache = engine.vllm_config.cache_config
    model_config = engine.vllm_config.model_config
    import vllm
    from vllm.platforms import current_platform

    facts.update(
        vllm=vllm.__version__,
        platform=str(current_platform.device_type),
        kv_cache_blocks=int(cache.num_gpu_blocks or 0),
        block_size=int(cache.block_size),
        cache_dtype=str(cache.cache_dtype),
        dtype=str(model_config.dtype).removeprefix("torch."),
        tie_word_embeddings=bool(getattr(model_config.hf_text_config, "tie_word_embeddings", False)),
        architecture=(list(getattr(model_config.hf_config, "architectures", None) or []) or [""])[0],
    )
    return facts


def _prompts(batch: int, context: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low = min(100, max(vocab - 1, 0))
    return [[rng.randrange(low, vocab) for _ in range(context)] for _ in range(batch)]


class Worker:
    """One vLLM engine and the commands that drive it."""

    def __init__(self) -> None:
        self.llm: Any = None
        self.vocab = 0
        self.serial = 0

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        from vllm import LLM

        extra: dict[str, Any] = {}
        if msg.get("gpu_memory_utilization"):
            extra["gpu_memory_utilization"] = float(msg["gpu_memory_utilization"])
        if msg.get("kv_cache_dtype") not in (None, "auto"):
            extra["kv_cache_dtype"] = str(msg["kv_cache_dtype"])
        self.llm = LLM(
            model=msg["model"],
            tokenizer=msg.get("tokenizer") or msg["model"],
            dtype=msg.get("dtype") or "auto",
            max_model_len=int(msg["max_model_len"]),
            seed=int(msg.get("seed", 0)),
            trust_remote_code=bool(msg.get("trust_remote_code", False)),
            enforce_eager=True,
            enable_prefix_caching=False,
            max_num_seqs=max(int(msg.get("max_num_seqs", 8)), 1),
            **extra,
        )
        self.vocab = int(self.llm.llm_engine.vllm_config.model_config.get_vocab_size())
        return _facts(self.llm)

    def _params(self, max_tokens: int, **extra: Any) -> Any:
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra)

    def generate(self, msg: dict[str, Any]) -> dict[str, Any]:
        from vllm.inputs import TokensPrompt

        logprobs = msg.get("logprobs")
        params = self._params(
            int(msg["max_tokens"]),
            logprobs=logprobs,
            prompt_logprobs=msg.get("prompt_logprobs"),
        )
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in msg["prompts"]], params, use_tqdm=False)

        def table(entries: Any) -> list[dict[str, float] | None]:
            if entries is None:
                return []
            return [None if e is None else {str(tok): float(lp.logprob) for tok, lp in e.items()} for e in entries]

        return {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "logprobs": [table(o.outputs[0].logprobs) for o in outs],
            "prompt_logprobs": [table(o.prompt_logprobs) for o in outs],
        }

    def _add(self, batch: int, context: int, seed: int, tokens: int) -> list[str]:
        from vllm.inputs import TokensPrompt

        ids = []
        for prompt in _prompts(batch, context, self.vocab, seed):
            self.serial += 1
            rid = f"r{self.serial}"
            params = self._params(tokens, min_tokens=tokens, ignore_eos=True)
            self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
            ids.append(rid)
        return ids

    def prefill(self, msg: dict[str, Any]) -> dict[str, Any]:
        engine = self.llm.llm_engine
        self._add(int(msg["batch"]), int(msg["context"]), int(msg.get("seed", 0)), 1)
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        return {"ms": (time.perf_counter() - start) * 1000.0}

    def decode(self, msg: dict[str, Any]) -> dict[str, Any]:
        engine = self.llm.llm_engine
        new_tokens = int(msg["new_tokens"])
        ids = self._add(int(msg["batch"]), int(msg["context"]), int(msg.get("seed", 0)), new_tokens + 1)
        made = dict.fromkeys(ids, 0)

        def step() -> None:
            for out in engine.step():
                if out.request_id in made:
                    made[out.request_id] = len(out.outputs[0].token_ids)

        while engine.has_unfinished_requests() and min(made.values()) < 1:
            step()  # the prefill, untimed
        first = dict(made)
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            step()
        ms = (time.perf_counter() - start) * 1000.0
        return {"ms": ms, "decoded": [made[r] - first[r] for r in ids]}


def main() -> None:
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM logs to stdout: keep the protocol's channel clean
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: no spawned core to time
    channel = Channel(proto)
    threading.Thread(target=channel.beats, name="headcut-heartbeat", daemon=True).start()
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            if cmd == "quit":
                channel.answer({"ok": True})
                break
            if cmd not in ("load", "generate", "prefill", "decode"):
                raise ValueError(f"unknown command {cmd!r}")
            if cmd != "load" and worker.llm is None:
                raise ValueError("no model loaded")
            channel.begin(cmd)
            answer = getattr(worker, cmd)(msg)
            channel.answer({"ok": True, **answer})
        except Exception as exc:  # the answer carries the failure; headcut decides what it means
            traceback.print_exc(file=sys.stderr)
            why = reason(str(exc))
            channel.answer({"ok": False, "error": f"{type(exc).__name__}: {why}" if why else type(exc).__name__})


if __name__ == "__main__":
    main()
