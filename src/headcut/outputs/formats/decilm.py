"""``--format decilm``: a cut with different head counts per layer written in NVIDIA's DeciLM / Nemotron-NAS layout,
which serving engines load natively (vLLM's ``DeciLMForCausalLM``, TensorRT-LLM, mlx-lm; llama.cpp's ``deci`` is
what ``--format gguf`` writes).

The layout: Llama weight names and a ``block_configs`` list in ``config.json``, one entry per layer. Every layer has
the same number of query heads ``Q`` (``num_attention_heads``) of size ``head_dim``; a layer's KV heads are ``Q //
attention.n_heads_in_group``, and ``attention.no_op`` drops its attention (no tensors, not even its norm). The
configuration class is remote code in transformers and vLLM: the folder holds headcut's own
``configuration_decilm.py`` (:mod:`headcut.outputs.formats.configuration_decilm`, ``auto_map``), so engines load it
with ``trust_remote_code``; the modelling is the engine's own (transformers has none: ``headcut.load`` the cut itself).

What is written, into ``OUT/decilm/`` (config.json, model.safetensors, the tokenizer and generation files of the
output, the configuration code):

* **Query heads and padding.** headcut's cut keeps, in layer ``l``, ``kv_l`` KV heads each read by ``g_l`` query
  heads. DeciLM needs one ``Q`` that every written KV count divides. :func:`plan_heads` tries every ``Q`` up to
  four times the largest query count: a layer writes the smallest divisor ``k`` of ``Q`` with ``k >= kv_l`` and
  ``Q / k >= g_l``; each kept KV head's group gets ``Q / k`` query slots, its real query heads first and then zero
  ones (zero q rows and biases, zero o columns: their output adds exactly nothing), and a layer's ``k - kv_l``
  padded KV heads are zero too (read only by zero query heads). Padding costs either way: a zero query head its q
  rows and o columns and its attention over the whole context (the engine computes it like any other: its scores
  read every cached key and value of its group), a zero KV head its k and v rows and its KV cache. The plan kept
  does the least of that work per decoded token at the model's full context (``max_position_embeddings``): each
  query or KV head written costs its two rows and the context's K and V, so the fewest query plus KV heads; then
  the fewest query heads. (Counting only bytes stored, KV padding looked dearer; vLLM on CPU measured otherwise:
  the benchmark page's "Serving in vLLM".) The report gives its padding (query heads, KV heads and parameters added) and the best
  plan without KV padding and with ``Q`` = the model's query heads, where they differ, so the cost of the choice
  is on record.
* **Layers without heads** are ``no_op``, except layer 0 (vLLM's DeciLM starts its residual stream in layer 0's
  attention) and any layer of a model whose output projection has a bias (``no_op`` would drop it): those keep one
  zero KV head with ``Q`` zero query heads, which add exactly their output bias.
* The MLP of every layer is the model's own (``ffn.intermediate_size``); the rest of the config is the model's.

Families: those whose adapter gives a :meth:`headcut.adapters.Adapter.decilm_spec` for the model's config (Llama,
Mistral without a sliding window, Qwen2; RoPE and activation as vLLM's DeciLM computes them), the others refused
with :meth:`headcut.adapters.Adapter.no_decilm_reason`; fields a DeciLM engine reads beyond a Llama config
(:data:`FOREIGN_FIELDS`) are written only as the family's spec sets them, and every tensor written must have its
place in the layout (:data:`LAYOUT`). A cut written as a stock checkpoint (the same heads in every layer, where
the family's stock config holds them: :func:`headcut.model.stock.stock_form`) is refused, that checkpoint being
what engines serve; a cut with the same heads in every layer written in headcut's form (every head dropped, or
counts the stock config refuses) is written. Models that are not causal LMs are refused.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...adapters import adapter_for
from ...errors import HeadcutError
from ...model.saving import SIDE_FILES
from ...model.stock import stock_form
from . import configuration_decilm

#: the subfolder of an output that holds the DeciLM checkpoint
DECILM_FOLDER = "decilm"
#: the query-head counts tried: up to this many times the largest count a layer keeps
Q_FACTOR = 4
#: config fields vLLM's DeciLM reads that a Llama config does not have (a window, q/k/v biases apart from o's, a
#: logit scale, a non-NeoX rotary): dropped from the model's config, so only the family's spec sets them
FOREIGN_FIELDS = ("sliding_window", "layer_types", "bias", "qkv_bias", "logit_scale", "position_embedding_type")
#: the tensor names DeciLM's Llama layout has a place for (vLLM's loader refuses any other)
LAYOUT = re.compile(
    r"lm_head\.weight|model\.(embed_tokens|norm)\.weight"
    r"|model\.layers\.\d+\.((input|post_attention)_layernorm\.weight"
    r"|self_attn\.[qkvo]_proj\.(weight|bias)|mlp\.(gate|up|down)_proj\.(weight|bias))"
)


@dataclass
class LayerPlan:
    """One layer in the DeciLM checkpoint: ``kv`` KV heads kept by the cut (``groups`` query heads each),
    ``written`` KV heads written (0: ``no_op``)."""

    kv: int
    groups: int
    written: int


@dataclass
class HeadPlan:
    """The query-head count ``q`` of every layer and each layer's written KV heads."""

    q: int
    layers: list[LayerPlan]

    @property
    def kv_written(self) -> int:
        return sum(layer.written for layer in self.layers)

    @property
    def q_written(self) -> int:
        return sum(self.q for layer in self.layers if layer.written)

    def cost(self, head_dim: int, hidden: int) -> dict[str, int]:
        """What the plan writes beyond the cut: query heads, KV heads and parameters (q, k, v, o)."""
        q_added = sum(self.q - layer.kv * layer.groups for layer in self.layers if layer.written)
        kv_added = sum(layer.written - layer.kv for layer in self.layers)
        return {
            "query_heads": self.q,
            "kv_heads_written": self.kv_written,
            "query_heads_added": q_added,
            "kv_heads_added": kv_added,
            "params_added": (2 * q_added + 2 * kv_added) * head_dim * hidden,
        }


