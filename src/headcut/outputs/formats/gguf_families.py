"""GGUF export, family by family: which llama.cpp architecture holds each decoder family, the tensors and
metadata keys it reads, where they come from in the transformers model, and what it cannot hold.

:mod:`.gguf` (the writer: metadata common to every family, the tokenizer, tensor storage) asks the
:class:`Family` of a model for everything family-specific. A family is a few class attributes (the
architecture, the block's layout by transformers module names, its norms, rope pairing and output
matrix) plus hooks for what a table cannot say (Gemma's soft-capping, SmolLM3's NoPE layers, the
``deci`` switch of the Llama family). Knowledge is taken from llama.cpp itself (the architecture's
hyper-parameter loader, tensor loader and graph in ``src/models/<arch>.cpp`` of the version bundled
with llama-cpp-python 0.3.36): what is written is what that code reads, no more (llama.cpp refuses a
file with tensors it does not load).

**Head counts per layer.** llama.cpp's loader reads ``attention.head_count``/``head_count_kv`` as arrays
for every architecture, but only ``deci`` (and a few unrelated ones) builds each layer with its own
counts: ``qwen3``, ``gemma2``, ``gemma3``, ``smollm3`` (like ``llama``) create every layer's tensors and
graph with layer 0's counts, so these families are written only for cuts that keep the same numbers of
query and KV heads in every layer. ``phi3``, ``gptneox`` and ``olmo2`` also fix every layer's query and
output width at the model width (``hidden_size``), so they hold only the uncut model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ...adapters import Block
from ...errors import HeadcutError

# ---- what a plan is made of ---------------------------------------------------------------------------


@dataclass
class Layer:
    """One layer's attention as written: query and KV heads (``placeholder``: one zero head standing
    in for none, ``deci`` only)."""

    heads: int
    kv_heads: int
    placeholder: bool = False


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # torch layout (out, in) or (n,)
    get: Callable[[], np.ndarray]  # float32 values in that shape


@dataclass
class Rope:
    """How llama.cpp rotates: ``n_rot`` leading values of each head, frequencies ``base ** (-2i / n_rot)``
    divided by ``factor`` (linear scaling) and by ``freqs`` (per-frequency divisors, the ``rope_freqs``
    tensor); sliding-window layers use ``base_swa`` where the architecture has one."""

    n_rot: int
    base: float
    factor: float = 1.0
    base_swa: float | None = None
    freqs: np.ndarray | None = None


def values(
    t: torch.Tensor, rows: np.ndarray | None = None, shift: float = 0.0, scale: np.ndarray | None = None
) -> Callable[[], np.ndarray]:
    """A tensor's float32 values (rows picked, ``shift`` added, rows multiplied by ``scale``), read when
    written."""

    def get() -> np.ndarray:
        arr = t.detach().to("cpu", torch.float32).numpy()
        if rows is not None:
            arr = arr[rows]
        if shift:
            arr = arr + np.float32(shift)
        if scale is not None:
            arr = arr * scale.reshape((-1,) + (1,) * (arr.ndim - 1)).astype(np.float32)
        return np.ascontiguousarray(arr, dtype=np.float32)

    return get


def zeros(*shape: int) -> Callable[[], np.ndarray]:
    return lambda: np.zeros(shape, dtype=np.float32)


def rope_pairs(heads: int, head_dim: int) -> np.ndarray:
    """Row order taking transformers' rotary layout (per head: first halves, then second halves of the
    pairs) to llama.cpp's ``norm`` rope (per head: the two values of each pair side by side)."""
    half = head_dim // 2
    per_head = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    return (np.arange(heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


def head_rows(block: Block, part: str, heads: int) -> np.ndarray:
    """The output rows of ``part`` (q, k or v) of ``block`` in its projection, head after head (fused
    projections and projections that keep removed heads included: the adapter's :meth:`Block.rows`)."""
    where = block.rows(part)
    d = block.head_dim
    order = np.array(where.order if where.order is not None else range(heads), dtype=np.int64)[:heads]
    return (where.offset + order[:, None] * (where.stride or d) + np.arange(d)[None, :]).reshape(-1)


def fail(message: str) -> HeadcutError:
    return HeadcutError(f"--format gguf: {message}")


class Plan:
    """The tensors of one file in order, and the model parameters they read (so that a parameter the
    architecture has no place for is refused, not silently dropped)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tensors: list[Tensor] = []
        self.read: set[int] = set()

    @staticmethod
    def name(kind: str, bid: int | None = None, suffix: str = "weight") -> str:
        """The file's name of tensor ``kind`` (a gguf-py ``MODEL_TENSOR`` member name) of block ``bid``."""
        import gguf

        base = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, kind)]
        return (base.format(bid=bid) if bid is not None else base) + "." + suffix

    def add(self, kind: str, bid: int | None, t: torch.Tensor, suffix: str = "weight", **how: Any) -> None:
        rows = how.get("rows")
        shape = tuple(t.shape) if rows is None else (len(rows),) + tuple(t.shape[1:])
        self.tensors.append(Tensor(self.name(kind, bid, suffix), shape, values(t, **how)))
        self.read.add(id(t))

    def add_zeros(self, kind: str, bid: int | None, shape: tuple[int, ...], suffix: str = "weight") -> None:
        self.tensors.append(Tensor(self.name(kind, bid, suffix), shape, zeros(*shape)))

    def module(self, path: str, bid: int | None = None) -> nn.Module:
        """The module at ``path`` inside layer ``bid`` (None: inside the base model)."""
        base = self.model.base_model
        return (base.layers[bid] if bid is not None else base).get_submodule(path)

    def skip(self, module: nn.Module) -> None:
        """``module``'s parameters have no place in the file, on purpose (a layer without attention)."""
        self.read.update(id(p) for p in module.parameters())

    def unread(self) -> list[str]:
        return [name for name, p in self.model.named_parameters() if id(p) not in self.read]


