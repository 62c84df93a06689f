"""Long-context decoding: decode tokens/s and KV-cache bytes of decoders with whole KV groups removed.

    python -m benchmarks.studies.long_context [--models smollm,gemma3,llama1b] [--contexts 2048,8192] [--rounds 3]
                                      [--runtimes torch,llamacpp,llamacpp-fa] [--llamacpp-contexts 2048]
                                      [--threads 1] [--llamacpp-threads 1] [--skip RUNTIME:MODEL:CONTEXT,...]
                                      [--out benchmarks/results/long_context.json] [--profile]
    python -m benchmarks.studies.long_context --render benchmarks/results/long_context.json   # the tables again

The numbers in ``benchmarks/results/long_context.json`` came from

    python -m benchmarks.studies.long_context --runtimes torch,llamacpp,llamacpp-fa --skip llamacpp-fa:llama1b:8192 --profile

(about 55 minutes on 2 cores, with the cuts, GGUF files and the synthetic model already in the cache folder;
preparing those once took about 40 minutes more on the loaded machine, most of it the four gradient prunes).

What users prune decoders for: the speed of generating tokens after a long prompt, and the KV cache that
prompt occupies. Per model, cut and prompt length P (``--contexts``), 128 tokens (``--gen``) are decoded
greedily after the prompt.

Models (``--models``):

* ``smollm``: SmolLM2-135M-Instruct (real weights, ``headcut_offline.smollm_dir``; Llama, 30 layers x 3 KV
  heads x 3 query heads, head_dim 64);
* ``gemma3``: Gemma 3 270M (real weights, ``headcut_offline.gemma3_dir``; 18 layers x 1 KV head x 4 query
  heads, head_dim 256; sliding window 512 in every layer but the global layers 5, 11 and 17);
* ``llama1b``: a synthetic Llama with the shape of Llama-3.2-1B (hidden 2048, 16 layers, 32 heads, 8 KV heads,
  head_dim 64, intermediate 8192, vocab 128256, tied embeddings) with RANDOM weights (seed 0, bfloat16, saved
  once in the cache folder with SmolLM2's tokenizer files so that a GGUF can be written): for speed only,
  its outputs mean nothing.

Cuts per model, made with headcut's own API and cached in ``$HEADCUT_BENCH_CACHE`` (default
``~/.cache/headcut-bench``): unpruned; 1/3 of the KV groups removed; 1/2 removed. The real models are cut by
``headcut.prune(src, "gradient", gqa="group", ...)`` with one-shot gradient scores on the first half of
hamlet.txt (256-token blocks; 64 blocks for SmolLM2, 8 for Gemma 3, as the harness's KV studies score them):
SmolLM2 1/3 = one KV group in every layer (``uniform=True``: 60 of 90 groups kept), 1/2 = the 45 lowest-scored
of the 90 groups; Gemma 3 has one KV head per layer, so each group removed empties that layer's attention: 1/3 =
6 layers, 1/2 = 9 layers (the report names them). The synthetic model is cut by ``headcut.export`` with
seeded random group masks (43 and 64 of its 128 groups; a group = a KV head and its 4 query heads).

PyTorch runtime (``torch``; the checkpoint's dtype: float32 for the real models, bfloat16 for the synthetic
one; ``torch.set_num_threads(--threads)``): the prompt is prefilled ONCE per model and context (real token ids:
the model's tokenisation of hamlet.txt, repeated as needed; in chunks of 2048 tokens, logits of the last
position only). For the synthetic model the cache is instead filled with random values of the right shapes
(no prefill: a 1B prefill of 8k tokens takes many minutes on 2 cores; its decode speed does not depend on
the values). Then each timed run decodes 128 tokens greedily from a fresh copy of that cache: a loop calling
the model with one token and the cache under ``torch.inference_mode``. Runs are INTERLEAVED: in round
r = 1..R every model of the same base and context decodes once, the order rotated by one each round.

llama.cpp runtimes (``llamacpp``: llama-cpp-python's defaults, flash attention off; ``llamacpp-fa``: flash
attention on): the same models written by headcut as f16 GGUF
(``headcut.export(folder, {"drop": {}}, formats="gguf", gguf_type="f16")``; Llama-arch GGUF holds any per-layer
cut, written as llama.cpp's ``deci`` arch when the layers differ). Gemma 3 GGUF holds only the same head counts in
every layer, so Gemma's emptied-layer cuts cannot be written: Gemma 3 is skipped there. Each model is loaded
once per context (``n_ctx`` = P + 256, ``n_threads`` = ``n_threads_batch`` = ``--llamacpp-threads``, llama.cpp's
default f16 KV cache), prefilled once; its state is saved and restored before every timed run; a run decodes 128 tokens
greedily (``eval`` of one token at a time; only this generation phase is timed), interleaved as above.

Reported per model: tokens/s (median over rounds, p25-p75), speed-up = median tokens/s / the unpruned
model's median, the median of the paired per-round ratios and their p25-p75; "within noise" when that p25-p75
interval of the paired ratios contains 1.

KV cache: for PyTorch exactly the bytes of the distinct storages of the cache's key/value tensors after the
128 tokens, asserted equal to sum over layers of kept KV heads x head_dim x 2 (K and V) x positions x bytes per
value, positions = P + 128 (a sliding-window layer holds at most its window, 512: transformers keeps the last
511 positions as a view of the 512 it concatenated), plus, for a layer whose attention was emptied, headcut's
placeholder of 1 value per position for K and for V (transformers reads the cache length off the layer's keys).
For llama.cpp the bytes it allocates (f16): K = sum over layers of KV heads x head_dim x n_ctx x 2; V the same with
flash attention, but without it (V stored transposed) every layer's V is padded to the widest layer's when the
layers differ (a non-uniform cut, arch ``deci``); asserted equal to llama.cpp's own log line.

Ideal speed-up: decode is memory-bound, so the work of a generated token is the bytes it reads: the weights of
everything it passes through (every linear layer's weight and bias, the LM head in full even when tied to the
embeddings, the norms; the embedding lookup reads one row) plus the KV-cache bytes attention reads at that
step (kept KV heads x head_dim x 2 x the positions attended, capped at the window in sliding layers; an emptied
layer reads nothing). The work of a run is the sum over its 128 steps; ideal = work(unpruned) / work(pruned);
reported: measured speed-up / ideal. Bytes per value: the runtime's dtype (llama.cpp: 2 for the f16 matrices,
4 for the norms).

Threads: 1 by default for both runtimes. On this 2-core machine shared with other jobs, 2 threads collapsed
whenever the others loaded it (every parallel op waits for a core: 7x slower in PyTorch, 100x in llama.cpp at a
load of 4-5), while 1 thread lost only 10-25 % when the machine was quiet; ``--thread-probe`` (on by default)
records both at the start of the run.

Machine load: ``os.getloadavg()`` before and after every round (other agents run jobs on the same machine).
Progress goes to stderr (at least every 30 s), the rendered tables to stdout, all numbers to ``--out``.
``--profile`` adds a torch.profiler table of 16 decode steps of every torch model at the last context.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.long_context import (
    GEN_TOKENS,
    IDEAL_TEXT,
    THREAD_NOTE,
    render_markdown,
)
from benchmarks.harness.random_cache import Shape, fresh_copy, model_shape, random_cache
from benchmarks.harness.store import RESULTS
from headcut.stats import round_order

DEFAULT_OUT = RESULTS / "long_context.json"
CACHE = Path(os.environ.get("HEADCUT_BENCH_CACHE", Path.home() / ".cache" / "headcut-bench")).expanduser()
PREFILL_CHUNK = 2048
#: cut name -> fraction of the KV groups removed
CUTS = {"unpruned": 0, "1/3": 1 / 3, "1/2": 1 / 2}
#: the synthetic model's shape (Llama-3.2-1B)
LLAMA1B = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
BASES = {
    "smollm": "SmolLM2-135M-Instruct (real weights)",
    "gemma3": "Gemma 3 270M (real weights)",
    "llama1b": "synthetic Llama-3.2-1B shape (RANDOM weights: speed only)",
}
_START = time.monotonic()
_LAST = [0.0]


def log(message: str) -> None:
    _LAST[0] = time.monotonic()
    print(
        f"[long_context {time.strftime('%H:%M:%S')} +{(time.monotonic() - _START) / 60:.1f} min] {message}",
        file=sys.stderr,
        flush=True,
    )


def heartbeat(every: float = 28.0) -> None:
    """A daemon thread writing a line when nothing was logged for ``every`` seconds (long single steps: loading,
    writing a GGUF, a prune on first use)."""
    import threading

    def beat() -> None:
        while True:
            time.sleep(5.0)
            if time.monotonic() - _LAST[0] >= every:
                log("still working")

    threading.Thread(target=beat, daemon=True).start()


def tick(message: Callable[[], str], every: float = 25.0) -> None:
    """A progress line when none was written for ``every`` seconds."""
    if time.monotonic() - _LAST[0] >= every:
        log(message())


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """p25, median, p75 (linear interpolation between the sorted values, as numpy's default)."""
    s = sorted(values)

    def q(p: float) -> float:
        x = p * (len(s) - 1)
        lo, hi = math.floor(x), math.ceil(x)
        return s[lo] + (s[hi] - s[lo]) * (x - lo)

    return q(0.25), q(0.5), q(0.75)


# ---- models and cuts -----------------------------------------------------------------------------------------


@dataclass
class Cut:
    base: str
    name: str
    folder: Path
    kv_heads: list[int]  # kept KV heads per layer
    heads: list[int]  # kept query heads per layer
    groups_removed: int
    groups_total: int
    emptied_layers: list[int]
    mask: dict[str, Any] | None
    how: str
    gguf: Path | None = None
    gguf_info: dict[str, Any] = field(default_factory=dict)


def _done(folder: Path) -> bool:
    return (folder / ".long-context-done").exists()


def _mark(folder: Path, info: dict[str, Any]) -> None:
    (folder / ".long-context-done").write_text(json.dumps(info, indent=1))


def _hamlet_halves() -> tuple[Path, Path]:
    import headcut_offline as offline

    text = offline.hamlet_path().read_text()
    half = len(text) // 2
    a = CACHE / "hamlet-first-half.txt"
    if not a.exists() or a.read_text() != text[:half]:
        a.write_text(text[:half])
    return a, offline.hamlet_path()


def _source(base: str) -> Path:
    import headcut_offline as offline

    if base == "smollm":
        return offline.smollm_dir()
    if base == "gemma3":
        return offline.gemma3_dir()
    if base == "llama1b":
        return synthetic_llama1b()
    raise SystemExit(f"unknown model {base!r}; choose from {', '.join(BASES)}")


def synthetic_llama1b() -> Path:
    """The random-weight Llama-3.2-1B-shaped checkpoint (bfloat16, seed 0), written once; SmolLM2's tokenizer
    files beside it (its ids are all below 128256; the GGUF writer pads the vocabulary)."""
    import torch
    import transformers

    import headcut_offline as offline

    folder = CACHE / "llama1b-random"
    if _done(folder):
        return folder
    log("writing the synthetic 1B Llama (random weights, bfloat16) once")
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA1B)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    src = offline.smollm_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, folder / name)
    del model
    _mark(folder, {"seed": 0, "dtype": "bfloat16", **LLAMA1B})
    return folder


