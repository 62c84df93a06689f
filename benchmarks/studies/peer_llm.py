"""The LLM peer: Torch-Pruning (``pip install torch-pruning``, Fang et al., CVPR 2023) pruning SmolLM2-135M's
attention beside headcut's one-shot KV-group cuts, every model measured the same way by this file.

Torch-Pruning runs in its own virtual environment: version 1.6.1 needs transformers 4 (with transformers 5.24,
headcut's, building its dependency groups for a Llama never ends: a 2-layer SmolLM2 was still in
``DependencyGraph.get_all_groups`` after 4 minutes, with SDPA and with eager attention; with transformers
4.48.3, the version its LLM example's outputs show, it takes 0.6 s). ``python -m benchmarks.studies.peer_llm venv PATH``
makes it (or checks an existing one):

    python -m venv /work/venvs/torch-pruning
    /work/venvs/torch-pruning/bin/pip install torch==2.13.0
    /work/venvs/torch-pruning/bin/pip install transformers==4.48.3 torch-pruning==1.6.1

``python -m benchmarks.harness --studies peer_llm [--llm-peer-python PATH/bin/python]`` runs the study (default
``/work/venvs/torch-pruning/bin/python``, made when absent): each cut is one process of this file
(``peer_llm.py cut SPEC.json``; Torch-Pruning's in the peer's Python, headcut's in the harness's), so its peak
resident memory (``ru_maxrss``) is its own. The peer's variants:

* ``native``: Torch-Pruning's LLM head-pruning path as its ``examples/LLMs/prune_llm.py`` sets it up
  (``BasePruner`` with ``num_heads`` = 9 query and 3 KV heads per layer, ``prune_num_heads=True``,
  ``prune_head_dims=False``, ``GroupMagnitudeImportance(p=2, group_reduction="mean")``, local ranking), made
  attention-only by a channel ratio on the query projections alone (the example's global ``pruning_ratio``
  also cuts the hidden size and the MLPs). With grouped-query attention it never removes a KV head (it empties
  the K/V part of the group: "shared by multiple Q heads") and removes the same number of query heads from
  every KV group of every layer; of those, only one query head of three is reachable (see ``probe``).
* ``kv-magnitude``: whole KV groups (a KV head and its 3 query heads) removed with Torch-Pruning's
  dependency graph (``DependencyGraph.get_pruning_group`` on a group's query channels of ``o_proj``'s input maps
  them to the group's ``q_proj``, ``k_proj`` and ``v_proj`` rows; ``group.prune()`` cuts them) and scored by its
  importance on each layer's whole attention group, averaged over each KV group's channels as ``BasePruner``
  averages a head's (``GroupMagnitudeImportance``, the example's criterion: no data). ``BasePruner`` cannot do this itself: given the KV groups as its heads
  (``num_heads`` 3 for ``q_proj``, ``k_proj`` and ``v_proj``) its over-pruning check counts the K/V indices that
  GQA's ``repeat_kv`` repeats three times and refuses every group, so the 90 groups are ranked globally by this
  script, the lowest removed, skipping a group that would empty its layer (Torch-Pruning's check refuses that).
* ``probe``: what ``BasePruner`` does at each head ratio, with the GQA heads and with the KV groups as heads:
  query and KV heads removed (not a cut of the table).

headcut's rows (:data:`HEADCUT_VARIANTS`) are ``headcut.prune(src, method, keep=..., gqa="group", data=first half,
data_options=..., **options)`` as the harness's KV studies cut, saved and reloaded with ``headcut.load`` before they are
measured: one-shot, layer-wise (scored in ``prune``, cut while ``save`` writes: both timed as the prune), iterative
and the recipe (its recovery trains on the calibration blocks of the first half, never on the evaluated half).

Every row: perplexity on the same tokens of hamlet.txt's second half (the first ``EVAL_TOKENS``) in
non-overlapping windows of 128 and of 2,048 tokens (:func:`perplexity`: the loss of every next token in each
window, token-weighted mean, exp), the prune's wall time (load excluded; scoring and cut; headcut's save and
the peer's ``save_pretrained`` are timed apart), the process's peak RSS after the prune (load and prune) and at
its end (evaluation too), and whether the saved output reloads, and how.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.perplexity import perplexity

#: the KV groups removed (of SmolLM2's 90), as in the harness's KV studies
BUDGETS = [6, 12, 18, 30, 45]
WINDOWS = [128, 2048]
#: tokens of the second half evaluated (8 windows of 2,048 = 128 of 128; the KV studies' 64 x 256)
EVAL_TOKENS = 16384
#: headcut's rows: variant -> (method, ``headcut.prune`` keywords). The one-shot rows; the layer-wise runs of FLAP's
#: fluctuation (the checkpoint read one layer at a time, as stored: float32 here), with and without its bias
#: compensation; the gradient scores re-computed on the masked model before each of ``ITERATIVE_ROUNDS`` steps
#: (``michel`` with ``rounds``, no per-layer normalisation: the one-shot gradient scores, re-scored); and the README
#: main job's recipe (one-shot gradient, then ``RECOVER_STEPS`` steps of distilled recovery on the calibration
#: blocks, the first half of hamlet.txt, never the evaluated half)
ITERATIVE_ROUNDS = 3
RECOVER_STEPS = 4
HEADCUT_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gradient": ("gradient", {}),
    "fluctuation": ("fluctuation", {}),
    "fluctuation layer-wise": ("fluctuation", {"layerwise": True}),
    "fluctuation+bias layer-wise": ("fluctuation", {"layerwise": True, "bias_compensation": True}),
    "gradient iterative": ("michel", {"rounds": ITERATIVE_ROUNDS, "normalize": "none"}),
    "recipe": ("gradient", {"recover_steps": RECOVER_STEPS}),
    # the recipe's control: the unpruned model trained by the same recovery (``headcut.finetune``, the same loss,
    # defaults, steps and blocks), no cut: what the recovery's training on hamlet.txt's first half does alone
    "unpruned+recovery": ("finetune", {"max_steps": RECOVER_STEPS}),
}
#: the peer's environment
PEER_PACKAGES = [["torch==2.13.0"], ["transformers==4.48.3", "torch-pruning==1.6.1"]]
DEFAULT_VENV = Path("/work/venvs/torch-pruning")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux: ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _logits_gap(a: torch.nn.Module, b: torch.nn.Module, ids: torch.Tensor) -> float:
    """Largest absolute difference of two models' logits on one window."""
    with torch.no_grad():
        return float((a(input_ids=ids, use_cache=False).logits - b(input_ids=ids, use_cache=False).logits).abs().max())


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:400]