def _layer_plan(q: int, kv: int, groups: int, placeholder: bool) -> LayerPlan | None:
    if kv == 0:
        return LayerPlan(0, 0, 1 if placeholder else 0)
    for k in range(kv, q + 1):
        if q % k == 0 and q // k >= groups:
            return LayerPlan(kv, groups, k)
    return None


def _plan(q: int, kept: list[tuple[int, int]], placeholders: set[int]) -> HeadPlan | None:
    layers = []
    for i, (kv, groups) in enumerate(kept):
        layer = _layer_plan(q, kv, groups, i in placeholders)
        if layer is None:
            return None
        layers.append(layer)
    return HeadPlan(q, layers)


def plan_heads(
    kept: list[tuple[int, int]],
    placeholders: set[int],
    original_q: int,
    q_head_bytes: int = 1,
    kv_head_bytes: int = 1,
    query_heads: int | None = None,
) -> dict[str, HeadPlan]:
    """The DeciLM plans for layers keeping ``kept`` = ``(kv heads, query heads per KV head)`` each (see the
    module): ``chosen``, the plan with the least work per decoded token (``q_head_bytes`` per query head written,
    ``kv_head_bytes`` per KV head written: see :func:`export_decilm`), then the fewest query heads; or the plan with ``query_heads``
    when given. For the record: ``no_kv_padding`` (the fewest query heads among plans that pad no KV head) and
    ``original_q`` (``Q`` = the model's count)."""
    top = max([kv * g for kv, g in kept] + [1])
    plans = [p for q in range(1, Q_FACTOR * max(top, original_q) + 1) if (p := _plan(q, kept, placeholders))]
    if not plans:
        raise HeadcutError("--format decilm: no query-head count holds this cut's layers")
    if query_heads is not None:
        given = [p for p in plans if p.q == query_heads]
        if not given:
            raise HeadcutError(f"--format decilm: {query_heads} query heads per layer cannot hold this cut's layers")
        chosen = given[0]
    else:
        chosen = min(plans, key=lambda p: (p.q_written * q_head_bytes + p.kv_written * kv_head_bytes, p.q))
    out = {"chosen": chosen}
    exact = [p for p in plans if all(layer.written == layer.kv or layer.kv == 0 for layer in p.layers)]
    if exact:
        out["no_kv_padding"] = min(exact, key=lambda p: p.q)
    same = _plan(original_q, kept, placeholders)
    if same is not None:
        out["original_q"] = same
    return out


