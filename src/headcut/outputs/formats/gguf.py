"""GGUF export for llama.cpp: Llama-family causal language models (Llama, Qwen2, Mistral).

What is written (``model-<type>.gguf`` inside the output folder, through a temporary file and a rename):

* **Architecture.** llama.cpp's ``llama`` architecture builds every layer with layer 0's head counts,
  so it is written only when every layer keeps the same numbers of query and KV heads (the unpruned
  model, or a cut that keeps as many heads in every layer). Any other cut is written as ``deci`` (DeciLM /
  Llama-3_1-Nemotron-51B in llama.cpp): the same Llama block, with ``attention.head_count`` and
  ``attention.head_count_kv`` as per-layer arrays; each layer's ratio of the two is its GQA group size
  (query head ``h`` reads KV head ``h // (heads / kv_heads)``, as in transformers).
* **Layers without heads.** ``deci`` runs a layer with ``head_count`` 0 attention-free (the residual
  passes unchanged, no KV cache rows), which is exactly headcut's empty attention when the output
  projection has no bias; such a layer carries no attention tensors (not even its norm). Two cases
  cannot use it and get one *placeholder head* instead, whose q, k, v and output weights are zero (so
  the attention adds exactly zero, plus the output bias): layer 0, because llama.cpp derives the head
  size from layer 0's head count, and a layer whose output projection has a bias (``deci`` drops the
  bias of an attention-free layer). The export's ``head_count`` shows what the file holds, and a note
  names the placeholder layers.
* **Where the tensors come from.** The attention projections, head counts and head size come from
  headcut's adapter (its blocks' paths); the rest of the block (norms, MLP, embeddings, output) is read
  by transformers' Llama module names, the layout llama.cpp's own tensor map assumes.
* **Weights.** Query and key rows (and their biases) are reordered per head from transformers'
  half-split rotary layout to llama.cpp's interleaved one (its ``llama``/``deci`` rope). Rope scaling
  ``linear`` and ``llama3`` are written as a ``rope_freqs`` tensor read off the model's own inverse
  frequencies; other rope types are refused. Tied embeddings write no ``output`` tensor. ``f32`` keeps
  every tensor in float32; ``f16`` and ``q8_0`` store the matrices as float16 / Q8_0 (gguf-py's
  quantiser; a matrix whose rows are not a multiple of 32 values falls back to float16) and the
  vectors (norms, biases) as float32.
* **Tokenizer.** Byte-level BPE tokenizers (``tokenizer.json``: Llama 3, Qwen2, SmolLM, GPT-2 style)
  are written as llama.cpp's ``gpt2`` model: tokens, token types (special added tokens are control
  tokens), merges, the pre-tokenizer recognised from ``tokenizer.json`` (``gpt-2``, ``smollm``,
  ``llama-bpe``, ``qwen2``; otherwise ``default`` with a note), bos/eos/unk/pad ids, whether bos/eos
  are added (as the transformers tokenizer does) and the chat template. SentencePiece tokenizers
  (Llama 2, Mistral v0.1) and folders without ``tokenizer.json`` are refused.

The writer streams one tensor at a time (memory: the model plus one converted tensor).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...adapters import Block
from ...catalog import GGUF_TYPES
from ...errors import HeadcutError

#: transformers model types the writer knows (llama.cpp's Llama family)
MODEL_TYPES = ("llama", "qwen2", "mistral")
#: rope types llama.cpp's llama/deci graph computes exactly (scaling as per-frequency factors)
ROPE_TYPES = ("default", "linear", "llama3")
#: Q8_0 block size (values per row must be a multiple of it)
_Q8_BLOCK = 32

__all__ = ["GGUF_TYPES", "GgufExport", "check_gguf", "export_gguf", "gguf_file_name"]


@dataclass
class GgufExport:
    """What :func:`export_gguf` wrote: the file (relative to the folder), its tensor type, the llama.cpp
    architecture, the per-layer head counts as written, its size, the time taken and notes."""

    file: str
    outtype: str
    arch: str
    head_count: list[int]
    head_count_kv: list[int]
    bytes: int
    seconds: float
    tokenizer: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file, "outtype": self.outtype, "arch": self.arch, "head_count": list(self.head_count),
            "head_count_kv": list(self.head_count_kv), "bytes": self.bytes, "seconds": round(self.seconds, 3),
            "tokenizer": self.tokenizer, "notes": list(self.notes),
        }


def gguf_file_name(outtype: str) -> str:
    return f"model-{outtype}.gguf"


# ---- what the model is ------------------------------------------------------------------------------

@dataclass
class _Layer:
    heads: int  # query heads written to the file
    kv_heads: int
    placeholder: bool = False  # one zero head standing in for none


def _class_name(model: nn.Module) -> str:
    return type(model).__name__.removeprefix("Headcut")


def _check_family(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise HeadcutError(f"--format gguf writes Llama-family models ({', '.join(MODEL_TYPES)}); "
                           f"this model is {model_type!r}")
    name = _class_name(model)
    if not name.endswith("ForCausalLM") or not isinstance(getattr(model, "lm_head", None), nn.Linear):
        raise HeadcutError(f"--format gguf writes causal language models (...ForCausalLM); this model is {name}")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise HeadcutError(f"--format gguf: llama.cpp's Llama block uses silu; this model's hidden_act is {act!r}")
    lm_bias = model.lm_head.bias
    if lm_bias is not None:
        raise HeadcutError("--format gguf: llama.cpp's Llama output layer has no bias; this model's lm_head has one")


def _blocks(model: nn.Module) -> list[Block]:
    """The attention blocks, one per layer in order (the adapter's view: projections, heads, head size)."""
    from ...adapters import adapter_for

    return sorted(adapter_for(model).blocks(model.base_model), key=lambda b: b.layer)


def _part(model: nn.Module, path: str) -> nn.Module:
    return model.base_model.get_submodule(path)


def _layers(model: nn.Module) -> list[_Layer]:
    """Per-layer head counts as they will be written (refusing cuts llama.cpp cannot run)."""
    blocks = _blocks(model)
    out = []
    for b in blocks:
        if b.heads == 0:
            has_bias = _part(model, b.o).bias is not None
            out.append(_Layer(1, 1, True) if b.layer == 0 or has_bias else _Layer(0, 0))
            continue
        groups = getattr(_part(model, b.attn), "num_key_value_groups", None)
        if b.kv_heads == 0 or b.heads % b.kv_heads or (groups is not None and groups * b.kv_heads != b.heads):
            raise HeadcutError(f"--format gguf: layer {b.layer} has {b.heads} query heads over {b.kv_heads} KV heads "
                               f"(groups {groups}); llama.cpp needs every KV head to serve the same number of query heads")
        out.append(_Layer(b.heads, b.kv_heads))
    dims = {b.head_dim for b in blocks}
    if len(dims) != 1 or next(iter(dims)) % 2:
        raise HeadcutError(f"--format gguf: llama.cpp needs one even head size in every layer; this model has {sorted(dims)}")
    return out


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else getattr(config, "rope_theta", 10000.0))