# ---- the peer (Torch-Pruning, in its own environment) ------------------------------------------------------


def _load_peer_model(src: str) -> torch.nn.Module:
    """SmolLM2 in transformers 4: its config (written by transformers 5) states RoPE's base as
    ``rope_parameters``, which transformers 4 does not read (it would use 10,000 instead of 100,000)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src)
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        config.rope_theta = rope["rope_theta"]
    model = AutoModelForCausalLM.from_pretrained(src, config=config, torch_dtype=torch.float32)
    return model.eval()


def _shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    """Query and KV heads per layer, from the projections' sizes."""
    hd = model.config.head_dim
    layers = model.model.layers
    return {
        "query_heads": [a.self_attn.q_proj.weight.shape[0] // hd for a in layers],
        "kv_heads": [a.self_attn.k_proj.weight.shape[0] // hd for a in layers],
        "hidden": [a.self_attn.q_proj.weight.shape[1] for a in layers],
        "mlp": [a.mlp.gate_proj.weight.shape[0] for a in layers],
    }


def _native_pruner(
    model: torch.nn.Module,
    example: torch.Tensor,
    head_ratio: float,
    kv_as_heads: bool = False,
    global_pruning: bool = False,
) -> Any:
    """``BasePruner`` as the LLM example builds it, attention only: ``num_heads`` per projection (the model's
    query and KV heads, or the KV groups for all three with ``kv_as_heads``), whole heads removed, head size
    kept, the channel ratio set on the query projections alone so that the hidden size and the MLPs stay."""
    import torch_pruning as tp

    cfg = model.config
    num_heads: dict[torch.nn.Module, int] = {}
    for layer in model.model.layers:
        a = layer.self_attn
        num_heads[a.q_proj] = cfg.num_key_value_heads if kv_as_heads else cfg.num_attention_heads
        num_heads[a.k_proj] = cfg.num_key_value_heads
        num_heads[a.v_proj] = cfg.num_key_value_heads
    queries = tuple(layer.self_attn.q_proj for layer in model.model.layers)
    ratios = {queries: 0.5} if global_pruning else {q: 0.5 for q in queries}
    return tp.pruner.BasePruner(
        model,
        example_inputs=example,
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=global_pruning,
        pruning_ratio=0.0,
        pruning_ratio_dict=ratios,
        ignored_layers=[model.lm_head],
        num_heads=num_heads,
        prune_num_heads=True,
        prune_head_dims=False,
        head_pruning_ratio=head_ratio,
        output_transform=lambda out: out.logits,
    )


def _sync_attention(model: torch.nn.Module) -> None:
    """After ``native``: the attention modules' query-per-KV count and the config's head count (the same in every
    layer, as this path leaves them), as the LLM example updates them."""
    hd = model.config.head_dim
    for layer in model.model.layers:
        a = layer.self_attn
        heads, kv = a.q_proj.out_features // hd, a.k_proj.out_features // hd
        a.num_key_value_groups = heads // kv
        if hasattr(a, "num_heads"):
            a.num_heads = heads
    model.config.num_attention_heads = model.model.layers[0].self_attn.q_proj.out_features // hd


def _kv_cut(model: torch.nn.Module, removed: int, example: torch.Tensor) -> dict[str, Any]:
    """Remove ``removed`` whole KV groups with Torch-Pruning's dependency graph, ranked globally by its importance
    (see the module's doc); returns what was removed."""
    import torch_pruning as tp

    graph = tp.DependencyGraph().build_dependency(
        model, example_inputs=example, output_transform=lambda out: out.logits
    )
    scorer = tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean")
    cfg = model.config
    kv, width = cfg.num_key_value_heads, cfg.head_dim * (cfg.num_attention_heads // cfg.num_key_value_heads)
    layers = model.model.layers
    scores = []
    for i, layer in enumerate(layers):
        o_proj = layer.self_attn.o_proj
        group = graph.get_pruning_group(o_proj, tp.prune_linear_in_channels, list(range(o_proj.in_features)))
        per_channel = scorer(group)
        scores += [(float(s), i, g) for g, s in enumerate(per_channel.view(kv, -1).mean(1))]
    chosen: dict[int, list[int]] = {}
    skipped = []
    for _score, i, g in sorted(scores):
        if sum(map(len, chosen.values())) == removed:
            break
        if len(chosen.get(i, [])) == kv - 1:
            skipped.append([i, g])  # would empty the layer: Torch-Pruning's over-pruning check refuses that
            continue
        chosen.setdefault(i, []).append(g)
    for i, groups in sorted(chosen.items()):
        idxs = [c for g in sorted(groups) for c in range(g * width, (g + 1) * width)]
        graph.get_pruning_group(layers[i].self_attn.o_proj, tp.prune_linear_in_channels, idxs).prune()
    # the group maps each query channel to its K/V channel, so a K/V channel comes three times (GQA's repeat_kv);
    # the cut weights are right (the pruning functions keep the set difference), but Linear.out_features is
    # lowered by the repeated count (SmolLM2's k_proj: 0 after one group, -192 after two): set it from the weights
    fixed = 0
    for layer in layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj):
            if (proj.out_features, proj.in_features) != tuple(proj.weight.shape):
                proj.out_features, proj.in_features = proj.weight.shape
                fixed += 1
    return {
        "removed_groups": {str(i): sorted(g) for i, g in sorted(chosen.items())},
        "skipped_emptying": skipped,
        "linear_sizes_fixed": fixed,
    }


def _masked_gap(model: torch.nn.Module, src: str, removed_groups: dict[str, list[int]], check: torch.Tensor) -> float:
    """Largest logit gap between the cut model and the unpruned one with the removed groups' query heads masked
    (their ``o_proj`` input columns zeroed): 0 up to rounding when the cut removed exactly those groups."""
    reference = _load_peer_model(src)
    cfg = reference.config
    width = cfg.head_dim * (cfg.num_attention_heads // cfg.num_key_value_heads)
    with torch.no_grad():
        for i, groups in removed_groups.items():
            weight = reference.model.layers[int(i)].self_attn.o_proj.weight
            for g in groups:
                weight[:, g * width : (g + 1) * width] = 0
    return _logits_gap(model, reference, check)


def _peer_reload(model: torch.nn.Module, folder: Path, check: torch.Tensor) -> dict[str, Any]:
    """``save_pretrained`` then stock ``AutoModelForCausalLM.from_pretrained``; when that fails, the whole module
    with ``torch.save`` and ``torch.load(weights_only=False)``. Each: what happened, and the largest logit gap
    to the pruned model in memory."""
    from transformers import AutoModelForCausalLM

    out: dict[str, Any] = {}
    start = time.perf_counter()
    model.save_pretrained(folder)
    out["save_seconds"] = time.perf_counter() - start
    try:
        back = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
        out["from_pretrained"] = {"ok": True, "max_logit_gap": _logits_gap(model, back, check)}
        del back
    except Exception as error:
        out["from_pretrained"] = {"ok": False, "error": _first_line(error)}
    if not out["from_pretrained"]["ok"] or out["from_pretrained"]["max_logit_gap"] > 1e-3:
        path = folder / "module.pt"
        torch.save(model, path)
        try:
            back = torch.load(path, weights_only=False).eval()
            out["torch_save_module"] = {"ok": True, "max_logit_gap": _logits_gap(model, back, check)}
        except Exception as error:
            out["torch_save_module"] = {"ok": False, "error": _first_line(error)}
    return out


def run_peer(spec: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    import torch_pruning as tp
    import transformers
    from safetensors.torch import load_file

    data = load_file(spec["ids"])
    ids = data["eval"]
    example = data["cal"][:1, :16]  # the traced input: 16 tokens of the first calibration block
    model = _load_peer_model(spec["src"])
    loaded_rss = peak_rss_mib()
    # the installed package's version (torch_pruning.__version__ of 1.6.1 still says 1.6.0)
    row: dict[str, Any] = {
        "torch_pruning": version("torch-pruning"),
        "torch_pruning_module_version": tp.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    start = time.perf_counter()
    variant = spec["variant"]
    if variant == "native":
        pruner = _native_pruner(model, example, spec["head_ratio"])
        for group in pruner.step(interactive=True):
            group.prune()
        del pruner
        _sync_attention(model)
        row["head_ratio"] = spec["head_ratio"]
    elif variant == "kv-magnitude":
        row.update(_kv_cut(model, spec["removed"], example))
    elif variant != "unpruned":
        raise SystemExit(f"unknown peer variant {variant!r}")
    row["prune_seconds"] = time.perf_counter() - start if variant != "unpruned" else None
    row["rss_loaded_mib"], row["rss_pruned_mib"] = loaded_rss, peak_rss_mib()
    row.update(_shapes(model))
    row["perplexity"] = {str(w): perplexity(model, ids, w) for w in WINDOWS}
    if "removed_groups" in row:
        row["masked_gap"] = _masked_gap(model, spec["src"], row["removed_groups"], ids[:128].view(1, -1))
    if variant != "unpruned":
        row["reload"] = _peer_reload(model, Path(spec["work"]), ids[:128].view(1, -1))
    return row


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """What ``BasePruner`` removes at each head ratio: the LLM example's GQA heads (local ranking), and the KV
    groups given as its heads (local and global ranking). Each on a fresh model; the heads left per layer."""
    from safetensors.torch import load_file

    example = load_file(spec["ids"])["cal"][:1, :16]
    runs = []
    plans = [("gqa-heads", False, False, r) for r in (0.2, 1 / 3, 0.5, 2 / 3)]
    plans += [("kv-groups-as-heads", True, False, r) for r in (1 / 3, 2 / 3)]
    plans += [("kv-groups-as-heads", True, True, r) for r in (6 / 90, 30 / 90)]
    for name, kv_as_heads, global_pruning, ratio in plans:
        model = _load_peer_model(spec["src"])
        start = time.perf_counter()
        pruner = _native_pruner(model, example, ratio, kv_as_heads, global_pruning)
        pruned = 0
        try:
            for group in pruner.step(interactive=True):
                group.prune()
                pruned += 1
            error = None
        except Exception as e:
            error = _first_line(e)
        shapes = _shapes(model)
        runs.append(
            {
                "num_heads": name,
                "global": global_pruning,
                "head_ratio": ratio,
                "groups_pruned": pruned,
                "error": error,
                "seconds": time.perf_counter() - start,
                "query_heads_removed": 270 - sum(shapes["query_heads"]),
                "kv_heads_removed": 90 - sum(shapes["kv_heads"]),
                "query_heads": shapes["query_heads"],
                "kv_heads": shapes["kv_heads"],
            }
        )
        print(
            json.dumps({k: v for k, v in runs[-1].items() if k not in ("query_heads", "kv_heads")}),
            file=sys.stderr,
            flush=True,
        )
        del pruner, model
    return {"runs": runs}


# ---- headcut (in the harness's environment) ----------------------------------------------------------------


def run_headcut(spec: dict[str, Any]) -> dict[str, Any]:
    """One of :data:`HEADCUT_VARIANTS`: pruned, saved, reloaded with ``headcut.load`` and measured. A layer-wise
    run scores in ``prune`` and cuts while it writes (``save``): its prune seconds and peak are taken after the
    save, and its reloaded model is checked against the unpruned model gated by its mask (no model of it is in
    memory; with bias compensation there is no gated equal, so no gap)."""
    import transformers
    from safetensors.torch import load_file

    import headcut

    ids = load_file(spec["ids"])["eval"]
    method, extra = HEADCUT_VARIANTS[spec["variant"]]
    row: dict[str, Any] = {
        "headcut": headcut.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "method": method,
        "options": extra,
    }
    folder = Path(spec["work"]) / "cut"
    if method == "finetune":  # the recipe's control: no cut, the same recovery on the unpruned model
        start = time.perf_counter()
        tuned = headcut.finetune(
            spec["src"],
            data=spec["cal_text"],
            teacher=spec["src"],
            checkpoint_every=None,
            data_options=spec["cal_options"],
            **extra,
        )
        row["train_seconds"] = time.perf_counter() - start
        row["prune_seconds"] = None
        row["rss_pruned_mib"] = peak_rss_mib()
        tuned.save(folder)
        row["recovery"] = _brief(
            {k: tuned.report.get(k) for k in ("steps", "history_summary", "config", "train_seconds")}
        )
        in_memory = tuned.model
        del tuned
        model = headcut.load(folder)
        row["reload"] = {
            "headcut_load": {"ok": True, "max_logit_gap": _logits_gap(in_memory, model, ids[:128].view(1, -1))}
        }
        del in_memory
    elif spec["removed"]:
        layerwise = bool(extra.get("layerwise"))
        start = time.perf_counter()
        pruned = headcut.prune(
            spec["src"],
            method,
            keep=spec["keep"],
            gqa="group",
            data=spec["cal_text"],
            data_options=spec["cal_options"],
            **extra,
        )
        scored = time.perf_counter() - start
        if not layerwise:
            row["prune_seconds"] = scored
            row["rss_pruned_mib"] = peak_rss_mib()
        start = time.perf_counter()
        pruned.save(folder)
        row["save_seconds"] = time.perf_counter() - start
        if layerwise:  # the cut happens in the write pass: both passes are the prune
            row["prune_seconds"], row["score_seconds"] = scored + row["save_seconds"], scored
            row["rss_pruned_mib"] = peak_rss_mib()
            row["layerwise"] = pruned.report.get("layerwise")
        for key in ("recovery", "bias_compensation", "scorings"):
            if pruned.report.get(key) is not None:
                row[key] = _brief(pruned.report[key])
        row["mask"] = pruned.mask.to_json()
        in_memory = None if layerwise else pruned.model
        del pruned
        model = headcut.load(folder)  # the saved model, reloaded: what is measured
        check = ids[:128].view(1, -1)
        if in_memory is not None:
            row["reload"] = {"headcut_load": {"ok": True, "max_logit_gap": _logits_gap(in_memory, model, check)}}
        elif not extra.get("bias_compensation"):
            reference = headcut.load(spec["src"])
            with headcut.gated(reference, row["mask"]):
                gap = _logits_gap(reference, model, check)
            row["reload"] = {"headcut_load": {"ok": True, "max_logit_gap": gap, "against": "gated unpruned model"}}
            del reference
        else:
            row["reload"] = {"headcut_load": {"ok": True, "max_logit_gap": None, "against": None}}
        config = json.loads((folder / "config.json").read_text())
        row["reload"]["form"] = "headcut" if "auto_map" in config else "stock"
        del in_memory
        for name, kwargs in (
            ("from_pretrained", {}),
            ("from_pretrained_trust_remote_code", {"trust_remote_code": True}),
        ):
            try:
                back = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()
                row["reload"][name] = {"ok": True, "max_logit_gap": _logits_gap(model, back, check)}
                del back
            except Exception as error:
                row["reload"][name] = {"ok": False, "error": _first_line(error)}
    else:
        model = headcut.load(spec["src"])
        row["prune_seconds"] = None
        row["rss_pruned_mib"] = peak_rss_mib()
    hd = model.config.head_dim
    layers = model.model.layers
    row["query_heads"] = [
        a.self_attn.q_proj.out_features // hd if hasattr(a.self_attn, "q_proj") else 0 for a in layers
    ]
    row["kv_heads"] = [a.self_attn.k_proj.out_features // hd if hasattr(a.self_attn, "k_proj") else 0 for a in layers]
    row["perplexity"] = {str(w): perplexity(model, ids, w) for w in WINDOWS}
    return row


def _brief(part: Any) -> Any:
    """A report part without its long per-step lists (the recovery's curve: first and last points kept)."""
    if isinstance(part, dict):
        return {k: _brief(v) for k, v in part.items()}
    if isinstance(part, list) and len(part) > 8:
        return [*part[:2], "...", *part[-2:]]
    return part


def cut(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.manual_seed(0)
    load_before = os.getloadavg()
    start = time.perf_counter()
    try:
        if spec["tool"] == "headcut":
            row = run_headcut(spec)
        elif spec["variant"] == "probe":
            row = probe(spec)
        else:
            row = run_peer(spec)
    except Exception:
        traceback.print_exc()
        raise
    row["rss_peak_mib"] = peak_rss_mib()
    row["process_seconds"] = time.perf_counter() - start
    # the machine's load average (1, 5, 15 min) around the process: its 2 cores are shared with other jobs
    row["load_before"], row["load_after"] = list(load_before), list(os.getloadavg())
    Path(spec["out"]).write_text(json.dumps(row, indent=1) + "\n")


# ---- the environment and the orchestration (the harness's side) ------------------------------------------------


def ensure_venv(venv: Path = DEFAULT_VENV) -> Path:
    """The peer's Python: the venv made with :data:`PEER_PACKAGES` when absent, and its versions checked."""
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        for packages in PEER_PACKAGES:
            subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    want = {p.split("==")[0]: p.split("==")[1] for group in PEER_PACKAGES for p in group}
    versions = peer_versions(str(python))
    wrong = {p: v for p, v in versions.items() if not v.startswith(want[p])}
    if wrong:
        raise SystemExit(f"{venv}: {wrong} installed, the peer wants {want}")
    return python


def peer_versions(python: str) -> dict[str, str]:
    """The installed versions of the peer's packages in the environment of ``python``."""
    names = sorted({p.split("==")[0] for group in PEER_PACKAGES for p in group})
    got = subprocess.run(
        [
            python,
            "-c",
            f"import json, importlib.metadata as m; print(json.dumps({{p: m.version(p) for p in {names!r}}}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(got)


def write_ids(path: Path, tokenizer: Any, held_text: str, cal_blocks: torch.Tensor) -> int:
    """The evaluated tokens (the first :data:`EVAL_TOKENS` of the second half, no special tokens) and headcut's
    calibration blocks (the peer's magnitude needs no data: its graph is traced on 16 of their tokens) in one
    safetensors file."""
    from safetensors.torch import save_file

    ids = torch.tensor(tokenizer(held_text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if ids.numel() < EVAL_TOKENS:
        raise SystemExit(f"the second half has {ids.numel()} tokens, fewer than {EVAL_TOKENS}")
    save_file({"eval": ids[:EVAL_TOKENS].contiguous(), "cal": cal_blocks.contiguous()}, str(path))
    return int(ids.numel())


def run_cut(python: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """One cut in its own process (``python -m benchmarks.studies.peer_llm cut``); its row."""
    work.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "work": str(work), "out": str(work / "row.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    start = time.perf_counter()
    root = Path(__file__).resolve().parents[2]  # the repository: -m finds benchmarks.harness from there
    # headcut's src/ on its path: the perplexity windows are read with headcut's own rule (not installed there)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")]))}
    command = [python, "-m", "benchmarks.studies.peer_llm", "cut", str(work / "spec.json")]
    subprocess.run(command, cwd=root, check=True, env=env)
    row = json.loads((work / "row.json").read_text())
    row["wall_seconds"] = time.perf_counter() - start
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cut", help="one cut, in this process (SPEC.json written by the harness's peer_llm study)")
    c.add_argument("spec")
    v = sub.add_parser("venv", help="make (or check) the peer's virtual environment")
    v.add_argument("path", nargs="?", default=str(DEFAULT_VENV))
    args = ap.parse_args()
    if args.command == "cut":
        cut(args.spec)
    else:
        print(ensure_venv(Path(args.path)))


if __name__ == "__main__":
    main()
