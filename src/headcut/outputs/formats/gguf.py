"""GGUF export for llama.cpp: decoder causal LMs, each family in llama.cpp's own architecture for it.

What is written (``model-<type>.gguf`` inside the output folder, through a temporary file and a rename):

* **Families and architectures** (:mod:`.gguf_families` holds what is family-specific): Llama, Qwen2 and
  Mistral as ``llama``, or ``deci`` for cuts that differ between layers; Qwen3 as ``qwen3``, SmolLM3 as
  ``smollm3``, Gemma 2 as ``gemma2``, Gemma 3 text as ``gemma3``, Phi-3 as ``phi3``, GPT-NeoX as
  ``gptneox``, OLMo 2 as ``olmo2``.
* **Head counts.** llama.cpp's ``llama`` (and ``qwen3``, ``smollm3``, ``gemma2``, ``gemma3``) builds every
  layer with layer 0's head counts, so these are written only when every layer keeps the same numbers of
  query and KV heads. The Llama family writes any other cut as ``deci`` (DeciLM / Llama-3_1-Nemotron-51B in
  llama.cpp): the same Llama block, with ``attention.head_count`` and ``attention.head_count_kv`` as
  per-layer arrays; each layer's ratio of the two is its GQA group size (query head ``h`` reads KV head
  ``h // (heads / kv_heads)``, as in transformers). The other families have no such architecture in
  llama.cpp: a cut with per-layer counts is refused. ``phi3``, ``gptneox`` and ``olmo2`` size the query
  and output projections by the model width: they hold only the uncut model (cut OLMo 2 models keep
  every head's q and k rows for their all-head norms, which llama.cpp cannot express either).
* **Layers without heads** (``deci``). ``deci`` runs a layer with ``head_count`` 0 attention-free (the
  residual passes unchanged, no KV cache rows), which is exactly headcut's empty attention when the
  output projection has no bias; such a layer carries no attention tensors (not even its norm). Two
  cases cannot use it and get one *placeholder head* instead, whose q, k, v and output weights are zero
  (so the attention adds exactly zero, plus the output bias): layer 0, because llama.cpp derives the
  head size from layer 0's head count, and a layer whose output projection has a bias (``deci`` drops
  the bias of an attention-free layer). The export's ``head_count`` shows what the file holds, and a
  note names the placeholder layers.
* **Where the tensors come from.** The attention projections, head counts and head size come from
  headcut's adapter (its blocks' row layouts: fused q|k|v projections and GPT-NeoX's per-head
  interleaving are regrouped into llama.cpp's q | k | v); the rest of the block (norms, MLP, embeddings,
  output) is read by the family's transformers module names. A parameter the architecture has no tensor
  for (e.g. an output-projection bias in ``qwen3``) is refused, never dropped.
* **Weights.** For llama.cpp's ``norm`` rope (``llama``, ``deci``, ``smollm3``), query and key rows (and
  their biases) are reordered per head from transformers' half-split rotary layout to pairs side by
  side; the ``neox`` architectures take transformers' layout as it is. Llama-family rope scaling
  ``linear`` and ``llama3`` are written as a ``rope_freqs`` tensor read off the model's own inverse
  frequencies; the other architectures take ``linear`` scaling as ``rope.scaling.factor``; every rope is
  checked against the model's own frequencies and other rope types are refused. Gemma's norms are stored
  as ``1 + w`` (llama.cpp multiplies by the stored weight). Where llama.cpp's attention scale differs from
  the model's (Gemma's ``query_pre_attn_scalar``), the ratio is folded into the query weights (or the
  query norm). Tied embeddings write no ``output`` tensor unless the architecture requires one.
  ``f32`` keeps every tensor in float32; ``f16`` and ``q8_0`` store the matrices as float16 / Q8_0
  (gguf-py's quantiser; a matrix whose rows are not a multiple of 32 values falls back to float16) and
  the vectors (norms, biases) as float32.
* **Tokenizer.** Byte-level BPE tokenizers (``tokenizer.json``: Llama 3, Qwen2/3, SmolLM, GPT-2 style)
  are written as llama.cpp's ``gpt2`` model: tokens, token types (special added tokens are control
  tokens), merges, the pre-tokenizer recognised from ``tokenizer.json`` (``gpt-2``, ``smollm``,
  ``llama-bpe``, ``qwen2``; otherwise ``default`` with a note), bos/eos/unk/pad ids, whether bos/eos
  are added (as the transformers tokenizer does) and the chat template. SentencePiece tokenizers
  (Llama 2, Mistral v0.1, Gemma, Phi-3-mini) and folders without ``tokenizer.json`` are refused.

The writer streams one tensor at a time (memory: the model plus one converted tensor).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from ...adapters import Block, adapter_for
from ...catalog import GGUF_TYPES
from ...errors import HeadcutError
from ...extras import imported
from ...files.atomic import OutputFile
from ...model.loading import quiet_transformers
from .gguf_families import MODEL_TYPES, family_for
from .gguf_family import Family
from .gguf_plan import Layer

#: Q8_0 block size (values per row must be a multiple of it)
_Q8_BLOCK = 32

__all__ = ["GGUF_TYPES", "MODEL_TYPES", "GgufExport", "check_gguf", "export_gguf", "gguf_file_name"]


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
            "file": self.file,
            "outtype": self.outtype,
            "arch": self.arch,
            "head_count": list(self.head_count),
            "head_count_kv": list(self.head_count_kv),
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "tokenizer": self.tokenizer,
            "notes": list(self.notes),
        }


def gguf_file_name(outtype: str) -> str:
    return f"model-{outtype}.gguf"


# ---- what the model is ------------------------------------------------------------------------------


def _class_name(model: nn.Module) -> str:
    return type(model).__name__.removeprefix("Headcut")


def _check_family(model: nn.Module) -> Family:
    family = family_for(model)
    name = _class_name(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not name.endswith("ForCausalLM") or not isinstance(head, nn.Linear):
        raise HeadcutError(f"--format gguf writes causal language models (...ForCausalLM); this model is {name}")
    family.check(model)
    return family


def _blocks(model: nn.Module) -> list[Block]:
    """The attention blocks, one per layer in order (the adapter's view: projections, heads, head size)."""

    return sorted(adapter_for(model).blocks(model.base_model), key=lambda b: b.layer)


def _layers(model: nn.Module, family: Family) -> list[Layer]:
    """Per-layer head counts as they will be written (refusing cuts llama.cpp cannot run)."""
    blocks = _blocks(model)
    for b in blocks:
        if not b.heads:
            continue
        groups = getattr(model.base_model.get_submodule(b.attn), "num_key_value_groups", None)
        if b.kv_heads == 0 or b.heads % b.kv_heads or (groups is not None and groups * b.kv_heads != b.heads):
            raise HeadcutError(
                f"--format gguf: layer {b.layer} has {b.heads} query heads over {b.kv_heads} KV heads "
                f"(groups {groups}); llama.cpp needs every KV head to serve the same number of query heads"
            )
    dims = {b.head_dim for b in blocks}
    if len(dims) != 1 or next(iter(dims)) % 2:
        raise HeadcutError(
            f"--format gguf: llama.cpp needs one even head size in every layer; this model has {sorted(dims)}"
        )
    return family.layers(model, blocks)


def _q_scales(model: nn.Module, family: Family, layers: list[Layer], blocks: list[Block]) -> list[float]:
    """Per layer, the factor folded into the queries so that llama.cpp's attention scale gives the
    model's own (``scaling`` of the transformers attention module)."""
    d = blocks[0].head_dim
    ours = family.attention_scale(model, layers, d)
    out = []
    for b in blocks:
        theirs = getattr(model.base_model.get_submodule(b.attn), "scaling", None)
        ratio = float(theirs) / ours if isinstance(theirs, (int, float)) and theirs else 1.0
        out.append(1.0 if abs(ratio - 1.0) < 1e-7 else ratio)
    return out


def check_gguf(model: nn.Module, outtype: str = "f16", cut: str | None = None) -> None:
    """Refuse, before any long work, what :func:`export_gguf` cannot write for ``model``: other families
    and tasks, other tensor types, rope and activation variants llama.cpp computes differently, cuts the
    family's llama.cpp architecture cannot build, and (when the model's source folder is known) a
    tokenizer that is neither byte-level nor SentencePiece BPE, and (``cut``: ``uniform`` or ``any``, the
    cut a search will make) cuts the architecture cannot hold. Everything is checked again on the slimmed
    model when writing."""
    imported(
        "gguf",
        "--format gguf",
        "pip install 'headcut[gguf]'",
        missing="--format gguf needs the gguf extra (gguf missing): pip install 'headcut[gguf]'",
    )
    if outtype not in GGUF_TYPES:
        raise HeadcutError(f"unknown --gguf-type {outtype!r}; choose one of {', '.join(GGUF_TYPES)}")
    family = _check_family(model)
    _layers(model, family)
    if cut is not None:
        family.check_cut(cut)
    family.rope(model, _head_dim(model))
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
        raise HeadcutError(f"--format gguf needs the model's tokenizer.json (BPE); {folder} has none")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeadcutError(f"--format gguf: cannot read {path}: {exc}") from None
    if _tokenizer_model(data) is None:
        model = data.get("model") or {}
        kind = model.get("type")
        what = "BPE with byte fallback but without SentencePiece's spaces" if model.get("byte_fallback") else f"{kind}"
        raise HeadcutError(
            "--format gguf writes byte-level BPE tokenizers (Llama 3, Qwen2, SmolLM) and SentencePiece "
            f"BPE ones (Gemma, Llama 2); this model's tokenizer is {what}"
        )
    return data


def _steps(part: Any, key: str) -> list[dict[str, Any]]:
    """The steps of a tokenizer.json normalizer / pre-tokenizer / decoder (a Sequence or one step)."""
    if not isinstance(part, dict):
        return []
    return list(part.get(key) or []) if part.get("type") == "Sequence" else [part]


def _space_prefix(data: dict[str, Any]) -> bool | None:
    """For SentencePiece BPE (spaces written as "▁", byte fallback): does the tokenizer put a "▁" in front
    of the text (Llama 2: yes, Gemma: no)? None: not SentencePiece BPE."""
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        return None
    norms = _steps(data.get("normalizer"), "normalizers")
    pres = _steps(data.get("pre_tokenizer"), "pretokenizers")
    replace = any(
        n.get("type") == "Replace" and (n.get("pattern") or {}).get("String") == " " and n.get("content") == "\u2581"
        for n in norms
    )
    prepend = any(n.get("type") == "Prepend" and n.get("prepend") == "\u2581" for n in norms)
    meta = [p for p in pres if p.get("type") == "Metaspace"]
    if any(n.get("type") not in ("Replace", "Prepend") for n in norms):
        return None
    if meta:
        m = meta[0]
        if len(pres) != 1 or norms or m.get("replacement", "\u2581") != "\u2581":
            return None
        return m.get("prepend_scheme", "always" if m.get("add_prefix_space", True) else "never") in ("first", "always")
    # a split at spaces after they became "▁" (Gemma) changes nothing
    if not replace or any(p.get("type") != "Split" or (p.get("pattern") or {}).get("String") != " " for p in pres):
        return None
    return prepend


def _tokenizer_model(data: dict[str, Any]) -> str | None:
    """llama.cpp's tokenizer model for a tokenizer.json: ``gpt2`` (byte-level BPE), ``llama`` (SentencePiece
    BPE) or None (neither)."""
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        return None
    byte_level = "ByteLevel" in json.dumps(data.get("pre_tokenizer")) or "ByteLevel" in json.dumps(data.get("decoder"))
    if byte_level and not model.get("byte_fallback"):
        return "gpt2"
    return "llama" if _space_prefix(data) is not None else None


_LLAMA3_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)