def _rope_factors(model: nn.Module, head_dim: int) -> np.ndarray | None:
    """llama.cpp's per-frequency divisors (``rope_freqs``) for the model's rope, or None for plain rope."""
    rotary = getattr(model.base_model, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise HeadcutError(f"--format gguf supports rope types {', '.join(ROPE_TYPES)}; this model uses {rope_type!r}")
    scaling = float(getattr(rotary, "attention_scaling", 1.0) or 1.0)
    if abs(scaling - 1.0) > 1e-6:
        raise HeadcutError(f"--format gguf: rope attention scaling {scaling} has no llama.cpp equivalent here")
    inv = getattr(rotary, "inv_freq", None)
    if not isinstance(inv, torch.Tensor) or inv.is_meta:
        if rope_type == "default":
            return None
        raise HeadcutError("--format gguf: the model's rotary frequencies cannot be read")
    if inv.numel() != head_dim // 2:
        raise HeadcutError(f"--format gguf: llama.cpp rotates the whole head ({head_dim} values); this model rotates "
                           f"{2 * inv.numel()}")
    base = 1.0 / _rope_theta(model.config) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factors = base / inv.detach().double().cpu().numpy()
    if rope_type == "default" or np.allclose(factors, 1.0, rtol=1e-5, atol=0):
        return None
    return factors.astype(np.float32)


def _notes(model: nn.Module, layers: list[_Layer]) -> list[str]:
    config = model.config
    notes = []
    placeholders = [i for i, layer in enumerate(layers) if layer.placeholder]
    if placeholders:
        notes.append("layers without heads written with one zero placeholder head (llama.cpp needs a head in layer 0 "
                      f"and drops the output bias of attention-free layers): {placeholders}")
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    sliding = "sliding_attention" in kinds if kinds else config.model_type == "mistral"
    if window and sliding:
        notes.append(f"the model attends over a sliding window of {window} tokens; llama.cpp's Llama block attends "
                     "over the whole context, so outputs differ beyond that length")
    return notes


def check_gguf(model: nn.Module, outtype: str = "f16") -> None:
    """Refuse, before any long work, what :func:`export_gguf` cannot write for ``model``: other families
    and tasks, other tensor types, rope and activation variants llama.cpp computes differently, and (when
    the model's source folder is known) a tokenizer that is not byte-level BPE. The head layout is checked
    again on the slimmed model when writing."""
    if importlib.util.find_spec("gguf") is None:
        raise HeadcutError("--format gguf needs the gguf extra (gguf missing): pip install 'headcut[gguf]'")
    if outtype not in GGUF_TYPES:
        raise HeadcutError(f"unknown --gguf-type {outtype!r}; choose one of {', '.join(GGUF_TYPES)}")
    _check_family(model)
    _layers(model)
    _rope_factors(model, _head_dim(model))
    source = getattr(model.config, "_name_or_path", "") or ""
    folder = Path(source).expanduser() if source else None
    if folder is not None and folder.is_dir() and (folder / "config.json").is_file():
        _read_tokenizer_json(folder)


def _head_dim(model: nn.Module) -> int:
    return int(_blocks(model)[0].head_dim)


# ---- the tokenizer ----------------------------------------------------------------------------------

def _read_tokenizer_json(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise HeadcutError(f"--format gguf needs the model's tokenizer.json (byte-level BPE); {folder} has none")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeadcutError(f"--format gguf: cannot read {path}: {exc}") from None
    model = data.get("model") or {}
    kind = model.get("type")
    byte_level = "ByteLevel" in json.dumps(data.get("pre_tokenizer")) or "ByteLevel" in json.dumps(data.get("decoder"))
    if kind != "BPE" or model.get("byte_fallback") or not byte_level:
        what = "SentencePiece-style BPE" if kind == "BPE" else f"{kind}"
        raise HeadcutError(f"--format gguf writes byte-level BPE tokenizers (Llama 3, Qwen2, SmolLM); "
                           f"this model's tokenizer is {what}")
    return data


_LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def _pre_tokenizer(data: dict[str, Any]) -> str | None:
    """llama.cpp's pre-tokenizer name for a byte-level BPE ``tokenizer.json`` (None: not recognised)."""
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True) and not steps[0].get("add_prefix_space"):
        return "gpt-2"
    if (kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits")
            and steps[1].get("use_regex", True) and not steps[1].get("add_prefix_space")):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        if regex == _LLAMA3_REGEX:
            return "llama-bpe"
        if regex == _QWEN2_REGEX:
            return "qwen2"
    return None


def _added_special(tok: Any, text: str) -> tuple[bool, bool]:
    """Does the transformers tokenizer add its bos / eos token around ``text``?"""
    with_special = list(tok(text)["input_ids"])
    plain = list(tok(text, add_special_tokens=False)["input_ids"])
    n = len(plain)
    start = next((i for i in range(len(with_special) - n + 1) if with_special[i:i + n] == plain), 0)
    bos = start > 0 and tok.bos_token_id is not None and with_special[0] == tok.bos_token_id
    eos = (len(with_special) > start + n and tok.eos_token_id is not None and with_special[-1] == tok.eos_token_id)
    return bos, eos


def _merges(data: dict[str, Any], folder: Path) -> list[str]:
    """The BPE merges as llama.cpp reads them ("left right")."""
    out = []
    for merge in data["model"].get("merges") or []:
        pair = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(pair) != 2 or any(" " in part or not part for part in pair):
            raise HeadcutError(f"--format gguf: {folder / 'tokenizer.json'} has a merge llama.cpp cannot read: {merge!r}")
        out.append(f"{pair[0]} {pair[1]}")
    if not out:
        raise HeadcutError(f"--format gguf: {folder / 'tokenizer.json'} has no BPE merges")
    return out


def _write_vocab(writer: Any, folder: Path, n_vocab: int, config: Any) -> tuple[str, list[str]]:
    """Write the tokenizer keys; returns the pre-tokenizer name and notes."""
    import gguf
    import transformers

    from ...model.loading import quiet_transformers

    data = _read_tokenizer_json(folder)
    vocab: dict[str, int] = dict(data["model"].get("vocab") or {})
    added = {int(t["id"]): t for t in data.get("added_tokens") or []}
    ids = list(vocab.values()) + list(added)
    if ids and max(ids) >= n_vocab:
        raise HeadcutError(f"--format gguf: the tokenizer has token id {max(ids)} but the model embeds only {n_vocab} "
                           "tokens")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [int(gguf.TokenType.UNUSED)] * n_vocab
    for text, i in vocab.items():
        tokens[i], types[i] = text, int(gguf.TokenType.NORMAL)
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = int(gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED)
    notes = []
    pre = _pre_tokenizer(data)
    if pre is None:
        notes.append("pre-tokenizer not recognised; written as llama.cpp's 'default' (its own tokenisation of text "
                     "may differ from transformers')")
        pre = "default"
    if data.get("normalizer") and pre != "qwen2":
        notes.append(f"tokenizer normalizer {data['normalizer'].get('type')} is not applied by llama.cpp")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(_merges(data, folder))
    with quiet_transformers():
        tok = transformers.AutoTokenizer.from_pretrained(folder)
    for kind in ("bos", "eos", "unk", "pad"):
        tid = getattr(tok, f"{kind}_token_id", None)
        if tid is None:
            tid = getattr(config, f"{kind}_token_id", None)
        if isinstance(tid, int) and 0 <= tid < n_vocab:
            getattr(writer, f"add_{kind}_token_id")(tid)
    add_bos, add_eos = _added_special(tok, "Hello world")
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):
        template = [{"name": k, "template": v} for k, v in template.items()]
    if template:
        writer.add_chat_template(template)
    return pre, notes


