"""The decoders' studies (measured by ``python -m benchmarks.harness``): SmolLM2-135M and Gemma 3 270M with whole
KV groups removed (``smollm``, ``gemma3``), other one-shot methods at the same KV budgets (``kv_methods``) and the
LLM peer, Torch-Pruning, beside headcut's rows (``peer_llm``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

import headcut
import headcut_offline as offline
from benchmarks.harness.store import Store, log, machine
from benchmarks.harness.tasks import Task
from benchmarks.studies import peer_llm
from headcut.data import DataConfig, load_calibration, load_tokenizer


@dataclass(frozen=True)
class KVStudy:
    """A decoder whose whole KV groups are removed (``headcut prune --method gradient --gqa group``): one-shot
    gradient scores on blocks of 256 tokens of the first half of hamlet.txt, perplexity on blocks of the second
    half (``eval_examples`` blocks, the same for every row), KV-cache bytes and generation speed."""

    checkpoint: Callable[[], Path]
    #: KV groups removed, a row each (0: the unpruned model)
    removed: list[int]
    #: blocks of 256 tokens scored (of the first half) and evaluated (of the second half)
    cal_examples: int
    eval_examples: int
    #: blocks per batch (None: headcut's default, 16); neither the scores (absolute values per example) nor the
    #: perplexity (blocks of equal length) depend on it, the memory does (16 x 256 x 262,144 fp32 logits: 4 GiB)
    batch_size: int | None = None


#: the decoders' KV studies. SmolLM2-135M: 30 layers x 3 KV groups of 3 query heads; Gemma 3 270M: 18 layers x 1 KV
#: head of 4 query heads (a group removed empties a layer; 262,144-token vocabulary: fewer blocks)
KV_STUDIES = {
    "smollm": KVStudy(offline.smollm_dir, [0, 6, 12, 18, 30, 45], cal_examples=64, eval_examples=64),
    "gemma3": KVStudy(offline.gemma3_dir, [0, 1, 2, 3, 4, 5, 6], cal_examples=8, eval_examples=16, batch_size=2),
}
#: the KV studies' one interleaved timing of every row's model (``headcut.bench``, batch 1, a 128-token prompt, 32
#: generated tokens): rounds of one forward of each model, then rounds of one generation of each, the order
#: rotated each round; every model in memory at once
KV_ROUNDS, KV_GEN_ROUNDS, KV_WARMUP = 11, 7, 2


def _kv_timing(name: str, src: Path, store: Store, tmp: Path) -> None:
    """Time every row's model in one interleaved ``headcut.bench`` (the unpruned model first: the baseline of the
    paired ratios); each cut is made again from its row's stored mask (``headcut.export``), so the perplexities
    and prune times stay those measured when the row was pruned. Stored per row as ``timing``, with the whole
    timing's settings and the machine's load (``os.getloadavg()`` before and after) as the study's ``timing``."""
    rows = sorted(store.data["rows"], key=lambda r: r["removed"])
    folders: list[Path] = []
    for row in rows:
        if not row["removed"]:
            folders.append(src)
            continue
        folder = tmp / f"{name}-{row['removed']}-timing"
        headcut.export(src, row["mask"], gqa="group").save(folder, force=True)
        folders.append(folder)
    log(
        f"{name}: timing {len(folders)} models interleaved ({KV_ROUNDS} forward rounds, {KV_GEN_ROUNDS} generation "
        "rounds)"
    )
    load_before = os.getloadavg()
    start = time.perf_counter()
    bench = headcut.bench(
        folders,
        names=[str(r["removed"]) for r in rows],
        batch_size=1,
        seq_len=128,
        gen_tokens=32,
        runs=KV_ROUNDS,
        gen_runs=KV_GEN_ROUNDS,
        warmup=KV_WARMUP,
    )
    seconds = time.perf_counter() - start
    load_after = os.getloadavg()
    for row, r in zip(rows, bench.results, strict=True):
        gen = r.generation
        tokens = gen.new_tokens  # batch 1
        row.update(kv_heads=r.kv_heads, heads=r.heads, params=r.params, kv_cache_bytes=gen.kv_cache_bytes)
        for stale in ("tokens_per_s", "forward_ms"):  # the earlier back-to-back times
            row.pop(stale, None)
        row["timing"] = {
            "forward_ms": r.median_ms,
            "forward_p25_ms": r.p25_ms,
            "forward_p75_ms": r.p75_ms,
            "forward_runs_ms": r.runs_ms,
            "speedup": r.speedup,
            "speedup_p25": r.speedup_p25,
            "speedup_p75": r.speedup_p75,
            "within_noise": r.within_noise,
            "tokens_per_s": gen.tokens_per_s,
            "tokens_per_s_p25": 1e3 * tokens / gen.p75_ms,
            "tokens_per_s_p75": 1e3 * tokens / gen.p25_ms,
            "generation_runs_ms": gen.runs_ms,
            "generation_speedup": gen.speedup,
            "generation_speedup_p25": gen.speedup_p25,
            "generation_speedup_p75": gen.speedup_p75,
            "generation_within_noise": gen.within_noise,
            "dtype": r.dtype,
            "attn_implementation": r.attn_implementation,
            "threads": r.threads,
        }
    store.data["timing"] = {
        "interleaved": True,
        "rounds": KV_ROUNDS,
        "gen_rounds": KV_GEN_ROUNDS,
        "warmup": KV_WARMUP,
        "batch_size": 1,
        "seq_len": 128,
        "gen_tokens": 32,
        "rows": [r["removed"] for r in rows],
        "load_before": list(load_before),
        "load_after": list(load_after),
        "seconds": seconds,
        "machine": machine(),
    }
    store.save()