def _rows(weight: torch.Tensor, heads: list[int | None], head_dim: int, dim: int) -> torch.Tensor:
    """``weight`` regrouped along ``dim`` into the head slots ``heads`` (an index into the cut's heads, or None
    for a zero head)."""
    width = weight.shape[1 - dim] if weight.dim() == 2 else None
    parts = []
    for h in heads:
        if h is None:
            shape = (head_dim,) if weight.dim() == 1 else ((head_dim, width) if dim == 0 else (width, head_dim))
            parts.append(torch.zeros(shape, dtype=weight.dtype, device=weight.device))
        else:
            parts.append(weight.narrow(dim, h * head_dim, head_dim))
    if not parts:
        return weight.narrow(dim, 0, 0).clone()
    return torch.cat(parts, dim=dim).contiguous()


@dataclass
class DecilmExport:
    """What ``--format decilm`` wrote (the report's ``formats.decilm``)."""

    folder: str
    query_heads: int
    kv_heads: list[int]
    no_op_layers: list[int]
    padding: dict[str, int]
    alternatives: dict[str, dict[str, int]]
    kv_bytes_per_token: dict[str, int]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "architecture": "DeciLMForCausalLM",
            "loader": f"vllm serve OUT/{self.folder} --trust-remote-code",
            "query_heads": self.query_heads,
            "kv_heads": list(self.kv_heads),
            "no_op_layers": list(self.no_op_layers),
            "padding": dict(self.padding),
            "alternatives": {k: dict(v) for k, v in self.alternatives.items()},
            "kv_bytes_per_token": dict(self.kv_bytes_per_token),
            "notes": list(self.notes),
        }


def check_decilm(model: nn.Module, cut: str | None = None) -> None:
    """Refuse ``--format decilm`` for what it cannot hold, before any long work: a model that is not a causal LM,
    a family whose blocks are not Llama's, a model with other attention than one self-attention per layer, a cut
    that will keep the same heads in every layer (``cut="uniform"``)."""
    if cut == "uniform":
        raise HeadcutError(
            "--format decilm is for cuts with different heads per layer; --uniform writes a stock checkpoint, "
            "which is what engines serve"
        )
    config = model.config
    adapter = adapter_for(model)
    if getattr(config, "is_encoder_decoder", False) or not getattr(model, "can_generate", lambda: False)():
        raise HeadcutError("--format decilm writes causal LMs (DeciLMForCausalLM); this model is not one")
    if adapter.decilm_spec(config) is None:
        family = getattr(config, "model_type", None) or adapter.family
        raise HeadcutError(f"--format decilm: {family}: {adapter.no_decilm_reason(config)}")
    blocks = adapter.blocks(model.base_model)
    if len(blocks) != getattr(config, "num_hidden_layers", -1) or any(b.fused_qkv or b.layout for b in blocks):
        raise HeadcutError("--format decilm holds one Llama attention per layer; this model has another layout")