def _pre_tokenizer(data: dict[str, Any]) -> str | None:
    """llama.cpp's pre-tokenizer name for a byte-level BPE ``tokenizer.json`` (None: not recognised)."""
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True) and not steps[0].get("add_prefix_space"):
        return "gpt-2"
    if (
        kinds == ["Digits", "ByteLevel"]
        and steps[0].get("individual_digits")
        and steps[1].get("use_regex", True)
        and not steps[1].get("add_prefix_space")
    ):
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
    start = next((i for i in range(len(with_special) - n + 1) if with_special[i : i + n] == plain), 0)
    bos = start > 0 and tok.bos_token_id is not None and with_special[0] == tok.bos_token_id
    eos = len(with_special) > start + n and tok.eos_token_id is not None and with_special[-1] == tok.eos_token_id
    return bos, eos


def _merges(data: dict[str, Any], folder: Path) -> list[str]:
    """The BPE merges as llama.cpp reads them ("left right")."""
    out = []
    for merge in data["model"].get("merges") or []:
        pair = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(pair) != 2 or any(" " in part or not part for part in pair):
            raise HeadcutError(
                f"--format gguf: {folder / 'tokenizer.json'} has a merge llama.cpp cannot read: {merge!r}"
            )
        out.append(f"{pair[0]} {pair[1]}")
    if not out:
        raise HeadcutError(f"--format gguf: {folder / 'tokenizer.json'} has no BPE merges")
    return out