def _describe(base: str, name: str, folder: Path, mask: dict[str, Any] | None, how: str, total: int) -> Cut:
    """The cut as loaded back: kept KV and query heads per layer (``total``: the source's KV groups; a uniform
    cut's saved config has the new per-layer count)."""
    import torch

    import headcut

    model = headcut.load(folder)
    blocks = headcut.model_blocks(model)
    kv = [b.kv_heads for b in blocks]
    heads = [b.heads for b in blocks]
    del model
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return Cut(
        base=base,
        name=name,
        folder=folder,
        kv_heads=kv,
        heads=heads,
        groups_removed=total - sum(kv),
        groups_total=total,
        emptied_layers=[i for i, k in enumerate(kv) if k == 0],
        mask=mask,
        how=how,
    )


def _groups_mask(config: Any, groups: list[tuple[int, int]]) -> dict[str, Any]:
    """Drop every query head of the KV groups ``(layer, group)``."""
    size = config.num_attention_heads // config.num_key_value_heads
    drop: dict[str, list[int]] = {}
    for layer, g in sorted(groups):
        drop.setdefault(f"self.{layer}", []).extend(range(g * size, (g + 1) * size))
    return {"drop": drop}


def make_cuts(base: str) -> list[Cut]:
    """The three cuts of a model (cached)."""
    import transformers

    import headcut

    src = _source(base)
    config = transformers.AutoConfig.from_pretrained(src)
    layers, kvh = config.num_hidden_layers, config.num_key_value_heads
    size = config.num_attention_heads // kvh
    total = layers * kvh
    cuts = [_describe(base, "unpruned", src, None, "the checkpoint as it is", total)]
    for name, frac in list(CUTS.items())[1:]:
        removed = round(total * frac)
        folder = CACHE / f"{base}-{name.replace('/', 'of')}"
        if base == "llama1b":
            rng = random.Random(0 if name == "1/3" else 1)
            groups = rng.sample([(i, g) for i in range(layers) for g in range(kvh)], removed)
            mask = _groups_mask(config, groups)
            how = f"headcut.export with a seeded random mask of {removed} of the {total} KV groups"
            if not _done(folder):
                log(f"{base} {name}: exporting ({how})")
                shutil.rmtree(folder, ignore_errors=True)
                headcut.export(src, mask).save(folder)
                _mark(folder, {"mask": mask})
        else:
            uniform = base == "smollm" and name == "1/3"
            cal_blocks = 64 if base == "smollm" else 8
            data_options = {
                "seq_len": 256,
                "max_examples": cal_blocks,
                **({"batch_size": 2} if base == "gemma3" else {}),
            }
            how = (
                f"headcut.prune(method='gradient', keep={(total - removed) * size}, gqa='group'"
                f"{', uniform=True' if uniform else ''}), one-shot scores of {cal_blocks} blocks of 256 tokens of "
                "the first half of hamlet.txt"
            )
            if not _done(folder):
                log(f"{base} {name}: pruning ({how})")
                shutil.rmtree(folder, ignore_errors=True)
                cal, _ = _hamlet_halves()
                t0 = time.perf_counter()
                res = headcut.prune(
                    src,
                    "gradient",
                    keep=(total - removed) * size,
                    gqa="group",
                    uniform=uniform,
                    data=str(cal),
                    data_options=data_options,
                    out=folder,
                )
                _mark(folder, {"mask": res.mask.to_json(), "seconds": round(time.perf_counter() - t0, 1)})
                log(f"{base} {name}: pruned in {time.perf_counter() - t0:.0f} s")
            mask = json.loads((folder / ".long-context-done").read_text())["mask"]
        cut = _describe(base, name, folder, mask, how, total)
        assert cut.groups_removed == removed, (base, name, cut.groups_removed, removed)
        cuts.append(cut)
    return cuts


