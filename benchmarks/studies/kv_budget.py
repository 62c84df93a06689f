"""KV-cache budgets (issue 59): the cost-aware allocation against the count-based one at half the KV bytes.

What users ask for is "half the KV cache at 32k tokens", not a number of heads. headcut's ``--kv-budget 0.5
--context N`` keeps at most half the bytes of the cache of one sequence of N tokens, counted per layer kind
(:mod:`headcut.model.kv_cache`). Two allocations of the same scores reach it (:mod:`headcut.pruning.costs`):
``count`` removes units in score order until the bytes fit (every head counted alike: the plain allocation);
``cost`` (the default) places them by score per byte saved (ratio rule with fill-back, the count order with
fill-back, and the exact knapsack of the scores), keeping the candidate of least calibration loss.

Every cut: ``headcut.prune(src, kv_budget=0.5, context=N, allocation=A, data=<speeches>, seed=0)``, the default
decoder recipe (one-shot gradient, whole KV groups, 64 calibration blocks of 256 tokens of the 2012 convention
speeches: ``benchmarks.harness.speeches``), saved, reloaded with ``headcut.load``, then perplexity of the first
16,384 tokens of hamlet.txt in windows of 128 and of 2,048 tokens (``benchmarks.harness.perplexity``, as the
decoder-recipe study reads it; Gemma 3's windows after its BOS token). Models: Gemma 3 270M (18 layers, one KV
head each; layers 5, 11 and 17 global, the others a 512-token sliding window) and SmolLM2-135M (30 layers of 3 KV
heads, all global: every KV head costs the same, the control where the two allocations must agree), at 8,192 and
32,768 tokens; and ``gemma1b``, a synthetic model of Gemma 3 1B's shape (26 layers, one KV head of 256 each, a
512-token window in five layers of six) with RANDOM weights, for speed only, cut by the data-free magnitude scores.
Each cut runs in its own process (2 torch threads), one at a time.

Decode speed (``speed``): per model and context, the unpruned model and both cuts decode greedily from a cache of
that many positions filled with random keys and values of the right shapes (no prefill; the speed does not
depend on the values; ``benchmarks.harness.random_cache``), ``--tokens`` tokens per run timed as
``--target-speedup`` times them, the runs interleaved in ``--rounds`` rounds with the order rotated each round.

    PYTHONPATH=src:. python -m benchmarks.studies.kv_budget cuts [--models gemma3,smollm] [--contexts 8192,32768]
    PYTHONPATH=src:. python -m benchmarks.studies.kv_budget speed [--models gemma3] [--rounds 3] [--tokens 16]
    PYTHONPATH=src:. python -m benchmarks.studies.kv_budget table

Results: ``benchmarks/results/kv_budget.json`` (rows keyed model/context/allocation; the unpruned perplexities
are the decoder-recipe study's rows, the same function on the same tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kv_budget.json"
DECODER_RESULTS = RESULTS.with_name("decoder_recipe.json")
CACHE = Path(os.environ.get("HEADCUT_BENCH_CACHE", Path.home() / ".cache" / "headcut-bench")).expanduser() / "kv-budget"
MODELS = ("gemma3", "smollm")
CONTEXTS = (8192, 32768)
ALLOCATIONS = ("cost", "count")
FRACTION = 0.5
THREADS = 2
#: the unpruned rows of the decoder-recipe study (perplexity of the same tokens, the same function)
UNPRUNED = {"gemma3": "gemma3/unpruned", "smollm": "smollm/unpruned"}


#: the synthetic 1B-class model (speed only): Gemma 3 1B's shape (26 layers, one KV head of 256 in each, a 512-token
#: window in five layers of six), RANDOM weights (seed 0, bfloat16); cut by the data-free magnitude scores
GEMMA1B = {
    "hidden_size": 1152,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "intermediate_size": 6912,
    "vocab_size": 262144,
    "sliding_window": 512,
    "max_position_embeddings": 32768,
    "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(26)],
}
SYNTHETIC = "gemma1b"


def synthetic_gemma1b() -> Path:
    """The random-weight Gemma-3-1B-shaped checkpoint, written once in the cache folder."""
    import torch
    import transformers

    out = CACHE / "gemma1b-random"
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**GEMMA1B)
    model = transformers.Gemma3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def source(model: str) -> Path:
    from benchmarks.harness.hamlet import checkpoint

    return synthetic_gemma1b() if model == SYNTHETIC else checkpoint(model)


def key(model: str, context: int, allocation: str) -> str:
    return f"{model}/{context}/{allocation}"


def folder(model: str, context: int, allocation: str) -> Path:
    return CACHE / f"{model}-{context}-{allocation}"


def load() -> dict[str, Any]:
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data.setdefault("protocol", __doc__.split("\n\n")[0])
    data.setdefault("rows", {})
    return data


def write(data: dict[str, Any]) -> None:
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(RESULTS)


def one(model: str, context: int, allocation: str) -> None:
    """One cut in this process: prune, save, reload, perplexity; its row merged into the results."""
    import torch
    import transformers

    import headcut
    from benchmarks.harness.hamlet import WINDOWS, eval_ids
    from benchmarks.harness.perplexity import perplexity
    from benchmarks.harness.speeches import speeches_file

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    src = source(model)
    synthetic = model == SYNTHETIC
    row: dict[str, Any] = {
        "model": model,
        "context": context,
        "allocation": allocation,
        "fraction": FRACTION,
        "headcut": headcut.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_before": list(os.getloadavg()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = folder(model, context, allocation)
    start = time.perf_counter()
    if synthetic:  # random weights: the data-free magnitude scores (speed only)
        pruned = headcut.prune(src, "magnitude", kv_budget=FRACTION, context=context, allocation=allocation, seed=0)
    else:
        pruned = headcut.prune(
            src,
            kv_budget=FRACTION,
            context=context,
            allocation=allocation,
            data=str(speeches_file()),
            seed=0,
        )
    row["prune_seconds"] = time.perf_counter() - start
    row["kv_budget"] = pruned.report["kv_budget"]
    row["heads"] = {k: pruned.report["heads"][k] for k in ("before", "after")}
    row["mask"] = pruned.mask.to_json()
    row["recipe"] = (pruned.report.get("recipe") or {}).get("name")
    shutil.rmtree(out, ignore_errors=True)
    pruned.save(out)
    del pruned
    if not synthetic:
        ids, bos = eval_ids(src)
        cut = headcut.load(out)
        start = time.perf_counter()
        row["perplexity"] = {str(w): perplexity(cut, ids, w, bos=bos) for w in WINDOWS}
        row["eval_seconds"] = time.perf_counter() - start
    row["load_after"] = list(os.getloadavg())
    data = load()
    data["rows"][key(model, context, allocation)] = row
    write(data)
    print(f"{key(model, context, allocation)}: {row.get('perplexity', 'speed only')}", flush=True)


def cuts(models: list[str], contexts: list[int]) -> None:
    from benchmarks.harness.speeches import speeches_file

    speeches_file()
    for model in models:
        for context in contexts:
            for allocation in ALLOCATIONS:
                env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
                cmd = [sys.executable, "-m", "benchmarks.studies.kv_budget", "one", model, str(context), allocation]
                subprocess.run(cmd, check=False, env=env)


def speed(models: list[str], contexts: list[int], rounds: int, tokens: int) -> None:
    """Decode tokens/s of the unpruned model and both cuts at each context, interleaved (see the module's doc): the
    timing of ``--target-speedup`` (:func:`headcut.jobs.prune.speed_target.timed_decode`, rounds of
    :func:`headcut.model.measure.time_rounds`), from caches of random keys and values."""
    import torch

    import headcut
    from benchmarks.harness.random_cache import model_shape, random_cache
    from headcut.jobs.prune.speed_target import timed_decode
    from headcut.model.measure import time_rounds

    torch.set_num_threads(THREADS)
    cpu = torch.device("cpu")
    data = load()
    for model in models:
        for context in contexts:
            names = ["unpruned", *ALLOCATIONS]
            paths = [source(model)] + [folder(model, context, a) for a in ALLOCATIONS]
            if not all(p.is_dir() for p in paths):
                print(f"{model}@{context}: cuts missing, run `cuts` first", flush=True)
                continue
            calls = []
            for path in paths:
                m = headcut.load(path).eval()
                cache, first = random_cache(m, model_shape(m), context)
                call = timed_decode(m, cache, torch.tensor([[first]]), tokens, cpu)
                call()  # warm-up
                calls.append(call)
            before = list(os.getloadavg())
            times = time_rounds(calls, rounds, [cpu] * len(calls))
            rows = [
                {"name": n, "ms": t, "tokens_per_s_rounds": [tokens * 1000.0 / x for x in t]}
                for n, t in zip(names, times)
            ]
            data.setdefault("speed", {})[f"{model}/{context}"] = {
                "tokens": tokens,
                "rounds": rounds,
                "threads": THREADS,
                "rows": rows,
                "load": [before, list(os.getloadavg())],
                "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            write(data)
            print(
                f"{model}@{context}: " + ", ".join(f"{r['name']} {r['tokens_per_s_rounds']}" for r in rows), flush=True
            )
            del calls


def table() -> str:
    """The rows as a markdown table (the page renders its own: ``benchmarks/harness/kv_budget.py``)."""
    from benchmarks.harness.kv_budget import render_markdown

    return render_markdown(load(), unpruned())


def unpruned() -> dict[str, dict[str, float]]:
    rows = json.loads(DECODER_RESULTS.read_text())["rows"] if DECODER_RESULTS.is_file() else {}
    return {m: rows.get(name, {}).get("perplexity", {}) for m, name in UNPRUNED.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.kv_budget")
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cuts")
    c.add_argument("--models", default=",".join(MODELS))
    c.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    o = sub.add_parser("one")
    o.add_argument("model")
    o.add_argument("context", type=int)
    o.add_argument("allocation")
    s = sub.add_parser("speed")
    s.add_argument("--models", default="gemma3")
    s.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--tokens", type=int, default=16)
    sub.add_parser("table")
    args = parser.parse_args()
    if args.what == "one":
        try:
            one(args.model, args.context, args.allocation)
        except Exception:
            traceback.print_exc()
            raise SystemExit(1) from None
    elif args.what == "cuts":
        cuts(args.models.split(","), [int(c) for c in args.contexts.split(",")])
    elif args.what == "speed":
        speed(args.models.split(","), [int(c) for c in args.contexts.split(",")], args.rounds, args.tokens)
    else:
        print(table())


if __name__ == "__main__":
    main()