def _spm_scores(data: dict[str, Any], tokens: list[str]) -> list[float]:
    """SentencePiece scores for llama.cpp's merge order: it merges the adjacent pair whose result scores
    highest; transformers merges the pair of lowest rank. A token made by merge ``r`` (its first) scores
    ``-r``; every other token scores below all of them."""
    first: dict[str, int] = {}
    for rank, merge in enumerate(data["model"].get("merges") or []):
        pair = merge.split(" ") if isinstance(merge, str) else list(merge)
        first.setdefault("".join(pair), rank)
    floor = -float(len(first) + 1)
    return [-float(first[t]) if t in first else floor for t in tokens]


def _write_vocab(writer: Any, folder: Path, n_vocab: int, config: Any) -> tuple[str, list[str], list[str]]:
    """Write the tokenizer keys; returns the tokenizer as llama.cpp reads it (``gpt2/<pre-tokenizer>`` or
    ``llama``, SentencePiece), notes and the tokens."""
    import gguf
    import transformers

    data = _read_tokenizer_json(folder)
    model = _tokenizer_model(data)
    vocab: dict[str, int] = dict(data["model"].get("vocab") or {})
    added = {int(t["id"]): t for t in data.get("added_tokens") or []}
    ids = list(vocab.values()) + list(added)
    if ids and max(ids) >= n_vocab:
        raise HeadcutError(
            f"--format gguf: the tokenizer has token id {max(ids)} but the model embeds only {n_vocab} tokens"
        )
    kinds = gguf.TokenType
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [int(kinds.UNUSED)] * n_vocab
    for text, i in vocab.items():
        byte = model == "llama" and len(text) == 6 and text.startswith("<0x") and text.endswith(">")
        tokens[i], types[i] = text, int(kinds.BYTE if byte else kinds.NORMAL)
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = int(kinds.CONTROL if t.get("special") else kinds.USER_DEFINED)
    notes = []
    if model == "llama":
        missing = [b for b in range(256) if f"<0x{b:02X}>" not in vocab]
        if missing:  # llama.cpp falls back to them for any character outside the vocabulary
            raise HeadcutError(
                f"--format gguf: llama.cpp's SentencePiece tokenizer needs the 256 byte tokens "
                f"<0x00>..<0xFF>; this tokenizer lacks {len(missing)} (e.g. <0x{missing[0]:02X}>)"
            )
        unk = vocab.get(data["model"].get("unk_token") or "")
        if unk is not None:
            types[unk] = int(kinds.UNKNOWN)
        label = "llama"
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(_spm_scores(data, tokens))
        writer.add_token_types(types)
        writer.add_add_space_prefix(bool(_space_prefix(data)))
        if any(step.get("type") == "Metaspace" for step in _steps(data.get("pre_tokenizer"), "pretokenizers")):
            notes.append(
                "the Metaspace pre-tokenizer of tokenizer.json puts '▁' in front of text differently from "
                "SentencePiece (text that starts with a space, text after a special token); llama.cpp "
                "tokenises such text as SentencePiece does"
            )
    else:
        pre = _pre_tokenizer(data)
        if pre is None:
            notes.append(
                "pre-tokenizer not recognised; written as llama.cpp's 'default' (its own tokenisation of text "
                "may differ from transformers')"
            )
            pre = "default"
        if data.get("normalizer") and pre != "qwen2":
            notes.append(f"tokenizer normalizer {data['normalizer'].get('type')} is not applied by llama.cpp")
        label = f"gpt2/{pre}"
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
    return label, notes, tokens