def _timed(store: Store) -> bool:
    """Whether the study's rows were all timed in its last interleaved timing."""
    timing = store.data.get("timing") or {}
    rows = sorted(r["removed"] for r in store.data["rows"])
    return timing.get("rows") == rows and all("timing" in r for r in store.data["rows"])


@contextlib.contextmanager
def _kv_data(name: str) -> Iterator[tuple[Path, int, int, dict[str, Any], dict[str, Any], Path, Path, Path]]:
    """A KV study's checkpoint, KV groups, query heads per group, data options (scoring, evaluation) and the two
    halves of hamlet.txt (scored, evaluated), in a temporary folder (also yielded)."""
    spec = KV_STUDIES[name]
    src = spec.checkpoint()
    config = transformers.AutoConfig.from_pretrained(src)
    groups = config.num_hidden_layers * config.num_key_value_heads
    size = config.num_attention_heads // config.num_key_value_heads
    batch = {} if spec.batch_size is None else {"batch_size": spec.batch_size}
    cal_options = {"seq_len": 256, "max_examples": spec.cal_examples, **batch}
    eval_options = {"seq_len": 256, "max_examples": spec.eval_examples, **batch}
    text = offline.hamlet_path().read_text()
    with tempfile.TemporaryDirectory() as tmp:
        half = len(text) // 2
        cal, held = Path(tmp) / "hamlet-a.txt", Path(tmp) / "hamlet-b.txt"
        cal.write_text(text[:half])
        held.write_text(text[half:])
        yield src, groups, size, cal_options, eval_options, cal, held, Path(tmp)


#: variants of a one-shot method in the KV studies: label -> (method, prune keywords, bf16 copy of the checkpoint)
KV_VARIANTS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "fluctuation+bias": ("fluctuation", {"bias_compensation": True}, False),
    "fluctuation layer-wise bf16": ("fluctuation", {"layerwise": True}, True),
    "fluctuation+bias layer-wise bf16": ("fluctuation", {"layerwise": True, "bias_compensation": True}, True),
}


def _bf16_copy(src: Path, tmp: Path) -> Path:
    """``src`` saved in bfloat16 (once per temporary folder): what a layer-wise run reads as stored."""
    folder = tmp / f"{src.name}-bf16"
    if not folder.exists():
        headcut.save(headcut.load(src, dtype=torch.bfloat16), folder, source=src)
    return folder


