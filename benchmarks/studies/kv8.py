"""The decoder default's cut against vLLM's 8-bit KV cache, and the two composed (issue 70, point 6).

    python -m benchmarks.studies.kv8 prepare                         # the cuts (cached)
    python -m benchmarks.studies.kv8 run --vllm-python V/bin/python  # perplexity and decode speed in vLLM

An 8-bit KV cache (vLLM's ``kv_cache_dtype="fp8"``) halves a 16-bit cache's bytes for almost nothing; a structural
cut has to beat it at equal bytes or compose with it. Model: SmolLM2-135M-Instruct (``headcut_offline``), served by
vLLM's CPU build in bfloat16, so that its own cache holds 2 bytes a value and the 8-bit one 1. Cuts (:data:`CUTS`),
made once by the default recipe on the command line a user runs (``headcut prune SRC --kv-budget F --context 2048
--data speeches.txt --format safetensors,decilm``; the calibration text of ``decoder_recipe.py``) and cached in
``$HEADCUT_BENCH_CACHE/kv8`` (default ``~/.cache/headcut-bench/kv8``): a quarter of the KV bytes at 2,048 tokens
removed, and half of them (the 8-bit cache's bytes). Rows (:data:`ROWS`): each model with its own cache and with
the 8-bit one; the bytes of each, relative to the unpruned model's 16-bit cache, are the cut's fraction times
one half for 8 bits (a quarter cut in 8 bits: 0.375).

Perplexity: ``hamlet.txt``'s first 16,384 tokens (the decoder study's evaluation text, which no calibration reads)
in windows of 128 and 2,048 tokens, every window one prompt, the log-probability vLLM gives each prompt token after
the first (``prompt_logprobs=0``), exp of the mean negative. Decode speed: one ``headcut.bench`` call with
``runtime="vllm"`` and ``kv_cache_dtype="auto,fp8"`` over the three models (six engines, timed interleaved: rounds
of one decode of each, the order rotated), batch 1, a prompt of 8,192 - 33 random tokens then 32 new ones (the
cache ends at 8,192 positions), only the decoding steps timed, on 2 threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kv8.json"
CACHE = Path(os.environ.get("HEADCUT_BENCH_CACHE", Path.home() / ".cache" / "headcut-bench")).expanduser() / "kv8"
#: cut name -> its --kv-budget (at --context 2048)
CUTS = {"quarter": 0.75, "half": 0.5}
#: the rows: (model, vLLM's kv_cache_dtype)
ROWS = (
    ("unpruned", "auto"),
    ("unpruned", "fp8"),
    ("quarter", "auto"),
    ("quarter", "fp8"),
    ("half", "auto"),
    ("half", "fp8"),
)
CONTEXT = 8192
GEN_TOKENS = 32
DTYPE = "bfloat16"


def _source() -> str:
    from headcut_offline import smollm_dir

    return str(smollm_dir())


def prepare(cuts: list[str] | None = None) -> dict[str, str]:
    """The folders vLLM serves: the unpruned model's and each cut's DeciLM (made once, with ``headcut prune``);
    ``cuts``: those of :data:`CUTS` to make (all by default)."""
    from benchmarks.harness.speeches import speeches_file

    src = _source()
    folders = {"unpruned": src}
    CACHE.mkdir(parents=True, exist_ok=True)
    for name, budget in CUTS.items():
        if cuts is not None and name not in cuts:
            continue
        out = CACHE / name
        if not (out / "headcut-report.json").is_file():
            cmd = [
                "headcut", "prune", src, "--kv-budget", str(budget), "--context", "2048",
                "--data", str(speeches_file()), "--format", "safetensors,decilm", "--out", str(out), "--force",
            ]  # fmt: skip
            print("+", " ".join(cmd), file=sys.stderr, flush=True)
            start = time.time()
            subprocess.run(cmd, check=True)
            (out / "prune-seconds.txt").write_text(f"{time.time() - start:.0f}\n")
        folders[name] = str(out / "decilm")
    return folders


def _perplexities(folder: str, cache: str, python: str | None) -> dict[str, float]:
    from benchmarks.harness.hamlet import WINDOWS, eval_ids
    from headcut.jobs.bench.vllm_rows import serve

    ids, bos = eval_ids(Path(_source()))
    assert bos is None  # SmolLM2's tokenizer adds no BOS: every window is read from its first token
    out = {}
    for window in WINDOWS:
        prompts = [ids[s : s + window].tolist() for s in range(0, len(ids) - window + 1, window)]
        served = serve(
            folder,
            prompts,
            1,
            python=python,
            dtype=DTYPE,
            prompt_logprobs=0,
            trust_remote_code=True,
            kv_cache_dtype=cache,
        )
        nll, count = 0.0, 0
        for prompt, table in zip(prompts, served["prompt_logprobs"], strict=True):
            for position in range(1, len(prompt)):
                nll -= table[position][str(prompt[position])]
                count += 1
        out[str(window)] = math.exp(nll / count)
    return out


def _facts(folder: str) -> dict[str, Any]:
    """What the prune report says of a cut: the KV bytes it keeps, its allocation, the wall time."""
    cut = Path(folder).parent
    report = json.loads((cut / "headcut-report.json").read_text())
    kv = report.get("kv_budget") or {}
    seconds = cut / "prune-seconds.txt"
    return {
        "kv_fraction": kv.get("reached"),
        "bytes_after": kv.get("bytes_after"),
        "bytes_before": kv.get("bytes_before"),
        "recipe": (report.get("recipe") or {}).get("name"),
        "allocate": {k: v for k, v in (report.get("allocate") or {}).items() if k in ("rounds", "notes")},
        "prune_seconds": float(seconds.read_text()) if seconds.is_file() else None,
    }


def run(args: argparse.Namespace) -> None:
    import torch

    import headcut

    folders = prepare(args.cuts.split(",") if args.cuts else None)
    data: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    started = time.time()
    rows = data.setdefault("rows", {})
    for model, cache in ROWS:
        if model not in folders:
            continue
        key = f"{model}/{cache}"
        if key in rows and "perplexity" in rows[key] and not args.rerun:
            continue
        print(f"perplexity: {key}", file=sys.stderr, flush=True)
        rows[key] = {
            "model": model,
            "kv_cache_dtype": cache,
            "perplexity": _perplexities(folders[model], cache, args.vllm_python),
        }
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    names = list(folders)
    print(f"decode at {CONTEXT}: {', '.join(names)} x auto, fp8", file=sys.stderr, flush=True)
    res = headcut.bench(
        [folders[n] for n in names],
        names=names,
        runtime="vllm",
        vllm_python=args.vllm_python,
        kv_cache_dtype="auto,fp8",
        trust_remote_code=True,
        batch_size=1,
        seq_len=CONTEXT - GEN_TOKENS - 1,
        gen_tokens=GEN_TOKENS,
        runs=args.runs,
        gen_runs=args.runs,
        warmup=1,
        dtype=DTYPE,
        threads=args.threads,
    )
    data["bench"] = res.report
    data["cuts"] = {n: _facts(folders[n]) for n in folders if n != "unpruned"}
    data["machine"] = {
        "cpu": res.report.get("device_name"),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "headcut": headcut.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    data["seconds"] = data.get("seconds", 0) + round(time.time() - started)
    data["command"] = "python -m benchmarks.studies.kv8 run --vllm-python V/bin/python"
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.studies.kv8")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--cuts", default=None, help="comma-separated names of CUTS (default: all)")
    r = sub.add_parser("run")
    r.add_argument("--cuts", default=None, help="comma-separated names of CUTS (default: all)")
    r.add_argument("--vllm-python", default=None)
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--rerun", action="store_true")
    args = ap.parse_args()
    if args.cmd == "prepare":
        print(json.dumps(prepare(args.cuts.split(",") if args.cuts else None), indent=1))
    else:
        run(args)


if __name__ == "__main__":
    main()