# ---- tensors ----------------------------------------------------------------------------------------


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
    """Write ``model`` (a loaded, possibly slimmed causal LM of a family in :data:`MODEL_TYPES`) as a GGUF
    file for llama.cpp into ``folder``, which holds the model's ``config.json`` and tokenizer files. See the
    module docstring for the form written; refusals are one-line :class:`HeadcutError`."""
    start = time.perf_counter()
    folder = Path(folder)
    check_gguf(model, outtype)
    import gguf

    family = family_for(model)
    blocks = _blocks(model)
    layers = _layers(model, family)
    d = int(blocks[0].head_dim)
    rope = family.rope(model, d)
    _read_tokenizer_json(folder)  # refuse before writing anything
    config = model.config
    arch = family.choose_arch(layers)
    n_vocab, hidden = model.get_input_embeddings().weight.shape
    plan = family.plan(model, layers, blocks, rope, _q_scales(model, family, layers, blocks))
    ffn = [int(t.shape[1]) for t in plan if t.name.endswith("ffn_down.weight")]  # (hidden, n_ff)

    target = OutputFile(folder / gguf_file_name(outtype), "--format gguf")
    tmp = target.temp()
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_block_count(len(layers))
        writer.add_context_length(int(getattr(config, "max_position_embeddings", 2048)))
        writer.add_embedding_length(int(hidden))
        writer.add_feed_forward_length(ffn[0] if len(set(ffn)) == 1 else ffn)
        if family.per_layer_counts(arch):
            writer.add_head_count([x.heads for x in layers])
            writer.add_head_count_kv([x.kv_heads for x in layers])
        else:
            writer.add_head_count(layers[0].heads)
            writer.add_head_count_kv(layers[0].kv_heads)
        writer.add_key_length(d)
        writer.add_value_length(d)
        writer.add_rope_dimension_count(rope.n_rot)
        writer.add_rope_freq_base(rope.base)
        if rope.factor != 1.0:
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope.factor)
        eps = getattr(config, "rms_norm_eps", None) if family.norm == "rms" else getattr(config, "layer_norm_eps", None)
        if family.norm == "rms":
            writer.add_layer_norm_rms_eps(float(eps if eps is not None else 1e-6))
        else:
            writer.add_layer_norm_eps(float(eps if eps is not None else 1e-5))
        family.metadata(writer, model, layers, rope)
        writer.add_vocab_size(int(n_vocab))
        writer.add_file_type(int(getattr(gguf.LlamaFileType, _FILE_TYPES[outtype])))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        tokenizer, vocab_notes, tokens = _write_vocab(writer, folder, int(n_vocab), config)
        name = Path(str(getattr(config, "_name_or_path", "") or "")).name or _class_name(model)
        writer.add_name(family.file_name(name, tokens))
        types = []
        for t in plan:
            qtype = _storage(t.shape, outtype)
            shape, dtype, nbytes = _info(t.shape, qtype)
            writer.add_tensor_info(
                t.name,
                shape,
                dtype,
                nbytes,
                raw_dtype=None if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else qtype,
            )
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
        file=target.path.name,
        outtype=outtype,
        arch=arch,
        head_count=[x.heads for x in layers],
        head_count_kv=[x.kv_heads for x in layers],
        bytes=size,
        seconds=time.perf_counter() - start,
        tokenizer=tokenizer,
        notes=family.notes(model, layers) + vocab_notes,
    )