def write_gguf(cut: Cut) -> None:
    """The cut's f16 GGUF (headcut.export of the cut folder with an empty mask, written as GGUF only)."""
    import headcut

    folder = CACHE / f"{cut.base}-{cut.name.replace('/', 'of')}-gguf"
    if not _done(folder):
        log(f"{cut.base} {cut.name}: writing the f16 GGUF")
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        headcut.export(cut.folder, {"drop": {}}, formats="gguf", gguf_type="f16").save(folder)
        report = json.loads((folder / "headcut-report.json").read_text())
        _mark(folder, {"gguf": report.get("formats", {}).get("gguf"), "seconds": round(time.perf_counter() - t0, 1)})
    info = json.loads((folder / ".long-context-done").read_text())["gguf"]
    cut.gguf = folder / info["file"]
    cut.gguf_info = {k: info.get(k) for k in ("arch", "outtype", "bytes", "head_count", "head_count_kv", "file")}


# ---- bytes: KV cache and the ideal ---------------------------------------------------------------------------


def run_work_bytes(shape: Shape, prompt: int, gen: int, bytes_2d: int, bytes_1d: int, kv_bytes: int) -> int:
    """Bytes read by ``gen`` decode steps after ``prompt`` positions: per step, the weights plus the KV cache
    attended (the step's own position included; sliding layers capped at their window)."""
    weights = shape.weight_values_2d * bytes_2d + shape.weight_values_1d * bytes_1d
    total = 0
    for step in range(gen):
        attended = prompt + step + 1
        kv = sum(
            k * shape.head_dim * 2 * (min(attended, w) if w else attended) * kv_bytes
            for k, w in zip(shape.kv_heads, shape.windows)
        )
        total += weights + kv
    return total