def _base_config(model: nn.Module, q: int, head_dim: int, blocks: list[dict[str, Any]], sets: Any) -> dict[str, Any]:
    data = model.config.to_dict()
    for key in ("headcut", "auto_map", "architectures", "transformers_version", "custom_pipelines", "_name_or_path"):
        data.pop(key, None)
    for key in FOREIGN_FIELDS:
        data.pop(key, None)
    data.update(dict(sets))
    data.update(
        model_type=configuration_decilm.DeciLMConfig.model_type,
        architectures=["DeciLMForCausalLM"],
        auto_map={"AutoConfig": "configuration_decilm.DeciLMConfig"},
        num_attention_heads=q,
        num_key_value_heads=max(
            [q // b["attention"]["n_heads_in_group"] for b in blocks if b["attention"]["n_heads_in_group"]] or [1]
        ),
        head_dim=head_dim,
        block_configs=blocks,
    )
    return data


def export_decilm(model: nn.Module, folder: Path, query_heads: int | None = None) -> DecilmExport:
    """Write ``folder/decilm/`` from the cut ``model`` (``folder`` holds the saved output: its tokenizer files are
    copied). See the module for the layout and the padding; ``query_heads``: write this ``Q`` instead of the one
    chosen (the serving study measures both)."""
    check_decilm(model)
    adapter = adapter_for(model)
    spec = adapter.decilm_spec(model.config)
    assert spec is not None
    base = model.base_model
    blocks = sorted(adapter.blocks(base), key=lambda b: b.layer)
    if len({(b.heads, b.kv_heads) for b in blocks}) == 1 and stock_form(model).stock:
        raise HeadcutError(
            "--format decilm is for cuts with different heads per layer; this model keeps the same heads in every "
            "layer, and its stock checkpoint is what engines serve"
        )
    head_dim = blocks[0].head_dim
    if any(b.head_dim != head_dim for b in blocks):
        raise HeadcutError("--format decilm holds one head size for every layer")
    hidden = int(model.config.hidden_size)
    prefix = {name for name, _ in model.named_modules() if name and model.get_submodule(name) is base}
    root = (prefix.pop() + ".") if prefix else ""
    state = {k: v for k, v in model.state_dict().items()}
    o_bias = any(state.get(f"{root}{b.o}.bias") is not None for b in blocks)
    placeholders = {0} | ({b.layer for b in blocks} if o_bias else set())
    kept = [(b.kv_heads, b.heads // b.kv_heads if b.kv_heads else 0) for b in blocks]
    value_bytes = next(iter(state.values())).element_size() if state else 4
    context = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
    # per decoded token at the full context: a query head reads its q row and o column and attends over the
    # context's keys and values; a KV head holds them (and its k and v rows): the same order of work each
    per_head = 2 * head_dim * (hidden + context) * value_bytes
    plans = plan_heads(
        kept,
        placeholders,
        int(model.config.num_attention_heads),
        q_head_bytes=per_head,
        kv_head_bytes=per_head,
        query_heads=query_heads,
    )
    plan = plans["chosen"]
    q = plan.q
    block_configs, no_op = [], []
    ffn = {"intermediate_size": int(model.config.intermediate_size), "no_op": False, "replace_with_linear": False}
    for block, layer in zip(blocks, plan.layers):
        attn_prefix = f"{root}{spec.layers}.{block.layer}.{spec.attention}."
        norm_prefix = f"{root}{spec.layers}.{block.layer}.{spec.norm}."
        names = [k for k in state if k.startswith(attn_prefix)]
        if layer.written == 0:
            no_op.append(block.layer)
            block_configs.append(
                {"attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False}, "ffn": ffn}
            )
            for k in names + [k for k in state if k.startswith(norm_prefix)]:
                state.pop(k)
            continue
        per_group = q // layer.written
        q_slots: list[int | None] = []
        for g in range(layer.written):
            real = layer.groups if g < layer.kv else 0
            q_slots += [g * layer.groups + j if j < real else None for j in range(per_group)]
        kv_slots: list[int | None] = [g if g < layer.kv else None for g in range(layer.written)]
        for part, slots, dim in (("q", q_slots, 0), ("k", kv_slots, 0), ("v", kv_slots, 0)):
            path = getattr(block, part)
            for kind in ("weight", "bias"):
                key = f"{root}{path}.{kind}"
                if key in state:
                    state[key] = _rows(state[key], slots, head_dim, dim)
        key = f"{root}{block.o}.weight"
        state[key] = _rows(state[key], q_slots, head_dim, 1)
        block_configs.append(
            {
                "attention": {"n_heads_in_group": per_group, "no_op": False, "replace_with_linear": False},
                "ffn": ffn,
            }
        )
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    for name, tensor in list(state.items()):  # tied weights (the output head): written once, under the first name
        ident = (tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and ident in seen:
            state.pop(name)
        else:
            seen[ident] = name
    tensors = {k: v.detach().contiguous() for k, v in state.items()}
    stray = [k for k in tensors if not LAYOUT.fullmatch(k)]
    if stray:
        raise HeadcutError(f"--format decilm: {stray[0]} has no place in DeciLM's Llama layout")
    target = folder / DECILM_FOLDER
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    from safetensors.torch import save_file

    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = _base_config(model, q, head_dim, block_configs, spec.sets)
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(configuration_decilm.__file__, target / "configuration_decilm.py")
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name in SIDE_FILES and f.name != "config.json":
            shutil.copyfile(f, target / f.name)
    per_token = 2 * head_dim * value_bytes
    original_kv = int(getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads)
    alternatives = {k: p.cost(head_dim, hidden) for k, p in plans.items() if k != "chosen" and p.q != q}
    notes = []
    if plan.layers and plan.layers[0].written and plan.layers[0].kv == 0:
        notes.append("layer 0 keeps one zero KV head: vLLM's DeciLM starts its residual stream in layer 0's attention")
    return DecilmExport(
        folder=DECILM_FOLDER,
        query_heads=q,
        kv_heads=[layer.written for layer in plan.layers],
        no_op_layers=no_op,
        padding=plan.cost(head_dim, hidden),
        alternatives=alternatives,
        kv_bytes_per_token={
            "written": plan.kv_written * per_token,
            "cut": sum(layer.kv for layer in plan.layers) * per_token,
            "unpruned": original_kv * len(blocks) * per_token,
        },
        notes=notes,
    )