# ---- the families -------------------------------------------------------------------------------------


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


class LlamaFamily(Family):
    """Llama, Qwen2, Mistral: ``llama`` when every layer keeps the same heads, else ``deci`` (per-layer
    head counts; ``head_count`` 0: an attention-free layer). A layer without heads gets one zero
    placeholder head in layer 0 (llama.cpp reads the head size off it) and where the output projection has
    a bias (``deci`` drops it with the attention)."""

    model_types = ("llama", "qwen2", "mistral")
    arch = "llama"
    any_cut = True
    rope_pairing = "norm"
    biases = frozenset({"ATTN_Q", "ATTN_K", "ATTN_V", "ATTN_OUT", "FFN_GATE", "FFN_UP", "FFN_DOWN"})
    #: rope types the llama/deci graph computes exactly (scaling as per-frequency factors)
    rope_types = ("default", "linear", "llama3")

    def layers(self, model: nn.Module, blocks: list[Block]) -> list[Layer]:
        out = []
        for b in blocks:
            if b.heads == 0:
                has_bias = model.base_model.get_submodule(b.o).bias is not None
                out.append(Layer(1, 1, True) if b.layer == 0 or has_bias else Layer(0, 0))
            else:
                out.append(Layer(b.heads, b.kv_heads))
        return out

    def choose_arch(self, layers: list[Layer]) -> str:
        pairs = {(x.heads, x.kv_heads) for x in layers}
        return "llama" if len(pairs) == 1 and next(iter(pairs))[0] > 0 else "deci"

    def per_layer_counts(self, arch: str) -> bool:
        return arch == "deci"

    def rope(self, model: nn.Module, head_dim: int) -> Rope:
        rotary = getattr(model.base_model, "rotary_emb", None)
        rope_type = getattr(rotary, "rope_type", "default")
        if rope_type not in self.rope_types:
            raise HeadcutError(
                f"--format gguf supports rope types {', '.join(self.rope_types)}; this model uses {rope_type!r}"
            )
        theta = rope_theta(model.config)
        rope = Rope(head_dim, theta)
        inv, scaling = torch_frequencies(model)
        if abs(scaling - 1.0) > 1e-6:
            raise fail(f"rope attention scaling {scaling} has no llama.cpp equivalent here")
        if inv is None:
            if rope_type != "default":
                raise fail("the model's rotary frequencies cannot be read")
            return rope
        if inv.numel() != head_dim // 2:
            raise fail(f"llama.cpp rotates the whole head ({head_dim} values); this model rotates {2 * inv.numel()}")
        base = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        factors = base / inv.numpy()
        if rope_type != "default" and not np.allclose(factors, 1.0, rtol=1e-5, atol=0):
            rope.freqs = factors.astype(np.float32)
        return rope

    def notes(self, model: nn.Module, layers: list[Layer]) -> list[str]:
        config = model.config
        notes = []
        placeholders = [i for i, layer in enumerate(layers) if layer.placeholder]
        if placeholders:
            notes.append(
                "layers without heads written with one zero placeholder head (llama.cpp needs a head in "
                f"layer 0 and drops the output bias of attention-free layers): {placeholders}"
            )
        window = getattr(config, "sliding_window", None)
        kinds = getattr(config, "layer_types", None)
        sliding = "sliding_attention" in kinds if kinds else config.model_type == "mistral"
        if window and sliding:
            notes.append(
                f"the model attends over a sliding window of {window} tokens; llama.cpp's Llama block attends "
                "over the whole context, so outputs differ beyond that length"
            )
        return notes


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