def expected_torch_kv(shape: Shape, positions: int) -> dict[str, int]:
    heads = placeholder = 0
    for k, w in zip(shape.kv_heads, shape.windows):
        pos = min(positions, w) if w else positions
        if k:
            heads += k * shape.head_dim * 2 * pos * shape.dtype_bytes
        else:
            placeholder += 1 * 2 * pos * shape.dtype_bytes
    return {"heads": heads, "placeholder": placeholder}


def measured_torch_kv(cache: Any, shape: Shape) -> dict[str, Any]:
    """Distinct storages of the cache's keys and values, split into layers with KV heads and emptied layers."""
    seen: set[int] = set()
    heads = placeholder = 0
    per_layer = []
    for i, layer in enumerate(cache.layers):
        n = 0
        for t in (layer.keys, layer.values):
            st = t.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                n += st.nbytes()
        per_layer.append(n)
        if shape.kv_heads[i]:
            heads += n
        else:
            placeholder += n
    return {"heads": heads, "placeholder": placeholder, "per_layer": per_layer}


# ---- PyTorch -------------------------------------------------------------------------------------------------


def prompt_ids(folder: Path, length: int) -> list[int]:
    import transformers

    import headcut_offline as offline

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = offline.hamlet_path().read_text()
    ids = tok(text)["input_ids"]
    body = ids[1:] if tok.bos_token_id is not None and ids and ids[0] == tok.bos_token_id else ids
    while len(ids) < length:
        ids = ids + body
    return ids[:length]


def prefill(model: Any, ids: list[int], what: str) -> tuple[Any, int]:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    logits = None
    with torch.inference_mode():
        for start in range(0, len(ids), PREFILL_CHUNK):
            chunk = torch.tensor([ids[start : start + PREFILL_CHUNK]])
            t0 = time.perf_counter()
            logits = model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1).logits
            log(
                f"{what}: prefilled {min(start + PREFILL_CHUNK, len(ids))}/{len(ids)} tokens "
                f"({time.perf_counter() - t0:.1f} s for this chunk)"
            )
    assert logits is not None
    return cache, int(logits[0, -1].argmax())


def decode(model: Any, cache: Any, first: int, n: int, what: str) -> tuple[float, list[int]]:
    import torch

    tokens = []
    tok = torch.tensor([[first]])
    with torch.inference_mode():
        t0 = time.perf_counter()
        for i in range(n):
            logits = model(input_ids=tok, cache=cache, use_cache=True).logits
            tok = logits[:, -1:].argmax(-1)
            tokens.append(tok)
            tick(lambda: f"{what}: {i + 1}/{n} tokens, {time.perf_counter() - t0:.0f} s")
        seconds = time.perf_counter() - t0
    return seconds, [int(t) for t in tokens]


def summarize(base_rows: list[dict[str, Any]]) -> None:
    """Medians, spreads and paired ratios against the first (unpruned) row, in place."""
    ref = base_rows[0]["tokens_per_s_rounds"]
    for row in base_rows:
        tps = row["tokens_per_s_rounds"]
        p25, med, p75 = quartiles(tps)
        row.update(tokens_per_s=med, tokens_per_s_p25=p25, tokens_per_s_p75=p75)
        ratios = [a / b for a, b in zip(tps, ref)]
        r25, rmed, r75 = quartiles(ratios)
        row.update(
            paired_ratios=ratios,
            paired_ratio_median=rmed,
            paired_ratio_p25=r25,
            paired_ratio_p75=r75,
            speedup=med / quartiles(ref)[1],
        )
        row["within_noise"] = None if row is base_rows[0] else bool(r25 <= 1.0 <= r75)
        row["faster_beyond_noise"] = None if row is base_rows[0] else bool(r25 > 1.0)
        row["speedup_over_ideal"] = row["speedup"] / row["ideal"]
        row["paired_speedup_over_ideal"] = rmed / row["ideal"]


def profile_decode(model: Any, cache: Any, first: int, steps: int = 16) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    tok = torch.tensor([[first]])
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for _ in range(steps):
            tok = model(input_ids=tok, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48)


