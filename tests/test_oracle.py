"""An independent oracle for head removal, checked against headcut's gating, slimming and reloading.

The oracle: the input of an attention block's output projection is the concatenation of the
per-head outputs, shape (B, T, H*d), head ``h`` in features ``h*d:(h+1)*d``. Removing head ``h`` is
therefore exactly the same as zeroing those input features of the output projection's weight:
``weight[:, h*d:(h+1)*d] = 0`` for an ``nn.Linear`` (weight is out x in), rows ``h*d:(h+1)*d`` for
GPT-2's ``Conv1D`` (weight is in x out). The bias stays, so a block with zero heads outputs its bias.
For grouped-query attention (Llama, Qwen2, Mistral) this is exact for any subset of query heads.

Why it is independent: the oracle is a plain weight edit on a deep copy of the model, with this
file's OWN table of where each family's output projections are and what the head size is (read off
``shared/notes/transformers-v5.md`` and ``model.config``). It imports nothing from
``headcut.adapters``, ``headcut.model.gating`` or ``headcut.adapters.runtime``, installs no hooks, and never runs
headcut's code on the oracle model. So a bug shared by headcut's gating and its slimming (a wrong
module, a wrong head size, a wrong head order, a missed block) cannot make them agree with it.
headcut is only the system under test: ``headcut.gated``, ``headcut.slim``, ``headcut.save`` and
``headcut.load`` must all reproduce the oracle's outputs. (The table's block names are checked
against ``headcut.model_blocks`` only to make sure both sides talk about the same blocks.)

ALBERT shares one attention module across layers, so zeroing weights can only express masks that
drop the same heads in every layer; per-layer masks are checked on a copy whose layers this file
unshares itself (one deep copy of the layer group per layer, ``num_hidden_groups = layers``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import pytest
import torch
from helpers import CLASSES, FAMILIES, GQA_DECODERS, make_inputs, make_model, output_tensor
from torch import nn
from transformers.pytorch_utils import Conv1D

import headcut

ATOL = 1e-5  # oracle vs headcut, float32
GQA_FAMILIES = tuple(GQA_DECODERS)
VISIBLE = 1e-3  # a masked oracle must move the output by more than this

# ---------------------------------------------------------------------------------------------
# The oracle's own table: family -> [(block-name prefix, regex on the module path (any task-head
# prefix), which config fields give the head count)]. Group 1 of the regex is the layer index.
# ---------------------------------------------------------------------------------------------

_BERT_LIKE = [("self", r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.output\.dense$", "enc")]
_BART_LIKE = [
    ("encoder", r"(?:^|\.)encoder\.layers\.(\d+)\.self_attn\.out_proj$", "enc"),
    ("decoder", r"(?:^|\.)decoder\.layers\.(\d+)\.self_attn\.out_proj$", "dec"),
    ("cross", r"(?:^|\.)decoder\.layers\.(\d+)\.encoder_attn\.out_proj$", "dec"),
]
_LLAMA_LIKE = [("self", r"(?:^|\.)layers\.(\d+)\.self_attn\.o_proj$", "enc")]

TABLE: dict[str, list[tuple[str, str, str]]] = {
    "bert": _BERT_LIKE,
    "roberta": _BERT_LIKE,
    "xlm-roberta": _BERT_LIKE,
    "electra": _BERT_LIKE,
    "deberta-v2": _BERT_LIKE,
    "distilbert": [("self", r"(?:^|\.)transformer\.layer\.(\d+)\.attention\.out_lin$", "enc")],
    # one module per (group, inner layer); layer -> group mapping is done in oracle_blocks
    "albert": [("self", r"(?:^|\.)encoder\.albert_layer_groups\.(\d+)\.albert_layers\.0\.attention\.dense$", "enc")],
    "gpt2": [("self", r"(?:^|\.)h\.(\d+)\.attn\.c_proj$", "enc")],
    "llama": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "smollm3": _LLAMA_LIKE,
    "gemma2": _LLAMA_LIKE,
    "gemma3": _LLAMA_LIKE,
    "phi3": _LLAMA_LIKE,
    "olmo2": _LLAMA_LIKE,
    "gpt-neox": [("self", r"(?:^|\.)layers\.(\d+)\.attention\.dense$", "enc")],
    "modernbert": [("self", r"(?:^|\.)layers\.(\d+)\.attn\.Wo$", "enc")],
    # hybrid: gated attention layers (o_proj) and Gated DeltaNet layers (out_proj, per value head)
    "qwen3_5": [*_LLAMA_LIKE, ("self", r"(?:^|\.)layers\.(\d+)\.linear_attn\.out_proj$", "lin")],
    "gemma4": _LLAMA_LIKE,
    "bart": _BART_LIKE,
    "marian": _BART_LIKE,
    "t5": [
        ("encoder", r"(?:^|\.)encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.o$", "enc"),
        ("decoder", r"(?:^|\.)decoder\.block\.(\d+)\.layer\.0\.SelfAttention\.o$", "dec"),
        ("cross", r"(?:^|\.)decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.o$", "dec"),
    ],
    "vit": [("self", r"(?:^|\.)layers\.(\d+)\.attention\.o_proj$", "enc")],
}


def heads_and_dim(family: str, cfg, side: str) -> tuple[int, int]:
    """(heads, head size) of one attention block, from the model config alone."""
    if family == "distilbert":
        return cfg.n_heads, cfg.dim // cfg.n_heads
    if family == "gpt2":
        return cfg.n_head, cfg.n_embd // cfg.n_head
    if family in ("bart", "marian"):
        h = cfg.encoder_attention_heads if side == "enc" else cfg.decoder_attention_heads
        return h, cfg.d_model // h
    if family == "t5":
        h = cfg.num_heads if side == "enc" else (getattr(cfg, "num_decoder_heads", None) or cfg.num_heads)
        return h, cfg.d_kv
    if family == "qwen3_5" and side == "lin":  # DeltaNet: value heads of linear_value_head_dim
        return cfg.linear_num_value_heads, cfg.linear_value_head_dim
    if family == "gemma4":  # layer 0's head size; it differs per layer (see oracle_blocks)
        return cfg.num_attention_heads, cfg.per_layer_config[0].head_dim
    if family in GQA_FAMILIES:
        h = cfg.num_attention_heads
        return h, getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    if family == "deberta-v2":
        h = cfg.num_attention_heads
        return h, getattr(cfg, "attention_head_size", cfg.hidden_size // h)
    h = cfg.num_attention_heads  # bert, roberta, xlm-roberta, electra, albert, vit
    return h, cfg.hidden_size // h


def num_layers(family: str, cfg, prefix: str) -> int:
    if family == "distilbert":
        return cfg.n_layers
    if family == "gpt2":
        return cfg.n_layer
    if family in ("bart", "marian"):
        return cfg.encoder_layers if prefix == "encoder" else cfg.decoder_layers
    if family == "t5":
        return cfg.num_layers if prefix == "encoder" else cfg.num_decoder_layers
    return cfg.num_hidden_layers


@dataclass
class OBlock:
    name: str  # headcut's block name: self.N / encoder.N / decoder.N / cross.N
    module: nn.Module  # the output projection
    heads: int
    head_dim: int


def oracle_blocks(family: str, model: nn.Module) -> list[OBlock]:
    """Every attention block of ``model`` per this file's table, in table order then layer order."""
    cfg = model.config
    named = dict(model.named_modules())
    blocks: list[OBlock] = []
    for prefix, pattern, side in TABLE[family]:
        found = {int(m.group(1)): mod for path, mod in named.items() if (m := re.search(pattern, path))}
        if not found:
            continue  # e.g. T5EncoderModel has no decoder
        heads, d = heads_and_dim(family, cfg, side)
        n = num_layers(family, cfg, prefix)
        if family == "albert":
            assert cfg.inner_group_num == 1
            assert sorted(found) == list(range(cfg.num_hidden_groups))
            per_layer = [found[int(i / (n / cfg.num_hidden_groups))] for i in range(n)]
        elif family == "qwen3_5":  # hybrid: each pattern matches the layers of its type only
            kind = "linear_attention" if side == "lin" else "full_attention"
            assert sorted(found) == [i for i, t in enumerate(cfg.layer_types) if t == kind], (prefix, sorted(found))
            per_layer = [found.get(i) for i in range(n)]
        else:
            assert sorted(found) == list(range(n)), (prefix, sorted(found), n)
            per_layer = [found[i] for i in range(n)]
        for i, mod in enumerate(per_layer):
            if mod is None:
                continue  # a layer of the other type
            in_features = mod.weight.shape[0] if isinstance(mod, Conv1D) else mod.weight.shape[1]
            if family == "gemma4":  # head_dim per layer (config.per_layer_config: global layers are wider)
                d = cfg.per_layer_config[i].head_dim
            assert in_features == heads * d, (prefix, i, in_features, heads, d)
            blocks.append(OBlock(f"{prefix}.{i}", mod, heads, d))
    assert blocks, family
    return blocks


