"""GGUF export, family by family (over :mod:`.gguf_family`'s :class:`Family` and :mod:`.gguf_plan`): which llama.cpp architecture holds each decoder family, the tensors and
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
from typing import Any, ClassVar

import numpy as np
from torch import nn

from ...adapters import Block
from ...errors import HeadcutError
from .gguf_family import (
    Family,
    check_frequencies,
    linear_rope,
    rope_theta,
    rotary_dims,
    sliding_layers,
    torch_frequencies,
    whole_context_note,
)
from .gguf_plan import Layer, Rope, fail


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