def _kv_cut(name: str, method: str, removed: int, before: float | None, data: tuple[Any, ...]) -> dict[str, Any]:
    """Perplexity and prune time of one cut of ``removed`` KV groups by ``method`` (0: the unpruned model; a
    :data:`KV_VARIANTS` label: that variant), the saved model reloaded and evaluated on the second half of
    hamlet.txt."""
    spec = KV_STUDIES[name]
    src, groups, size, cal_options, eval_options, cal, held, tmp = data
    chosen, extra, bf16 = KV_VARIANTS.get(method, (method, {}, False))
    if bf16:
        src = _bf16_copy(src, tmp)
    start = time.perf_counter()
    report: dict[str, Any] = {}
    if removed:
        folder = tmp / f"{name}-{method.replace(' ', '-')}-{removed}"
        pruned = headcut.prune(
            src,
            chosen,
            keep=(groups - removed) * size,
            gqa="group",
            data=cal,
            data_options=cal_options,
            out=folder,
            **extra,
        )
        mask, report = pruned.mask.to_json(), pruned.report
    else:
        folder, mask = src, None
    after = headcut.evaluate(folder, held, data_options=eval_options).value  # the saved model, reloaded
    seconds = time.perf_counter() - start
    if removed:
        shutil.rmtree(folder)  # a gigabyte each for Gemma 3
    out = {
        "perplexity_before": before if removed else after,
        "perplexity": after,
        "prune_seconds": seconds,
        "cal_examples": spec.cal_examples,
        "eval_examples": spec.eval_examples,
        "batch_size": spec.batch_size,
        "mask": mask,
    }
    if "layerwise" in report:
        out["layerwise"] = report["layerwise"]
    if extra:
        out["variant"] = {"method": chosen, **extra, "bf16": bf16}
    return out


def _kv_study(name: str, store: Store) -> None:
    with _kv_data(name) as data:

        def unpruned() -> float:
            return store.row({"removed": 0}, lambda: _kv_cut(name, "gradient", 0, None, data))["perplexity"]

        for removed in KV_STUDIES[name].removed:
            row = store.row(
                {"removed": removed},
                lambda removed=removed: _kv_cut(name, "gradient", removed, unpruned() if removed else None, data),
            )
            log(f"{name}: {removed} KV groups removed, perplexity {row['perplexity']:.2f}")
        if not _timed(store):
            _kv_timing(name, data[0], store, data[-1])


#: the other one-shot methods of the KV studies, at the same budgets (the gradient rows are the KV study's own):
#: study -> methods
KV_METHODS = {"smollm": ["fluctuation", *KV_VARIANTS], "gemma3": ["fluctuation", *KV_VARIANTS]}