def run_torch(
    base: str, cuts: list[Cut], contexts: list[int], rounds: int, threads: int, gen: int, profile: bool
) -> dict[str, Any]:
    import torch

    import headcut

    torch.set_num_threads(threads)
    models, shapes = [], []
    for cut in cuts:
        log(f"torch {base}: loading {cut.name} from {cut.folder}")
        model = headcut.load(cut.folder)
        models.append(model)
        shapes.append(model_shape(model))
    out: dict[str, Any] = {
        "dtype": str(next(models[0].parameters()).dtype).removeprefix("torch."),
        "attn_implementation": models[0].config._attn_implementation,
        "prefill": "random cache values (no prefill)"
        if base == "llama1b"
        else f"real prefill of hamlet.txt token ids in chunks of {PREFILL_CHUNK}",
        "contexts": {},
    }
    for ctx in contexts:
        log(f"torch {base} @ {ctx}: preparing the caches")
        caches = []
        ids = None if base == "llama1b" else prompt_ids(cuts[0].folder, ctx)
        for cut, model, shape in zip(cuts, models, shapes):
            t0 = time.perf_counter()
            if ids is None:
                caches.append(random_cache(model, shape, ctx, seed=ctx))
            else:
                caches.append(prefill(model, ids, f"torch {base} {cut.name} @ {ctx}"))
            log(f"torch {base} {cut.name} @ {ctx}: cache ready in {time.perf_counter() - t0:.1f} s")
        # one untimed warm-up decode of 4 tokens per model (allocator, lazy initialisation)
        for cut, model, (cache, first) in zip(cuts, models, caches):
            decode(model, fresh_copy(cache), first, 4, f"warm-up {cut.name}")
        rows = []
        for cut, shape in zip(cuts, shapes):
            exp = expected_torch_kv(shape, ctx + gen)
            rows.append(
                {
                    "cut": cut.name,
                    "kv_heads_kept": sum(cut.kv_heads),
                    "kv_heads_total": cut.groups_total,
                    "heads_kept": sum(cut.heads),
                    "emptied_layers": cut.emptied_layers,
                    "context": ctx,
                    "tokens_per_s_rounds": [],
                    "kv_expected_bytes": exp["heads"] + exp["placeholder"],
                    "kv_expected_heads_bytes": exp["heads"],
                    "kv_expected_placeholder_bytes": exp["placeholder"],
                    "work_bytes": run_work_bytes(
                        shape, ctx, gen, shape.dtype_bytes, shape.dtype_bytes, shape.dtype_bytes
                    ),
                    "weight_bytes_per_token": shape.weight_values_2d * shape.dtype_bytes
                    + shape.weight_values_1d * shape.dtype_bytes,
                }
            )
        for row in rows:
            row["ideal"] = rows[0]["work_bytes"] / row["work_bytes"]

        def one(j: int, r: int, models: list[Any] = models, caches: list[Any] = caches) -> tuple[float, list[int], str]:
            cut, model, (cache, first) = cuts[j], models[j], caches[j]
            work = fresh_copy(cache)
            seconds, toks = decode(model, work, first, gen, f"torch {base} {cut.name} @ {ctx} round {r + 1}")
            kv = measured_torch_kv(work, shapes[j])
            row = rows[j]
            assert kv["heads"] == row["kv_expected_heads_bytes"], (base, cut.name, ctx, kv, row)
            assert kv["placeholder"] == row["kv_expected_placeholder_bytes"], (base, cut.name, ctx, kv, row)
            row["kv_cache_bytes"] = kv["heads"] + kv["placeholder"]
            row["kv_cache_heads_bytes"] = kv["heads"]
            row["kv_cache_placeholder_bytes"] = kv["placeholder"]
            return (
                seconds,
                toks,
                (f", KV {kv['heads'] / 2**20:.2f} MiB (+{kv['placeholder'] / 2**10:.1f} KiB placeholders)"),
            )

        loads = interleaved_rounds([c.name for c in cuts], rows, rounds, gen, f"torch {base}", ctx, one)
        entry: dict[str, Any] = {"rows": rows, "load": loads}
        if profile and ctx == contexts[-1]:
            entry["profile"] = {}
            for cut, model, (cache, first) in zip(cuts, models, caches):
                log(f"profiling {base} {cut.name} @ {ctx}")
                entry["profile"][cut.name] = profile_decode(model, fresh_copy(cache), first)
                print(
                    f"\n### profile: torch {base} {cut.name} @ {ctx}, 16 decode steps\n{entry['profile'][cut.name]}",
                    file=sys.stderr,
                    flush=True,
                )
        out["contexts"][str(ctx)] = entry
        del caches
        gc.collect()
    del models
    gc.collect()
    return out


# ---- llama.cpp -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def captured_stderr_fd() -> Any:
    """Capture what C code writes to file descriptor 2 (llama.cpp's log) into a temporary file."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        box: dict[str, str] = {}
        try:
            yield box
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            box["text"] = tmp.read().decode("utf-8", "replace")


def llamacpp_kv_bytes(cut: Cut, head_dim: int, n_ctx: int, flash_attn: bool) -> dict[str, int]:
    """The f16 KV cache llama.cpp allocates: K per layer (KV heads x head_dim x n_ctx); V the same with flash
    attention, but without it (V stored transposed) every layer's V is padded to the widest layer's when the
    layers' widths differ (llama-kv-cache.cpp: "the V embeddings have different sizes across layers and FA is
    not enabled - padding V cache"), emptied layers included."""
    k = sum(kv * head_dim * n_ctx * 2 for kv in cut.kv_heads)
    variable = len(set(cut.kv_heads)) > 1
    v = k if flash_attn or not variable else len(cut.kv_heads) * max(cut.kv_heads) * head_dim * n_ctx * 2
    return {"k": k, "v": v, "total": k + v, "per_layer_heads": 2 * k}