class Qwen3Family(Family):
    """Qwen3: the Llama block with per-head RMSNorms of q and k (``attn_q_norm``/``attn_k_norm``), neox rope."""

    model_types = ("qwen3",)
    arch = "qwen3"
    qk_norms = ("self_attn.q_norm", "self_attn.k_norm")

    def notes(self, model: nn.Module, layers: list[Layer]) -> list[str]:
        return whole_context_note(self, model)


class SmolLM3Family(Family):
    """SmolLM3: the Llama block (norm rope) whose every 4th layer skips rope; llama.cpp hard-codes that
    pattern, so other ``no_rope_layers`` are refused."""

    model_types = ("smollm3",)
    arch = "smollm3"
    rope_pairing = "norm"
    #: llama.cpp's smollm3 graph: layer ``i`` uses rope unless ``(i + 1) % 4 == 0``
    no_rope_step = 4

    def uses_rope(self, model: nn.Module) -> list[bool]:
        return [(i + 1) % self.no_rope_step != 0 for i in range(len(model.base_model.layers))]

    def check(self, model: nn.Module) -> None:
        super().check(model)
        n = len(model.base_model.layers)
        have = [bool(x) for x in (getattr(model.config, "no_rope_layers", None) or [1] * n)]
        if have != self.uses_rope(model):
            raise fail(
                f"{self.label} skips rope in every {self.no_rope_step}th layer; this model's no_rope_layers "
                f"is {[int(x) for x in have]}"
            )

    def notes(self, model: nn.Module, layers: list[Layer]) -> list[str]:
        return whole_context_note(self, model)