def study_kv_methods(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    """:data:`KV_METHODS` on the KV studies' models at their budgets, scored and evaluated as those studies do
    (perplexity of the saved model, reloaded; no timing: the KV study's rows time the cut sizes)."""
    for name, methods in KV_METHODS.items():
        with _kv_data(name) as data:
            for method in methods:
                for removed in [r for r in KV_STUDIES[name].removed if r]:

                    def measure(m: str = method, r: int = removed) -> dict[str, Any]:
                        try:
                            return _kv_cut(name, m, r, None, data)
                        except headcut.HeadcutError as refused:  # e.g. fluctuation where every block is one unit
                            return {"refused": str(refused)}

                    row = store.row({"study": name, "method": method, "removed": removed}, measure)
                    log(
                        f"{name} {method}: {removed} KV groups removed, "
                        + (f"refused: {row['refused']}" if "refused" in row else f"perplexity {row['perplexity']:.2f}")
                    )


#: the KV groups removed by headcut's costly rows in the LLM peer study (iterative: three gradient scorings;
#: recipe: one, then recovery), in the order they are measured (two before the layer-wise rows without bias
#: compensation, the rest after): those the time these 2 CPU cores had allowed are in the results
PEER_LLM_COSTLY_REMOVED = [18, 45, 6, 30, 12]
#: the LLM peer study's cuts, in order: (tool, variant, KV groups removed); ``probe``: what Torch-Pruning's
#: ``BasePruner`` removes at each head ratio (no model measured); ``native``: its LLM example's GQA head pruning at
#: the one ratio it carries out (a third of the query heads, no KV head)
PEER_LLM_CUTS = [
    ("headcut", "unpruned", 0),
    ("torch-pruning", "unpruned", 0),
    ("torch-pruning", "probe", 0),
    ("torch-pruning", "native", 0),
    *[("torch-pruning", "kv-magnitude", r) for r in KV_STUDIES["smollm"].removed if r],
    *[("headcut", m, r) for m in ("gradient", "fluctuation") for r in KV_STUDIES["smollm"].removed if r],
    # issue 34's other headcut rows (``peer_llm.HEADCUT_VARIANTS``), in the order they are measured: the
    # layer-wise runs with bias compensation (a few minutes a cut) at every budget, the iterative and
    # recipe runs (ten minutes or more each) at two of PEER_LLM_COSTLY_REMOVED, the layer-wise runs
    # without it (the one-shot fluctuation cut, read layer by layer) at every budget, then the last
    *[("headcut", "fluctuation+bias layer-wise", r) for r in KV_STUDIES["smollm"].removed if r],
    *[("headcut", m, r) for r in PEER_LLM_COSTLY_REMOVED[:2] for m in ("gradient iterative", "recipe")],
    ("headcut", "unpruned+recovery", 0),  # the recipe's control: its recovery on the uncut model
    *[("headcut", "fluctuation layer-wise", r) for r in KV_STUDIES["smollm"].removed if r],
    *[("headcut", m, r) for r in PEER_LLM_COSTLY_REMOVED[2:] for m in ("gradient iterative", "recipe")],
]


def study_peer_llm(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    """Torch-Pruning on SmolLM2's attention beside headcut's one-shot KV-group cuts (``benchmarks/studies/peer_llm.py``):
    every cut in its own process, on the smollm study's calibration blocks, measured by one function."""
    python = args.llm_peer_python or str(peer_llm.ensure_venv())
    with _kv_data("smollm") as data:
        src, groups, size, cal_options, eval_options, cal, held, tmp = data
        tok = load_tokenizer(src)
        cal_blocks = torch.cat(
            [
                b["input_ids"]
                for b in load_calibration(headcut.load(src), tok, DataConfig(path=str(cal), **cal_options)).batches
            ]
        )
        ids = tmp / "ids.safetensors"
        held_tokens = peer_llm.write_ids(ids, tok, held.read_text(), cal_blocks)
        store.data.update(
            eval_tokens=peer_llm.EVAL_TOKENS,
            held_tokens=held_tokens,
            windows=peer_llm.WINDOWS,
            cal_blocks=list(cal_blocks.shape),
            groups=groups,
            query_per_group=size,
            peer_python=python,
            peer_versions=peer_llm.peer_versions(python),
        )
        for tool, variant, removed in PEER_LLM_CUTS:
            spec = {
                "tool": tool,
                "variant": variant,
                "removed": removed,
                "src": str(src),
                "ids": str(ids),
                "keep": (groups - removed) * size,
                "cal_text": str(cal),
                "cal_options": cal_options,
                "head_ratio": 1 / 3,
            }
            work = tmp / f"{tool}-{variant}-{removed}"

            def measure(spec: dict[str, Any] = spec, work: Path = work, tool: str = tool) -> dict[str, Any]:
                try:
                    return peer_llm.run_cut(python if tool == "torch-pruning" else sys.executable, spec, work)
                finally:
                    shutil.rmtree(work, ignore_errors=True)

            row = store.row({"tool": tool, "variant": variant, "removed": removed}, measure)
            ppl = row.get("perplexity") or {}
            log(f"peer_llm {tool} {variant} {removed}: " + ", ".join(f"ppl@{w} {p:.2f}" for w, p in ppl.items()))


def study_smollm(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    _kv_study("smollm", store)


def study_gemma3(tasks: Callable[[str], Task], store: Store, args: argparse.Namespace) -> None:
    _kv_study("gemma3", store)


#: the small-data tasks' heads kept (of 72): the targets' 16 and 8, and the high-sparsity end