# ---- tensors ----------------------------------------------------------------------------------------

def _rope_rows(heads: int, head_dim: int) -> np.ndarray:
    """Row order taking transformers' rotary layout (per head: first halves, then second halves of the
    pairs) to llama.cpp's (per head: the two values of each pair side by side)."""
    half = head_dim // 2
    per_head = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    return (np.arange(heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]  # torch layout (out, in) or (n,)
    get: Callable[[], np.ndarray]  # float32 values in that shape


def _values(t: torch.Tensor, rows: np.ndarray | None = None) -> Callable[[], np.ndarray]:
    def get() -> np.ndarray:
        arr = t.detach().to("cpu", torch.float32).numpy()
        return np.ascontiguousarray(arr[rows] if rows is not None else arr)
    return get


def _zeros(*shape: int) -> Callable[[], np.ndarray]:
    return lambda: np.zeros(shape, dtype=np.float32)


def _tied(model: nn.Module) -> bool:
    emb, head = model.get_input_embeddings().weight, model.lm_head.weight
    return emb is head or (emb.data_ptr() == head.data_ptr() and emb.shape == head.shape)


def _plan(model: nn.Module, layers: list[_Layer], factors: np.ndarray | None) -> list[_Tensor]:
    import gguf

    def name(kind: Any, bid: int | None = None, suffix: str = "weight") -> str:
        base = gguf.TENSOR_NAMES[kind]
        return (base.format(bid=bid) if bid is not None else base) + "." + suffix

    T = gguf.MODEL_TENSOR
    base = model.base_model
    d = _head_dim(model)
    emb = model.get_input_embeddings().weight
    plan = [_Tensor(name(T.TOKEN_EMBD), tuple(emb.shape), _values(emb))]
    if factors is not None:
        plan.append(_Tensor(name(T.ROPE_FREQS), tuple(factors.shape), lambda: factors))
    for i, (layer, spec, block) in enumerate(zip(base.layers, layers, _blocks(model))):
        mlp = layer.mlp
        q_proj, k_proj, v_proj, o_proj = (_part(model, path) for path in (block.q, block.k, block.v, block.o))
        hidden = layer.input_layernorm.weight.shape[0]
        if spec.heads:
            plan.append(_Tensor(name(T.ATTN_NORM, i), (hidden,), _values(layer.input_layernorm.weight)))
        if spec.placeholder:
            plan += [_Tensor(name(kind, i), (d, hidden), _zeros(d, hidden)) for kind in (T.ATTN_Q, T.ATTN_K, T.ATTN_V)]
            plan.append(_Tensor(name(T.ATTN_OUT, i), (hidden, d), _zeros(hidden, d)))
        elif spec.heads:
            q_rows, k_rows = _rope_rows(spec.heads, d), _rope_rows(spec.kv_heads, d)
            for kind, proj, rows in ((T.ATTN_Q, q_proj, q_rows), (T.ATTN_K, k_proj, k_rows), (T.ATTN_V, v_proj, None)):
                plan.append(_Tensor(name(kind, i), tuple(proj.weight.shape), _values(proj.weight, rows)))
                if proj.bias is not None:
                    plan.append(_Tensor(name(kind, i, "bias"), tuple(proj.bias.shape), _values(proj.bias, rows)))
            plan.append(_Tensor(name(T.ATTN_OUT, i), tuple(o_proj.weight.shape), _values(o_proj.weight)))
        if spec.heads and o_proj.bias is not None:
            plan.append(_Tensor(name(T.ATTN_OUT, i, "bias"), tuple(o_proj.bias.shape), _values(o_proj.bias)))
        plan.append(_Tensor(name(T.FFN_NORM, i), (hidden,), _values(layer.post_attention_layernorm.weight)))
        for kind, proj in ((T.FFN_GATE, mlp.gate_proj), (T.FFN_UP, mlp.up_proj), (T.FFN_DOWN, mlp.down_proj)):
            plan.append(_Tensor(name(kind, i), tuple(proj.weight.shape), _values(proj.weight)))
            if proj.bias is not None:
                plan.append(_Tensor(name(kind, i, "bias"), tuple(proj.bias.shape), _values(proj.bias)))
    plan.append(_Tensor(name(T.OUTPUT_NORM), tuple(base.norm.weight.shape), _values(base.norm.weight)))
    if not _tied(model):
        plan.append(_Tensor(name(T.OUTPUT), tuple(model.lm_head.weight.shape), _values(model.lm_head.weight)))
    return plan


def _storage(shape: tuple[int, ...], outtype: str) -> Any:
    """The GGML type a tensor of ``shape`` is stored as."""
    import gguf

    Q = gguf.GGMLQuantizationType
    if outtype == "f32" or len(shape) < 2:
        return Q.F32
    if outtype == "q8_0" and shape[-1] % _Q8_BLOCK == 0:
        return Q.Q8_0
    return Q.F16


def _encode(arr: np.ndarray, qtype: Any, name: str) -> np.ndarray:
    import gguf

    out = gguf.quants.quantize(arr, qtype)
    if qtype == gguf.GGMLQuantizationType.F16 and not np.isfinite(out).all():
        raise HeadcutError(f"--format gguf: tensor {name} overflows float16; use --gguf-type f32")
    return out


def _info(shape: tuple[int, ...], qtype: Any) -> tuple[tuple[int, ...], Any, int]:
    """The shape, numpy dtype and byte count ``GGUFWriter.add_tensor_info`` expects."""
    import gguf

    Q = gguf.GGMLQuantizationType
    n = math.prod(shape)
    if qtype == Q.F32:
        return shape, np.dtype(np.float32), 4 * n
    if qtype == Q.F16:
        return shape, np.dtype(np.float16), 2 * n
    byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
    return byte_shape, np.dtype(np.uint8), math.prod(byte_shape)


# ---- writing ----------------------------------------------------------------------------------------

_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}