def run_llamacpp(
    base: str, cuts: list[Cut], contexts: list[int], rounds: int, threads: int, gen: int, flash_attn: bool = False
) -> dict[str, Any]:
    import llama_cpp
    from llama_cpp import Llama

    import headcut

    shapes = []
    for cut in cuts:
        write_gguf(cut)
        model = headcut.load(cut.folder)
        shapes.append(model_shape(model))
        del model
        gc.collect()
    out: dict[str, Any] = {"kv_type": "f16", "threads": threads, "flash_attn": flash_attn, "contexts": {}}
    for ctx in contexts:
        n_ctx = ctx + 256
        ids = prompt_ids(cuts[0].folder, ctx)
        llms, states, firsts, rows = [], [], [], []
        for cut, shape in zip(cuts, shapes):
            log(f"llama.cpp {base} {cut.name} @ {ctx}: loading {cut.gguf.name} ({cut.gguf_info.get('arch')})")
            with captured_stderr_fd() as box:
                llm = Llama(
                    str(cut.gguf),
                    n_ctx=n_ctx,
                    n_batch=512,
                    n_ubatch=512,
                    n_threads=threads,
                    n_threads_batch=threads,
                    flash_attn=flash_attn,
                    verbose=True,
                )
            llama_cpp._logger.set_verbose(False)
            llm.verbose = False
            kv_lines = [
                ln.strip()
                for ln in box["text"].splitlines()
                if ("MiB" in ln and ("KV" in ln or "kv" in ln)) or "padding V cache" in ln
            ]
            t0 = time.perf_counter()
            for start in range(0, ctx, 512):
                llm.eval(ids[start : start + 512])
                tick(lambda: f"llama.cpp {base} {cut.name} @ {ctx}: prefill {min(start + 512, ctx)}/{ctx}")
            prefill_s = time.perf_counter() - t0
            log(f"llama.cpp {base} {cut.name} @ {ctx}: prefilled in {prefill_s:.1f} s")
            firsts.append(_last_token(llm))
            states.append(_save_state(llm))
            llms.append(llm)
            kv = llamacpp_kv_bytes(cut, shape.head_dim, llm.n_ctx(), flash_attn)
            rows.append(
                {
                    "cut": cut.name,
                    "kv_heads_kept": sum(cut.kv_heads),
                    "kv_heads_total": cut.groups_total,
                    "heads_kept": sum(cut.heads),
                    "emptied_layers": cut.emptied_layers,
                    "context": ctx,
                    "n_ctx": llm.n_ctx(),
                    "arch": cut.gguf_info.get("arch"),
                    "gguf_bytes": cut.gguf_info.get("bytes"),
                    "kv_cache_bytes": kv["total"],
                    "kv_k_bytes": kv["k"],
                    "kv_v_bytes": kv["v"],
                    "kv_per_layer_heads_bytes": kv["per_layer_heads"],
                    "llamacpp_log_kv": kv_lines,
                    "tokens_per_s_rounds": [],
                    "prefill_seconds": round(prefill_s, 2),
                    "work_bytes": run_work_bytes(shape, ctx, gen, 2, 4, 2),
                    "weight_bytes_per_token": shape.weight_values_2d * 2 + shape.weight_values_1d * 4,
                }
            )
        for row in rows:
            row["ideal"] = rows[0]["work_bytes"] / row["work_bytes"]
            row["kv_log_matches"] = _kv_log_matches(row)
            assert row["kv_log_matches"] is not False, (base, row["cut"], row["kv_cache_bytes"], row["llamacpp_log_kv"])

        def one(j: int, r: int, llms: list[Any] = llms, states: list[Any] = states) -> tuple[float, list[int], str]:
            llm, cut = llms[j], cuts[j]
            _load_state(llm, states[j], ctx)
            tok, toks = firsts[j], []
            t0 = time.perf_counter()
            for i in range(gen):
                llm.eval([tok])
                tok = _last_token(llm)
                toks.append(tok)
                tick(lambda: f"llama.cpp {base} {cut.name} @ {ctx} round {r + 1}: {i + 1}/{gen}")
            return time.perf_counter() - t0, toks, ""

        loads = interleaved_rounds([c.name for c in cuts], rows, rounds, gen, f"llama.cpp {base}", ctx, one)
        out["contexts"][str(ctx)] = {"rows": rows, "load": loads}
        for llm in llms:
            llm.close()
        del llms, states
        gc.collect()
    out["llama_cpp_python"] = llama_cpp.__version__
    return out


def interleaved_rounds(
    names: list[str],
    rows: list[dict[str, Any]],
    rounds: int,
    gen: int,
    what: str,
    ctx: int,
    one: Callable[[int, int], tuple[float, list[int], str]],
) -> list[dict[str, Any]]:
    """``rounds`` rounds of one greedy decode of every cut, the order rotated each round (headcut bench's
    ``round_order``): ``one(j, r)`` decodes cut ``j`` in round ``r`` and returns (seconds, tokens, more for the log
    line). Appends each round's tokens/s to ``rows[j]["tokens_per_s_rounds"]``, checks that a cut's greedy tokens
    are the same every round, summarises the rows and sets their ``first_tokens``; returns each round's order
    and machine load."""
    loads = []
    outputs: list[list[int] | None] = [None] * len(names)
    for r in range(rounds):
        order = round_order(len(names), r)
        before = load_avg()
        for j in order:
            seconds, toks, more = one(j, r)
            assert outputs[j] is None or outputs[j] == toks, f"{names[j]}: greedy tokens differ between rounds"
            outputs[j] = toks
            rows[j]["tokens_per_s_rounds"].append(gen / seconds)
            log(f"{what} {names[j]} @ {ctx} round {r + 1}/{rounds}: {gen / seconds:.2f} tokens/s{more}")
        loads.append({"round": r + 1, "order": [names[j] for j in order], "before": before, "after": load_avg()})
    summarize(rows)
    for row, toks in zip(rows, outputs):
        row["first_tokens"] = (toks or [])[:8]
    return loads


def _last_token(llm: Any) -> int:
    """Greedy: the argmax of the last evaluated position's logits."""
    import numpy as np

    return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).argmax())


def _save_state(llm: Any) -> tuple[Any, int]:
    """llama.cpp's own state (the KV cache of the prompt), without llama-cpp-python's logits copy."""
    import ctypes

    import llama_cpp

    size = llama_cpp.llama_state_get_size(llm._ctx.ctx)
    buf = (ctypes.c_uint8 * int(size))()
    n = llama_cpp.llama_state_get_data(llm._ctx.ctx, buf, size)
    return buf, int(n)


