"""The :class:`Family` of a GGUF export: one transformers family as one llama.cpp architecture (the Llama block
by default; subclasses in :mod:`.gguf_families` change what differs), and the rope and sliding-window helpers
the families share."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ...adapters import Block
from .gguf_plan import Layer, Plan, Rope, Tensor, fail, head_rows, rope_pairs


class Family:
    """One transformers family as one llama.cpp architecture (defaults: the Llama block)."""

    #: transformers ``model_type`` values written this way
    model_types: ClassVar[tuple[str, ...]] = ()
    #: llama.cpp's architecture (``general.architecture``)
    arch: ClassVar[str] = ""
    #: transformers activations the architecture's MLP computes (``hidden_act``/``hidden_activation``)
    activations: ClassVar[tuple[str, ...]] = ("silu",)
    #: llama.cpp's rope pairing: ``norm`` (pairs side by side: q/k rows reordered) or ``neox`` (halves,
    #: as transformers)
    rope_pairing: ClassVar[str] = "neox"
    #: ``rms`` (``layer_norm_rms_epsilon``) or ``layer`` (``layer_norm_epsilon``, with biases)
    norm: ClassVar[str] = "rms"
    #: added to every norm weight (Gemma normalises by ``1 + w``; llama.cpp by ``w``)
    norm_shift: ClassVar[float] = 0.0
    #: the output matrix: ``optional`` (written when not tied), ``required`` (always written, a copy of
    #: the embedding when tied) or ``tied`` (never: the architecture reuses ``token_embd``)
    output: ClassVar[str] = "optional"
    #: the query and output widths are fixed at ``hidden_size``: only the uncut model fits
    full_width: ClassVar[bool] = False
    #: q, k and v as one ``attn_qkv`` tensor (q | k | v) instead of ``attn_q``/``attn_k``/``attn_v``
    fused_qkv: ClassVar[bool] = False
    #: tensors (by gguf ``MODEL_TENSOR`` name) whose bias the architecture loads
    biases: ClassVar[frozenset[str]] = frozenset({"ATTN_Q", "ATTN_K", "ATTN_V", "ATTN_QKV"})
    #: biases the architecture requires (written as zeros where the model has none)
    required_biases: ClassVar[frozenset[str]] = frozenset()
    #: per layer: gguf tensor -> module path inside the layer (norms and MLP)
    layer_modules: ClassVar[tuple[tuple[str, str], ...]] = (
        ("ATTN_NORM", "input_layernorm"),
        ("FFN_NORM", "post_attention_layernorm"),
        ("FFN_GATE", "mlp.gate_proj"),
        ("FFN_UP", "mlp.up_proj"),
        ("FFN_DOWN", "mlp.down_proj"),
    )
    #: the q and k norms (paths inside the layer), or None
    qk_norms: ClassVar[tuple[str, str] | None] = None
    #: the final norm (path inside the base model)
    final_norm: ClassVar[str] = "norm"
    #: the attention-norm tensor, left out of a layer written without attention (``deci``)
    attention_norms: ClassVar[tuple[str, ...]] = ("ATTN_NORM",)

    @property
    def label(self) -> str:
        return f"llama.cpp's {self.arch} architecture"

    # ---- what the model may be ----

    def check(self, model: nn.Module) -> None:
        """Refuse configurations the architecture computes otherwise (activation, family options)."""
        config = model.config
        key = "hidden_activation" if getattr(config, "hidden_activation", None) else "hidden_act"
        act = getattr(config, key, None) or "silu"
        if act not in self.activations:
            raise fail(f"{self.label} computes the MLP with {self.activations[0]}; this model's {key} is {act!r}")
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise fail(f"{self.label} has no output bias; this model's output layer has one")
        if self.output == "tied" and not tied(model):
            raise fail(f"{self.label} reuses the token embeddings as the output matrix; this model's are not tied")

    #: a cut may leave layers different head counts (the family switches to ``deci``)
    any_cut: ClassVar[bool] = False

    def check_cut(self, cut: str) -> None:
        """Refuse, before a search, a cut of kind ``cut`` the architecture cannot hold: ``uniform`` (the
        same head counts in every layer) or ``any`` (per-layer counts)."""
        if self.full_width:
            raise fail(
                f"{self.label} sizes the query and output projections by the model width, so it holds "
                "only the uncut model: prune without gguf (safetensors/onnx), or export the uncut model"
            )
        if cut == "any" and not self.any_cut:
            raise fail(
                f"{self.label} builds every layer with layer 0's head counts, and the search may leave "
                "layers different counts: add --uniform (the same number of heads in every layer), or "
                "prune without gguf"
            )

    def layers(self, model: nn.Module, blocks: list[Block]) -> list[Layer]:
        """Per-layer head counts as written, refusing cuts the architecture cannot build."""
        out = [Layer(b.heads, b.kv_heads) for b in blocks]
        counts = {(x.heads, x.kv_heads) for x in out}
        heads = [x.heads for x in out]
        kv = [x.kv_heads for x in out]
        hidden = int(model.config.hidden_size)
        d = blocks[0].head_dim
        if self.full_width and (len(counts) > 1 or heads[0] * d != hidden):
            raise fail(
                f"{self.label} sizes every layer's query and output projections by the model width "
                f"({hidden}), so it holds only the uncut model; this cut keeps {heads} query heads of "
                f"{d} values per layer (export the uncut model, or use safetensors/onnx)"
            )
        if len(counts) > 1:
            raise fail(
                f"{self.label} builds every layer with layer 0's head counts (per-layer counts are read "
                f"only by deci-style architectures); this cut keeps {heads} query and {kv} KV heads per "
                "layer: cut the same number of query and KV heads in every layer, or use safetensors/onnx"
            )
        if not heads[0]:
            raise fail(f"{self.label} needs attention heads; this cut removes every head")
        return out

    def choose_arch(self, layers: list[Layer]) -> str:
        return self.arch

    def per_layer_counts(self, arch: str) -> bool:
        """Does ``arch`` take the head counts as per-layer arrays?"""
        return False

    # ---- rope and attention scale ----

    def rope(self, model: nn.Module, head_dim: int) -> Rope:
        """llama.cpp's rope for this model (checked against the model's own frequencies)."""
        theta, factor = linear_rope(self, model.config)
        rope = Rope(rotary_dims(model, head_dim), theta, factor)
        check_frequencies(self, model, rope, None)
        return rope

    def attention_scale(self, model: nn.Module, layers: list[Layer], head_dim: int) -> float:
        """The factor llama.cpp multiplies q·k by."""
        return 1.0 / math.sqrt(head_dim)

    # ---- metadata and tensors ----

    def metadata(self, writer: Any, model: nn.Module, layers: list[Layer], rope: Rope) -> None:
        """Keys beyond those every architecture takes (written by :mod:`.gguf`)."""

    def notes(self, model: nn.Module, layers: list[Layer]) -> list[str]:
        return []

    def file_name(self, name: str, tokens: list[str]) -> str:
        """``general.name`` for a model called ``name`` whose vocabulary is ``tokens``."""
        return name

    def plan(
        self, model: nn.Module, layers: list[Layer], blocks: list[Block], rope: Rope, q_scale: list[float]
    ) -> list[Tensor]:
        plan = Plan(model)
        base = model.base_model
        plan.add("TOKEN_EMBD", None, model.get_input_embeddings().weight)
        if rope.freqs is not None:
            freqs = rope.freqs
            plan.tensors.append(Tensor(plan.name("ROPE_FREQS"), tuple(freqs.shape), lambda: freqs))
        for i, (layer, block) in enumerate(zip(layers, blocks)):
            self.layer_tensors(plan, i, layer, block, q_scale[i])
        self.norm_tensor(plan, "OUTPUT_NORM", None, base.get_submodule(self.final_norm))
        head = model.get_output_embeddings()
        if self.output == "required" or (self.output == "optional" and not tied(model)):
            plan.add("OUTPUT", None, head.weight)
        elif tied(model):
            plan.read.add(id(head.weight))
        unread = plan.unread()
        if unread:
            raise fail(
                f"{self.label} has no tensor for this model's {unread[0]}"
                + (f" (and {len(unread) - 1} more)" if len(unread) > 1 else "")
            )
        return plan.tensors

    def norm_tensor(
        self, plan: Plan, kind: str, bid: int | None, module: nn.Module, shift: bool = True, scale: float = 1.0
    ) -> None:
        weight = module.weight
        how: dict[str, Any] = {"shift": self.norm_shift if shift else 0.0}
        if scale != 1.0:
            how["scale"] = np.full(weight.shape[0], scale)
        plan.add(kind, bid, weight, **how)
        bias = getattr(module, "bias", None)
        if bias is not None:
            plan.add(kind, bid, bias, "bias")

    def layer_tensors(self, plan: Plan, i: int, layer: Layer, block: Block, q_scale: float) -> None:
        """Layer ``i``: its norms and MLP (:attr:`layer_modules`), then its attention."""
        for kind, path in self.layer_modules:
            module = plan.module(path, i)
            if kind in self.attention_norms and not layer.heads:
                plan.skip(module)  # deci: an attention-free layer has no attention norm either
            elif kind.endswith("NORM"):
                self.norm_tensor(plan, kind, i, module)
            else:
                self.linear(plan, kind, i, module)
        self.attention_tensors(plan, i, layer, block, q_scale)

    def linear(self, plan: Plan, kind: str, bid: int, module: nn.Module, **how: Any) -> None:
        plan.add(kind, bid, module.weight, **how)
        self.bias(plan, kind, bid, module, how.get("rows"), how.get("scale"))

    def bias(
        self,
        plan: Plan,
        kind: str,
        bid: int,
        module: nn.Module,
        rows: np.ndarray | None = None,
        scale: np.ndarray | None = None,
    ) -> None:
        bias = getattr(module, "bias", None)
        if bias is not None and kind in self.biases:
            plan.add(kind, bid, bias, "bias", rows=rows, scale=scale)
        elif bias is None and kind in self.required_biases:
            n = len(rows) if rows is not None else module.weight.shape[0]
            plan.add_zeros(kind, bid, (n,), "bias")

    def attention_tensors(self, plan: Plan, i: int, layer: Layer, block: Block, q_scale: float) -> None:
        """q, k, v (separate or fused), their norms, and the output projection of layer ``i``; the query
        (or its norm) multiplied by ``q_scale``."""
        base = plan.model.base_model
        if not layer.heads:  # deci: an attention-free layer has no attention tensors
            plan.skip(base.get_submodule(block.attn))
            return
        d = block.head_dim
        o_proj = base.get_submodule(block.o)
        hidden = o_proj.weight.shape[0]
        if layer.placeholder:
            for kind in ("ATTN_Q", "ATTN_K", "ATTN_V"):
                plan.add_zeros(kind, i, (d, hidden))
            plan.add_zeros("ATTN_OUT", i, (hidden, d))
            plan.skip(base.get_submodule(block.attn))
            if o_proj.bias is not None:
                plan.add("ATTN_OUT", i, o_proj.bias, "bias")
            return
        parts = {}
        for part, n in (("q", layer.heads), ("k", layer.kv_heads), ("v", layer.kv_heads)):
            rows = head_rows(block, part, n)
            if part != "v" and self.rope_pairing == "norm":
                rows = rows[rope_pairs(n, d)]
            parts[part] = rows
        norms = self.qk_norms
        fold_q = q_scale != 1.0 and norms is None
        q_mult = np.full(len(parts["q"]), q_scale) if fold_q else None
        if self.fused_qkv:
            proj = base.get_submodule(block.q)
            rows = np.concatenate([parts["q"], parts["k"], parts["v"]])
            scale = None
            if fold_q:
                scale = np.ones(len(rows))
                scale[: len(parts["q"])] = q_scale
            self.linear(plan, "ATTN_QKV", i, proj, rows=rows, scale=scale)
        else:
            paths = {"q": block.q, "k": block.k, "v": block.v}
            for part, kind in (("q", "ATTN_Q"), ("k", "ATTN_K"), ("v", "ATTN_V")):
                proj = base.get_submodule(paths[part])
                self.linear(plan, kind, i, proj, rows=parts[part], scale=q_mult if part == "q" else None)
        if norms is not None:
            for path, kind, scale in ((norms[0], "ATTN_Q_NORM", q_scale), (norms[1], "ATTN_K_NORM", 1.0)):
                self.norm_tensor(plan, kind, i, plan.module(path, i), scale=scale)
        plan.add("ATTN_OUT", i, o_proj.weight)
        self.bias(plan, "ATTN_OUT", i, o_proj)


def tied(model: nn.Module) -> bool:
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return emb is head or (emb.data_ptr() == head.data_ptr() and emb.shape == head.shape)


def rope_params(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    return params if isinstance(params, dict) else {}


def rope_theta(config: Any, layer_type: str | None = None) -> float:
    theta = rope_params(config, layer_type).get("rope_theta")
    return float(theta if theta is not None else getattr(config, "rope_theta", 10000.0))


def linear_rope(family: Family, config: Any, layer_type: str | None = None) -> tuple[float, float]:
    """(base, linear factor) of a rope llama.cpp computes with its base and ``rope.scaling.factor``."""
    params = rope_params(config, layer_type)
    kind = params.get("rope_type", "default")
    if kind not in ("default", "linear"):
        raise fail(f"{family.label} computes rope types default and linear here; this model uses {kind!r}")
    factor = float(params.get("factor") or 1.0) if kind == "linear" else 1.0
    return rope_theta(config, layer_type), factor


def torch_frequencies(model: nn.Module, layer_type: str | None = None) -> tuple[torch.Tensor | None, float]:
    """The model's own rotary inverse frequencies (and cos/sin scaling) for ``layer_type``'s layers."""
    rotary = getattr(model.base_model, "rotary_emb", None)
    inv = getattr(rotary, f"{layer_type}_inv_freq", None) if layer_type else None
    scaling = getattr(rotary, f"{layer_type}_attention_scaling", None) if layer_type else None
    if inv is None:
        inv = getattr(rotary, "inv_freq", None)
        scaling = getattr(rotary, "attention_scaling", 1.0)
    if not isinstance(inv, torch.Tensor) or inv.is_meta:
        return None, float(scaling or 1.0)
    return inv.detach().double().cpu(), float(scaling if scaling is not None else 1.0)


def rotary_dims(model: nn.Module, head_dim: int) -> int:
    """How many values of each head the model rotates (partial rotary: fewer than the head)."""
    inv, _ = torch_frequencies(model, None)
    if inv is not None:
        return 2 * int(inv.numel())
    factor = rope_params(model.config).get("partial_rotary_factor", 1.0) or 1.0
    return int(head_dim * factor)


def check_frequencies(
    family: Family,
    model: nn.Module,
    rope: Rope,
    layer_type: str | None,
    base: float | None = None,
    factor: float | None = None,
) -> None:
    """Refuse unless llama.cpp's rope frequencies (``base``, ``factor``, ``rope.freqs``) are the model's."""
    inv, scaling = torch_frequencies(model, layer_type)
    if abs(scaling - 1.0) > 1e-6:
        raise fail(f"rope attention scaling {scaling} has no equivalent in {family.label}")
    if inv is None:
        return
    n = rope.n_rot
    if inv.numel() * 2 != n:
        raise fail(f"{family.label} rotates {n} values per head; this model rotates {2 * inv.numel()}")
    base = rope.base if base is None else base
    factor = rope.factor if factor is None else factor
    want = 1.0 / base ** (np.arange(0, n, 2, dtype=np.float64) / n) / factor
    if rope.freqs is not None:
        want = want / rope.freqs.astype(np.float64)
    if not np.allclose(inv.numpy(), want, rtol=1e-5, atol=0):
        what = layer_type.replace("_", " ") + " layers" if layer_type else "this model"
        raise fail(f"the rope frequencies of {what} have no exact form in {family.label}")


def sliding_layers(model: nn.Module, attn: str = "self_attn") -> list[int | None]:
    """Each layer's sliding window as the transformers attention module applies it (None: full)."""
    out = []
    for layer in model.base_model.layers:
        module = getattr(layer, attn, None)
        window = getattr(module, "sliding_window", None)
        out.append(int(window) if window else None)
    return out


def whole_context_note(family: Family, model: nn.Module, windows: set[int] | None = None) -> list[str]:
    """A note for a model with sliding-window layers written to an architecture without them."""
    windows = windows if windows is not None else {w for w in sliding_layers(model) if w}
    if not windows:
        return []
    return [
        f"the model attends over a sliding window of {min(windows)} tokens; {family.label} attends over the "
        "whole context, so outputs differ beyond that length"
    ]