def oracle_model(family: str, model: nn.Module, keep: dict[str, list[int]]) -> nn.Module:
    """A deep copy of ``model`` whose output projections have the dropped heads' inputs zeroed.

    ``keep`` maps block names to kept heads; unnamed blocks keep all heads.
    """
    oracle = copy.deepcopy(model).eval()
    blocks = oracle_blocks(family, oracle)
    assert set(keep) <= {b.name for b in blocks}, sorted(set(keep) - {b.name for b in blocks})
    dropped_by_module: dict[int, set[int]] = {}
    with torch.no_grad():
        for b in blocks:
            kept = set(keep.get(b.name, range(b.heads)))
            dropped = set(range(b.heads)) - kept
            # a shared module (ALBERT) can only drop the same heads for every block that uses it
            assert dropped_by_module.setdefault(id(b.module), dropped) == dropped, f"{b.name}: shared weights"
            w = b.module.weight
            for h in dropped:
                cols = slice(h * b.head_dim, (h + 1) * b.head_dim)
                if isinstance(b.module, Conv1D):
                    w[cols, :] = 0  # (in, out): a head is a block of rows
                else:
                    w[:, cols] = 0  # nn.Linear (out, in): a head is a block of columns
    return oracle


def unshare_albert(model: nn.Module) -> nn.Module:
    """A copy of an ALBERT model with one layer group per layer (same function, unshared weights)."""
    out = copy.deepcopy(model).eval()
    enc = out.base_model.encoder
    cfg = out.config
    assert cfg.num_hidden_groups == 1 and cfg.inner_group_num == 1
    enc.albert_layer_groups = nn.ModuleList(
        [copy.deepcopy(enc.albert_layer_groups[0]) for _ in range(cfg.num_hidden_layers)]
    )
    cfg.num_hidden_groups = cfg.num_hidden_layers
    enc.config.num_hidden_groups = cfg.num_hidden_layers
    return out