def _load_state(llm: Any, state: tuple[Any, int], n_tokens: int) -> None:
    import llama_cpp

    buf, n = state
    if llama_cpp.llama_state_set_data(llm._ctx.ctx, buf, n) != n:
        raise RuntimeError("llama.cpp refused the saved state")
    llm.n_tokens = n_tokens


def _kv_log_matches(row: dict[str, Any]) -> bool | None:
    """Does llama.cpp's own log line (``... size = X MiB ...``) give the KV bytes computed here?"""
    import re

    for line in row["llamacpp_log_kv"]:
        m = re.search(r"size\s*=\s*([0-9.]+)\s*MiB", line)
        if m and "KV" in line.upper():
            return abs(float(m.group(1)) - row["kv_cache_bytes"] / 2**20) < 0.01
    return None


# ---- threads ---------------------------------------------------------------------------------------------------


def thread_probe(runtimes: list[str], reps: int = 2) -> dict[str, Any]:
    """Decode speed of unpruned SmolLM2 with 1 and with 2 threads, alternated ``reps`` times: PyTorch 8 tokens
    after a random 2048-position cache, llama.cpp 16 tokens after a 512-token prompt. On a 2-core machine shared
    with other jobs, 2 threads wait at every parallel op for a core (OpenMP / ggml barriers)."""
    import torch

    import headcut
    import headcut_offline as offline

    out: dict[str, Any] = {
        "what": "unpruned SmolLM2; torch: 8 tokens after a random 2048-position cache; llama.cpp: "
        "16 tokens after a 512-token prompt; 1 and 2 threads alternated"
    }
    src = offline.smollm_dir()
    if "torch" in runtimes:
        model = headcut.load(src)
        shape = model_shape(model)
        cache, first = random_cache(model, shape, 2048)
        rows = []
        for _rep in range(reps):
            for th in (1, 2):
                torch.set_num_threads(th)
                before = load_avg()
                seconds, _ = decode(model, fresh_copy(cache), first, 8, f"thread probe torch {th} threads")
                rows.append(
                    {"threads": th, "tokens_per_s": 8 / seconds, "load_before": before, "load_after": load_avg()}
                )
                log(f"thread probe: torch, {th} thread(s): {8 / seconds:.2f} tokens/s (load {before[0]})")
        out["torch"] = rows
        del model, cache
        gc.collect()
    if any(r.startswith("llamacpp") for r in runtimes):
        from llama_cpp import Llama

        cut = Cut(
            base="smollm",
            name="unpruned",
            folder=src,
            kv_heads=[],
            heads=[],
            groups_removed=0,
            groups_total=0,
            emptied_layers=[],
            mask=None,
            how="",
        )
        write_gguf(cut)
        ids = prompt_ids(src, 512)
        rows = []
        for _rep in range(reps):
            for th in (1, 2):
                llm = Llama(str(cut.gguf), n_ctx=1024, n_batch=512, n_threads=th, n_threads_batch=th, verbose=False)
                llm.eval(ids)
                tok = _last_token(llm)
                before = load_avg()
                t0 = time.perf_counter()
                for i in range(16):
                    llm.eval([tok])
                    tok = _last_token(llm)
                    tick(lambda: f"thread probe llama.cpp {th} threads: {i + 1}/16")
                seconds = time.perf_counter() - t0
                llm.close()
                rows.append(
                    {"threads": th, "tokens_per_s": 16 / seconds, "load_before": before, "load_after": load_avg()}
                )
                log(f"thread probe: llama.cpp, {th} thread(s): {16 / seconds:.2f} tokens/s (load {before[0]})")
        out["llamacpp"] = rows
    return out


# ---- output --------------------------------------------------------------------------------------------------


def quality_notes(data: dict[str, Any]) -> list[str]:
    """What the cuts cost in perplexity, where a KV study of ``benchmarks/results`` measured the same mask
    (smollm.json, gemma3.json: perplexity on the second half of hamlet.txt)."""
    notes = []
    for base, study in (("smollm", "smollm.json"), ("gemma3", "gemma3.json")):
        path = RESULTS / study
        if base not in data.get("models", {}) or not path.exists():
            continue
        rows = json.loads(path.read_text())
        rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
        rows = list(rows.values()) if isinstance(rows, dict) else rows
        for cut in data["models"][base]["cuts"]:
            for row in rows:
                if isinstance(row, dict) and cut["mask"] is not None and row.get("mask") == cut["mask"]:
                    notes.append(
                        f"{base} {cut['name']}: the same mask as benchmarks/results/{study} "
                        f"({row.get('removed')} removed): perplexity {row['perplexity']:.2f} "
                        f"(unpruned {row.get('perplexity_before'):.2f}) on the second half of hamlet.txt"
                    )
    return notes