def export_gguf(model: nn.Module, folder: Path, *, outtype: str = "f16") -> GgufExport:
    """Write ``model`` (a loaded, possibly slimmed Llama/Qwen2/Mistral causal LM) as a GGUF file for
    llama.cpp into ``folder``, which holds the model's ``config.json`` and tokenizer files. See the
    module docstring for the form written; refusals are one-line :class:`HeadcutError`."""
    start = time.perf_counter()
    folder = Path(folder)
    check_gguf(model, outtype)
    import gguf

    from ..files import OutputFile

    layers = _layers(model)
    d = _head_dim(model)
    factors = _rope_factors(model, d)
    _read_tokenizer_json(folder)  # refuse before writing anything
    config = model.config
    pairs = {(x.heads, x.kv_heads) for x in layers}
    arch = "llama" if len(pairs) == 1 and next(iter(pairs))[0] > 0 else "deci"
    n_vocab, hidden = model.get_input_embeddings().weight.shape
    plan = _plan(model, layers, factors)
    ffn = {int(layer.mlp.gate_proj.weight.shape[0]) for layer in model.base_model.layers}

    target = OutputFile(folder / gguf_file_name(outtype), "--format gguf")
    tmp = target.temp()
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        name = Path(str(getattr(config, "_name_or_path", "") or "")).name or _class_name(model)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_block_count(len(layers))
        writer.add_context_length(int(getattr(config, "max_position_embeddings", 2048)))
        writer.add_embedding_length(int(hidden))
        writer.add_feed_forward_length(ffn.pop() if len(ffn) == 1 else [
            int(layer.mlp.gate_proj.weight.shape[0]) for layer in model.base_model.layers])
        if arch == "llama":
            writer.add_head_count(layers[0].heads)
            writer.add_head_count_kv(layers[0].kv_heads)
        else:
            writer.add_head_count([x.heads for x in layers])
            writer.add_head_count_kv([x.kv_heads for x in layers])
        writer.add_key_length(d)
        writer.add_value_length(d)
        writer.add_rope_dimension_count(d)
        writer.add_rope_freq_base(_rope_theta(config))
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        writer.add_vocab_size(int(n_vocab))
        writer.add_file_type(int(getattr(gguf.LlamaFileType, _FILE_TYPES[outtype])))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        pre, vocab_notes = _write_vocab(writer, folder, int(n_vocab), config)
        types = []
        for t in plan:
            qtype = _storage(t.shape, outtype)
            shape, dtype, nbytes = _info(t.shape, qtype)
            writer.add_tensor_info(t.name, shape, dtype, nbytes, raw_dtype=None if qtype in (
                gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else qtype)
            types.append(qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, qtype in zip(plan, types):
            writer.write_tensor_data(_encode(t.get(), qtype, t.name))
        writer.close()
        target.commit(tmp)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    size = os.path.getsize(folder / target.path.name)
    return GgufExport(
        file=target.path.name, outtype=outtype, arch=arch, head_count=[x.heads for x in layers],
        head_count_kv=[x.kv_heads for x in layers], bytes=size, seconds=time.perf_counter() - start,
        tokenizer=f"gpt2/{pre}", notes=_notes(model, layers) + vocab_notes,
    )