def forward(model: nn.Module, inputs) -> torch.Tensor:
    with torch.no_grad():
        return output_tensor(model(**inputs))


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------------------------------
# Fixed masks
# ---------------------------------------------------------------------------------------------


def fixed_masks(family: str, blocks: list[OBlock]) -> list[tuple[str, dict[str, list[int]], str]]:
    """(label, keep-mask, gqa policy) cases; each non-ALBERT mask empties one block and keeps one whole."""
    n = len(blocks)
    if family == "albert":  # the same heads in every layer keeps the shared weights shared
        h = blocks[0].heads
        return [
            ("uniform-some", {b.name: [x for x in range(h) if x not in (0, 2)] for b in blocks}, "auto"),
            ("uniform-one", {b.name: [h - 1] for b in blocks}, "auto"),
            ("uniform-none", {b.name: [] for b in blocks}, "auto"),
        ]
    g = torch.Generator().manual_seed(11)
    # A: first block empty, second untouched, the others lose every other head
    a = {b.name: [x for x in range(b.heads) if (x + i) % 2 == 0] for i, b in enumerate(blocks)}
    a[blocks[0].name] = []
    a[blocks[1].name] = list(range(blocks[1].heads))
    # B: last block empty, first untouched, the others keep a seeded random non-empty subset
    b_ = {}
    for i, b in enumerate(blocks):
        k = 1 + i % (b.heads - 1)
        b_[b.name] = sorted(torch.randperm(b.heads, generator=g)[:k].tolist())
    b_[blocks[-1].name] = []
    b_[blocks[0].name] = list(range(blocks[0].heads))
    gqa = "duplicate" if family in GQA_FAMILIES else "auto"
    cases = [("first-empty", a, gqa), ("last-empty", b_, gqa)]
    if family in GQA_FAMILIES:
        # whole KV groups (query heads h with h // group == kv head): the default policy does it
        group = blocks[0].heads // 2
        assert group * 2 == blocks[0].heads
        c = {blocks[0].name: list(range(group, 2 * group)), blocks[1].name: []}
        if n > 2:
            c[blocks[2].name] = list(range(group))
        cases.append(("kv-groups", c, "auto"))
    else:
        # C: one head kept in every block except an empty middle one
        c = {b.name: [(i * 3) % b.heads] for i, b in enumerate(blocks)}
        c[blocks[n // 2].name] = []
        cases.append(("one-head", c, gqa))
    return cases


CASES = [(f, c) for f in FAMILIES for c in CLASSES[f]]


def test_table_covers_every_family_and_agrees_with_headcut_names():
    assert set(TABLE) == set(FAMILIES)
    for family, cls_name in CASES:
        model = make_model(family, cls_name)
        mine = [(b.name, b.heads) for b in oracle_blocks(family, model)]
        theirs = [(b.name, b.heads) for b in headcut.model_blocks(model)]
        assert sorted(mine) == sorted(theirs), (family, cls_name)


# ---------------------------------------------------------------------------------------------
# 1. oracle == slimmed == gated, every family and class, a few masks each
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,cls_name", CASES)
def test_slim_and_gated_equal_oracle(family, cls_name):
    model = make_model(family, cls_name)
    inputs = make_inputs(family, model)
    blocks = oracle_blocks(family, model)
    for label, keep, gqa in fixed_masks(family, blocks):
        mask = {"keep": keep}
        expected = forward(oracle_model(family, model, keep), inputs)

        with headcut.gated(model, mask):
            gated = forward(model, inputs)
        assert maxdiff(gated, expected) <= ATOL, (label, "gated", maxdiff(gated, expected))

        slim = copy.deepcopy(model)
        headcut.slim(slim, mask, gqa=gqa)
        assert {b.name: b.heads for b in headcut.model_blocks(slim)} == {
            b.name: len(keep.get(b.name, range(b.heads))) for b in blocks
        }
        slimmed = forward(slim, inputs)
        assert maxdiff(slimmed, expected) <= ATOL, (label, "slim", maxdiff(slimmed, expected))


@pytest.mark.parametrize("cls_name", CLASSES["albert"])
def test_albert_per_layer_masks_equal_unshared_oracle(cls_name):
    """Different heads per ALBERT layer: the oracle unshares the layers itself, then zeroes columns."""
    model = make_model("albert", cls_name)
    inputs = make_inputs("albert", model)
    unshared = unshare_albert(model)
    assert maxdiff(forward(unshared, inputs), forward(model, inputs)) == 0.0  # unsharing changes nothing
    blocks = oracle_blocks("albert", unshared)
    assert len({id(b.module) for b in blocks}) == len(blocks)
    keep = {"self.0": [], "self.1": [0, 1, 2, 3], "self.2": [1, 3]}
    expected = forward(oracle_model("albert", unshared, keep), inputs)
    with headcut.gated(model, {"keep": keep}):
        gated = forward(model, inputs)
    assert maxdiff(gated, expected) <= ATOL
    slim = copy.deepcopy(model)
    headcut.slim(slim, {"keep": keep})
    assert maxdiff(forward(slim, inputs), expected) <= ATOL


# ---------------------------------------------------------------------------------------------
# 2. the oracle is not vacuous
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_is_not_vacuous(family):
    """Every mask, and emptying any single block, visibly moves the oracle's output."""
    model = make_model(family)
    inputs = make_inputs(family, model)
    full = forward(model, inputs)
    blocks = oracle_blocks(family, model)
    assert maxdiff(forward(oracle_model(family, model, {}), inputs), full) == 0.0  # keep-all is the identity
    for label, keep, _ in fixed_masks(family, blocks):
        assert maxdiff(forward(oracle_model(family, model, keep), inputs), full) > VISIBLE, label
    if family == "albert":
        model = unshare_albert(model)
        blocks = oracle_blocks(family, model)
    for b in blocks:
        assert maxdiff(forward(oracle_model(family, model, {b.name: []}), inputs), full) > VISIBLE, b.name


# ---------------------------------------------------------------------------------------------
# 3. saved and reloaded slimmed models equal the oracle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "t5"])
def test_reloaded_slim_equals_oracle(family, tmp_path):
    model = make_model(family)
    inputs = make_inputs(family, model)
    label, keep, gqa = fixed_masks(family, oracle_blocks(family, model))[0]
    expected = forward(oracle_model(family, model, keep), inputs)
    slim = copy.deepcopy(model)
    headcut.slim(slim, {"keep": keep}, gqa=gqa)
    out = tmp_path / "slim"
    headcut.save(slim, out)
    again = headcut.load(out)
    assert maxdiff(forward(again, inputs), expected) <= ATOL, label