def machine() -> dict[str, Any]:
    import torch
    import transformers

    import headcut
    from headcut.jobs.bench import device_name

    cpu = device_name("cpu")
    try:
        import llama_cpp

        llamacpp = llama_cpp.__version__
    except ImportError:
        llamacpp = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "headcut": headcut.__version__,
        "llama_cpp_python": llamacpp,
        "date": datetime.date.today().isoformat(),
        "shared_machine": "other agents run jobs on this machine",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm,gemma3,llama1b")
    ap.add_argument("--contexts", default="2048,8192")
    ap.add_argument("--llamacpp-contexts", default=None, help="contexts of the llama.cpp runtime (default: --contexts)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--runtimes",
        default="torch,llamacpp,llamacpp-fa",
        help="torch, llamacpp (flash attention off, llama-cpp-python's default), llamacpp-fa (on)",
    )
    ap.add_argument("--gen", type=int, default=GEN_TOKENS)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="PyTorch intra-op threads (default 1: see --thread-probe; 2 threads on this shared 2-core "
        "machine were several times slower)",
    )
    ap.add_argument("--llamacpp-threads", type=int, default=1, help="llama.cpp n_threads and n_threads_batch")
    ap.add_argument(
        "--thread-probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first measure decode with 1 and with 2 threads (SmolLM2, both runtimes) and record it",
    )
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument(
        "--skip",
        default="",
        help="RUNTIME:MODEL:CONTEXT entries to leave out, comma-separated (e.g. torch:llama1b:2048)",
    )
    ap.add_argument("--profile", action="store_true", help="torch.profiler of 16 decode steps per torch model")
    ap.add_argument(
        "--render",
        metavar="JSON",
        default=None,
        help="only render a results file (after adding the quality notes) and print it",
    )
    args = ap.parse_args()
    if args.render:
        data = json.loads(Path(args.render).read_text())
        data["quality"] = quality_notes(data)
        Path(args.render).write_text(json.dumps(data, indent=1) + "\n")
        print(render_markdown(data))
        return
    if args.rounds < 3:
        raise SystemExit("--rounds must be at least 3")
    bases = [b for b in args.models.split(",") if b]
    contexts = [int(c) for c in args.contexts.split(",") if c]
    cpp_contexts = [int(c) for c in (args.llamacpp_contexts or args.contexts).split(",") if c]
    runtimes = [r for r in args.runtimes.split(",") if r]
    CACHE.mkdir(parents=True, exist_ok=True)
    heartbeat()
    t_start = time.monotonic()
    data: dict[str, Any] = {
        "settings": {
            "contexts": contexts,
            "llamacpp_contexts": cpp_contexts if any(r.startswith("llamacpp") for r in runtimes) else [],
            "gen_tokens": args.gen,
            "rounds": args.rounds,
            "threads": args.threads,
            "llamacpp_threads": args.llamacpp_threads,
            "batch": 1,
            "runtimes": runtimes,
            "models": bases,
            "prefill_chunk": PREFILL_CHUNK,
            "skipped": [x for x in args.skip.split(",") if x],
        },
        "machine": machine(),
        "ideal_definition": IDEAL_TEXT,
        "models": {},
        "runtimes": {},
        "notes": [],
        "random": (
            "the synthetic 1B model's weights (seed 0) and its cuts (seeded random KV-group masks); its PyTorch "
            "KV cache is filled with random values instead of a prefill (seeded); every other input is "
            "hamlet.txt's real token ids."
        ),
    }
    data["load_start"] = load_avg()
    all_cuts = {}
    for base in bases:
        log(f"{base}: preparing the cuts")
        cuts = make_cuts(base)
        all_cuts[base] = cuts
        data["models"][base] = {
            "label": BASES[base],
            "source": str(cuts[0].folder),
            "cuts": [
                {
                    "name": c.name,
                    "kv_heads_per_layer": c.kv_heads,
                    "heads_per_layer": c.heads,
                    "groups_removed": c.groups_removed,
                    "groups_total": c.groups_total,
                    "emptied_layers": c.emptied_layers,
                    "how": c.how,
                    "mask": c.mask,
                }
                for c in cuts
            ],
        }
    data["notes"].append(THREAD_NOTE)
    if "gemma3" in bases:
        data["notes"].append(
            "Gemma 3: sliding-window layers (all but 5, 11, 17) cache at most 512 positions, so at 8k the three "
            "global layers hold most of the KV cache; emptying a layer's attention removes its cache (headcut keeps "
            "a placeholder of one value per position for K and for V so transformers can count positions)."
        )
    if args.thread_probe:
        data["thread_probe"] = thread_probe(runtimes)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    for runtime in runtimes:
        data["runtimes"][runtime] = {}
        for base in bases:
            if runtime.startswith("llamacpp") and base == "gemma3":
                note = (
                    "llama.cpp: Gemma 3 skipped: its GGUF holds only the same head counts in every layer, and the "
                    "Gemma cuts empty whole layers' attention, which cannot be written."
                )
                if note not in data["notes"]:
                    data["notes"].append(note)
                continue
            t0 = time.monotonic()
            skip = set(args.skip.split(","))
            ctxs = [
                c for c in (contexts if runtime == "torch" else cpp_contexts) if f"{runtime}:{base}:{c}" not in skip
            ]
            if not ctxs:
                continue
            if runtime == "torch":
                res = run_torch(base, all_cuts[base], ctxs, args.rounds, args.threads, args.gen, args.profile)
            elif runtime in ("llamacpp", "llamacpp-fa"):
                res = run_llamacpp(
                    base,
                    all_cuts[base],
                    ctxs,
                    args.rounds,
                    args.llamacpp_threads,
                    args.gen,
                    flash_attn=runtime == "llamacpp-fa",
                )
                data["machine"]["llama_cpp_python"] = res.get("llama_cpp_python")
            else:
                raise SystemExit(f"unknown runtime {runtime!r}")
            res["minutes"] = round((time.monotonic() - t0) / 60, 2)
            data["runtimes"][runtime][base] = res
            data["minutes"] = round((time.monotonic() - t_start) / 60, 2)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(data, indent=1) + "\n")  # partial results survive an interruption
    data["quality"] = quality_notes(data)
    data["load_end"] = load_avg()
    data["minutes"] = round((time.monotonic() - t_start) / 60, 2)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    log(f"wrote {args.out} ({data['minutes']:.1f} min)")
    print(render_markdown(data))


if __name__ == "__main__":
    main()