class GemmaFamily(Family):
    """Gemma 2 and 3: embeddings scaled by sqrt(hidden), norms stored as ``1 + w``, post-attention and
    post-MLP norms, GELU (tanh) MLP, sliding-window layers (the pattern written per layer), attention
    scale ``query_pre_attn_scalar ** -0.5``."""

    activations = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
    norm_shift = 1.0
    layer_modules = (
        ("ATTN_NORM", "input_layernorm"),
        ("ATTN_POST_NORM", "post_attention_layernorm"),
        ("FFN_NORM", "pre_feedforward_layernorm"),
        ("FFN_POST_NORM", "post_feedforward_layernorm"),
        ("FFN_GATE", "mlp.gate_proj"),
        ("FFN_UP", "mlp.up_proj"),
        ("FFN_DOWN", "mlp.down_proj"),
    )
    #: llama.cpp sizes the attention scale by the model size it recognises from the layer count
    #: (gemma_pytorch's 27B: hidden / heads); this is that layer count
    layers_27b: ClassVar[int] = 0

    def check(self, model: nn.Module) -> None:
        super().check(model)
        if getattr(model.config, "use_bidirectional_attention", False):
            raise fail(f"{self.label} is causal; this model attends both ways")

    def attention_scale(self, model: nn.Module, layers: list[Layer], head_dim: int) -> float:
        config = model.config
        if len(layers) == self.layers_27b:
            return 1.0 / math.sqrt(float(int(config.hidden_size) // layers[0].heads))
        return 1.0 / math.sqrt(head_dim)

    def window_pattern(self, model: nn.Module) -> list[bool]:
        return [w is not None for w in sliding_layers(model)]

    def metadata(self, writer: Any, model: nn.Module, layers: list[Layer], rope: Rope) -> None:
        windows = {w for w in sliding_layers(model) if w}
        if len(windows) > 1:
            raise fail(f"{self.label} has one sliding window; this model's layers use {sorted(windows)}")
        if windows:
            writer.add_sliding_window(windows.pop())
            writer.add_sliding_window_pattern(self.window_pattern(model))


class Gemma2Family(GemmaFamily):
    model_types = ("gemma2",)
    arch = "gemma2"
    output = "tied"
    layers_27b = 46

    def check(self, model: nn.Module) -> None:
        super().check(model)
        config = model.config
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if not getattr(config, key, None):
                raise fail(
                    f"{self.label} always soft-caps (attention scores and logits); this model's {key} is "
                    f"{getattr(config, key, None)!r}"
                )
        if not any(self.window_pattern(model)):  # without, llama.cpp slides every other layer over 4096 tokens
            raise fail(
                f"{self.label} needs sliding-window layers (it aborts on a file without any); this model has none"
            )

    def metadata(self, writer: Any, model: nn.Module, layers: list[Layer], rope: Rope) -> None:
        super().metadata(writer, model, layers, rope)
        writer.add_attn_logit_softcapping(float(model.config.attn_logit_softcapping))
        writer.add_final_logit_softcapping(float(model.config.final_logit_softcapping))


class Gemma3Family(GemmaFamily):
    """Gemma 3 text: Gemma 2's block without attention soft-capping, with per-head q/k norms and a rope
    of its own (base, no scaling) in sliding-window layers."""

    model_types = ("gemma3_text",)
    arch = "gemma3"
    qk_norms = ("self_attn.q_norm", "self_attn.k_norm")
    layers_27b = 62

    def check(self, model: nn.Module) -> None:
        super().check(model)
        if getattr(model.config, "attn_logit_softcapping", None):
            raise fail(
                f"{self.label} does not soft-cap attention scores; this model's attn_logit_softcapping is "
                f"{model.config.attn_logit_softcapping}"
            )

    def rope(self, model: nn.Module, head_dim: int) -> Rope:
        config = model.config
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        theta, factor = linear_rope(self, config, "full_attention")
        rope = Rope(rotary_dims(model, head_dim), theta, factor)
        if "full_attention" in kinds:
            check_frequencies(self, model, rope, "full_attention")
        if "sliding_attention" in kinds and any(self.window_pattern(model)):
            swa_theta, _ = linear_rope(self, config, "sliding_attention")  # llama.cpp: no scaling there
            rope.base_swa = swa_theta
            check_frequencies(self, model, rope, "sliding_attention", base=swa_theta, factor=1.0)
        return rope

    def metadata(self, writer: Any, model: nn.Module, layers: list[Layer], rope: Rope) -> None:
        super().metadata(writer, model, layers, rope)
        if rope.base_swa is not None:
            writer.add_rope_freq_base_swa(rope.base_swa)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            writer.add_final_logit_softcapping(float(cap))


class Phi3Family(Family):
    """Phi-3: q, k and v in one fused projection (written as ``attn_qkv``), the MLP's gate and up in one
    (``ffn_up``, gate first), partial rotary (neox). Query and output widths are the model width."""

    model_types = ("phi3",)
    arch = "phi3"
    full_width = True
    fused_qkv = True
    layer_modules = (
        ("ATTN_NORM", "input_layernorm"),
        ("FFN_NORM", "post_attention_layernorm"),
        ("FFN_UP", "mlp.gate_up_proj"),
        ("FFN_DOWN", "mlp.down_proj"),
    )

    #: tokens llama.cpp looks up (and fails to load without) when ``general.name`` says Phi-3
    name_tokens: ClassVar[tuple[str, ...]] = ("</s>", "<unk>", "<s>", "<|endoftext|>")

    def notes(self, model: nn.Module, layers: list[Layer]) -> list[str]:
        # transformers' Phi-3 masks every layer to config.sliding_window; llama.cpp's phi3 turns it off
        window = getattr(model.config, "sliding_window", None)
        return whole_context_note(self, model, {int(window)} if window else set())

    def file_name(self, name: str, tokens: list[str]) -> str:
        # llama.cpp's vocab loader sets Phi-3 token attributes for a model whose name contains "phi3" or
        # "phi-3", by looking up these tokens: without one of them the file would not load
        if set(self.name_tokens) <= set(tokens):
            return name
        return re.sub("phi-?3", "phi", name, flags=re.IGNORECASE)


class GPTNeoXFamily(Family):
    """GPT-NeoX / Pythia: LayerNorms with biases, q|k|v fused (transformers interleaves them per head:
    regrouped), partial rotary (neox), parallel or sequential residual, GELU MLP with biases."""

    model_types = ("gpt_neox",)
    arch = "gptneox"
    activations = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")
    norm = "layer"
    output = "required"
    full_width = True
    fused_qkv = True
    biases = frozenset({"ATTN_QKV", "ATTN_OUT", "FFN_UP", "FFN_DOWN"})
    required_biases = biases
    layer_modules = (
        ("ATTN_NORM", "input_layernorm"),
        ("FFN_NORM", "post_attention_layernorm"),
        ("FFN_UP", "mlp.dense_h_to_4h"),
        ("FFN_DOWN", "mlp.dense_4h_to_h"),
    )
    final_norm = "final_layer_norm"

    def metadata(self, writer: Any, model: nn.Module, layers: list[Layer], rope: Rope) -> None:
        writer.add_parallel_residual(bool(getattr(model.config, "use_parallel_residual", True)))

    def notes(self, model: nn.Module, layers: list[Layer]) -> list[str]:
        act = getattr(model.config, "hidden_act", "gelu")
        if act == "gelu":
            return [
                "llama.cpp computes GELU with the tanh approximation; this model's 'gelu' is the exact (erf) "
                "form, so activations differ by up to about 1e-3"
            ]
        return []


class Olmo2Family(Family):
    """OLMo 2: no pre-norms; RMSNorms of q and k over every head together (before the split into heads),
    post-attention and post-MLP norms. Query and output widths are the model width."""

    model_types = ("olmo2",)
    arch = "olmo2"
    output = "required"
    full_width = True
    qk_norms = ("self_attn.q_norm", "self_attn.k_norm")
    layer_modules = (
        ("ATTN_POST_NORM", "post_attention_layernorm"),
        ("FFN_POST_NORM", "post_feedforward_layernorm"),
        ("FFN_GATE", "mlp.gate_proj"),
        ("FFN_UP", "mlp.up_proj"),
        ("FFN_DOWN", "mlp.down_proj"),
    )
    attention_norms = ()

    def layers(self, model: nn.Module, blocks: list[Block]) -> list[Layer]:
        for b in blocks:
            q_proj = model.base_model.get_submodule(b.q)
            if q_proj.weight.shape[0] != b.heads * b.head_dim:
                kept = [x.heads for x in blocks]
                raise fail(
                    f"{self.label} normalises q and k over every head of a layer and then splits them into "
                    f"query and output heads of the same count; headcut's cut OLMo 2 keeps every head's q "
                    f"and k rows for those norms but only {kept} heads' attention per layer, which llama.cpp "
                    "cannot express (only with zero-weight stand-ins for the removed heads, i.e. at the uncut "
                    "size): export the uncut model, or use safetensors/onnx"
                )
        return super().layers(model, blocks)


#: one entry per family, the model types each writes
FAMILIES: tuple[Family, ...] = (
    LlamaFamily(),
    Qwen3Family(),
    SmolLM3Family(),
    Gemma2Family(),
    Gemma3Family(),
    Phi3Family(),
    GPTNeoXFamily(),
    Olmo2Family(),
)
MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES for t in f.model_types)


def family_for(model: nn.Module) -> Family:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise HeadcutError(
        f"--format gguf writes Llama-family decoders and their kin ({', '.join(MODEL_TYPES)}); this "
        f"model is {model_type!r}"
    )
