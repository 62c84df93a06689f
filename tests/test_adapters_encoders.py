"""Family-specific checks of the encoder adapters: ALBERT sharing/unsharing, DeBERTa-v2's relative
attention variants, ViT without q/k/v bias, attention maps after slimming."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch
import transformers as T
from helpers import ATOL, check_reload, forward, make_config, make_inputs

import headcut


def model_of(family: str, cls_name: str, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """Like helpers.make_model (config ``overrides`` applied), with larger random weights: every
    head then moves the output far more than the tolerance (the helpers' default init moves some
    outputs by only ~1e-5 per head), so a wrong cut cannot hide."""
    config = make_config(family)
    config.initializer_range = 0.2
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = getattr(T, cls_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(0, 0.1)
    return model


def slim_and_compare(model, inputs, mask) -> headcut.SlimResult:
    with headcut.gated(model, mask):
        gated = forward(model, inputs)
    result = headcut.slim(model, mask)
    assert (forward(model, inputs) - gated).abs().max().item() <= ATOL
    return result


def albert_groups(model) -> int:
    return len(model.base_model.encoder.albert_layer_groups)


# ---------------------------------------------------------------- ALBERT


def test_albert_same_heads_everywhere_keeps_sharing():
    model = model_of("albert", "AlbertForMaskedLM")
    inputs = make_inputs("albert", model)
    blocks = headcut.model_blocks(model)
    assert len(blocks) == 3 and len({b.attn for b in blocks}) == 1 and all(b.shared == "0" for b in blocks)
    before = headcut.count_params(model)
    result = slim_and_compare(model, inputs, {"keep": {b.name: [0, 2] for b in blocks}})
    assert result.unshared_params == 0 and result.notes == []
    assert model.config.num_hidden_groups == 1 and albert_groups(model) == 1
    assert result.params_after < before
    # one attention module (3 heads of 8 features x 3 projections + output columns) lost 2 heads once
    assert before - result.params_after == 2 * 8 * (3 * (32 + 1) + 32)
    assert [b.heads for b in headcut.model_blocks(model)] == [2, 2, 2]
    check_reload(model, inputs, forward(model, inputs))


@pytest.mark.parametrize(
    "keep,groups",
    [
        ([[0, 1], [0, 1], [3]], 2),  # layers 0 and 1 keep sharing (group formula: 0, 0, 1)
        ([[0], [0, 1], [0, 1]], 3),  # layer 0 differs from layer 1: every layer its own group
        ([[1, 2], [], [0, 1, 2, 3]], 3),
    ],
)
def test_albert_differing_mask_unshares(keep, groups):
    model = model_of("albert", "AlbertForSequenceClassification")
    inputs = make_inputs("albert", model)
    blocks = headcut.model_blocks(model)
    group_params = sum(p.numel() for p in model.base_model.encoder.albert_layer_groups[0].parameters())
    result = slim_and_compare(model, inputs, {"keep": {b.name: k for b, k in zip(blocks, keep)}})
    assert result.unshared_params == (groups - 1) * group_params
    assert result.notes and "unshared 1 -> " + str(groups) in result.notes[0]
    assert model.config.num_hidden_groups == groups and albert_groups(model) == groups
    after = headcut.model_blocks(model)
    assert [b.heads for b in after] == [len(k) for k in keep]
    assert len({b.attn for b in after}) == groups
    with tempfile.TemporaryDirectory() as tmp:
        headcut.save(model, f"{tmp}/m")
        saved = json.loads(open(f"{tmp}/m/config.json").read())
        assert saved["num_hidden_groups"] == groups
        # a model built from the saved config has the unshared structure natively
        native = T.AlbertForSequenceClassification(T.AlbertConfig.from_pretrained(f"{tmp}/m"))
        assert len(native.albert.encoder.albert_layer_groups) == groups
    check_reload(model, inputs, forward(model, inputs))


def test_albert_shared_cut_then_unshare():
    """Slimming a shared model (stays shared), then with differing masks (unshares the cut copy)."""
    model = model_of("albert", "AlbertForMaskedLM", seed=2)
    inputs = make_inputs("albert", model)
    blocks = headcut.model_blocks(model)
    slim_and_compare(model, inputs, {"drop": {b.name: [3] for b in blocks}})
    assert albert_groups(model) == 1
    result = slim_and_compare(model, inputs, {"keep": {"self.0": [2], "self.1": [0, 1, 2], "self.2": []}})
    assert albert_groups(model) == 3 and result.unshared_params > 0
    assert model.config.headcut["blocks"]["self.0"]["q"] == [2]
    assert model.config.headcut["blocks"]["self.2"]["q"] == []
    check_reload(model, inputs, forward(model, inputs))


def test_albert_inner_groups():
    """inner_group_num > 1: one block per attention call (layer * inner + j)."""
    model = model_of("albert", "AlbertForMaskedLM", num_hidden_layers=2, inner_group_num=2)
    inputs = make_inputs("albert", model)
    blocks = headcut.model_blocks(model)
    assert [b.name for b in blocks] == ["self.0", "self.1", "self.2", "self.3"]
    assert [b.shared for b in blocks] == ["0.0", "0.1", "0.0", "0.1"]
    assert blocks[0].attn == blocks[2].attn != blocks[1].attn
    same = slim_and_compare(model, inputs, {"keep": {"self.0": [1, 3], "self.2": [1, 3], "self.1": [], "self.3": []}})
    assert same.unshared_params == 0 and albert_groups(model) == 1
    differ = slim_and_compare(model, inputs, {"keep": {"self.0": [0], "self.2": [1]}})
    assert differ.unshared_params > 0 and albert_groups(model) == 2
    assert [b.heads for b in headcut.model_blocks(model)] == [1, 0, 1, 0]
    check_reload(model, inputs, forward(model, inputs))


def test_albert_several_groups_unshare_only_where_needed():
    """4 layers in 2 groups (0, 0, 1, 1); only layers 2 and 3 differ: 3 groups, layers 0 and 1 still share."""
    model = model_of("albert", "AlbertForSequenceClassification", seed=6, num_hidden_layers=4, num_hidden_groups=2)
    inputs = make_inputs("albert", model)
    assert [b.shared for b in headcut.model_blocks(model)] == ["0", "0", "1", "1"]
    result = slim_and_compare(model, inputs, {"keep": {"self.0": [1], "self.1": [1], "self.2": [0, 3], "self.3": []}})
    assert model.config.num_hidden_groups == 3 and result.unshared_params > 0
    after = headcut.model_blocks(model)
    assert [b.shared for b in after] == ["0", "0", None, None]
    assert [b.heads for b in after] == [1, 1, 2, 0]
    check_reload(model, inputs, forward(model, inputs))


def test_albert_empty_block_keeps_output_dropout():
    """In training mode the zero-head stub still applies the attention's output dropout."""
    model = model_of("albert", "AlbertForMaskedLM")
    inputs = make_inputs("albert", model)
    blocks = headcut.model_blocks(model)
    mask = {"keep": {b.name: [] for b in blocks}}

    def run() -> torch.Tensor:
        model.train()
        for layer in model.base_model.encoder.albert_layer_groups:
            layer.albert_layers[0].attention.output_dropout.p = 1.0  # deterministic: drops everything
        try:
            return forward(model, inputs)
        finally:
            model.eval()

    with headcut.gated(model, mask):
        gated = run()
    headcut.slim(model, mask)
    assert type(model.base_model.encoder.albert_layer_groups[0].albert_layers[0].attention).__name__.startswith(
        "HeadcutEmptyAttention"
    )
    assert (run() - gated).abs().max().item() <= ATOL


# ---------------------------------------------------------------- DeBERTa-v2


@pytest.mark.parametrize("share_att_key", [False, True])
@pytest.mark.parametrize("pos_att_type", [["p2c", "c2p"], ["c2p"], ["p2c"], None])
def test_deberta_relative_attention_variants(share_att_key, pos_att_type):
    model = model_of(
        "deberta-v2",
        "DebertaV2ForSequenceClassification",
        seed=4,
        share_att_key=share_att_key,
        pos_att_type=pos_att_type,
        relative_attention=pos_att_type is not None,
    )
    inputs = make_inputs("deberta-v2", model)
    mask = {"keep": {"self.0": [3, 1], "self.1": []}}
    slim_and_compare(model, inputs, mask)
    attn = model.base_model.encoder.layer[0].attention.self
    assert attn.num_attention_heads == 2 and attn.all_head_size == 16
    assert attn.query_proj.out_features == attn.key_proj.out_features == attn.value_proj.out_features == 16
    for name, kind in (("pos_key_proj", "c2p"), ("pos_query_proj", "p2c")):
        present = not share_att_key and pos_att_type is not None and kind in pos_att_type
        assert hasattr(attn, name) == present
        if present:
            assert getattr(attn, name).weight.shape == (16, 32)
    check_reload(model, inputs, forward(model, inputs))


def test_deberta_head_count_must_follow_cut():
    """The adapter sets num_attention_heads: the v2 forward reshapes with it, and a stale count is
    silently wrong (no error)."""
    model = model_of("deberta-v2", "DebertaV2ForMaskedLM")
    inputs = make_inputs("deberta-v2", model)
    headcut.slim(model, {"keep": {"self.0": [0, 1, 2], "self.1": [2]}})
    counts = [layer.attention.self.num_attention_heads for layer in model.base_model.encoder.layer]
    assert counts == [3, 1]
    attrs = {"num_attention_heads": 1, "all_head_size": 8}
    assert {"op": "set", "path": "encoder.layer.1.attention.self", "attrs": attrs} in model.config.headcut["ops"]
    good = forward(model, inputs)
    model.base_model.encoder.layer[0].attention.self.num_attention_heads = 4
    assert (forward(model, inputs) - good).abs().max().item() > 1e-3


# ---------------------------------------------------------------- ViT, DistilBERT


def test_vit_without_qkv_bias():
    model = model_of("vit", "ViTForImageClassification", qkv_bias=False)
    inputs = make_inputs("vit", model)
    slim_and_compare(model, inputs, {"keep": {"self.0": [1], "self.1": []}})
    attn = model.base_model.layers[0].attention
    assert attn.q_proj.bias is None and attn.q_proj.weight.shape == (8, 32) and attn.num_attention_heads == 1
    check_reload(model, inputs, forward(model, inputs))


def test_distilbert_head_count_attr():
    model = model_of("distilbert", "DistilBertForMaskedLM")
    headcut.slim(model, {"keep": {"self.0": [0, 3], "self.1": []}})
    assert [layer.attention.n_heads for layer in model.base_model.transformer.layer] == [2, 0]


# ---------------------------------------------------------------- attention maps


@pytest.mark.parametrize(
    "family,cls_name",
    [
        ("distilbert", "DistilBertModel"),
        ("albert", "AlbertForMaskedLM"),
        ("deberta-v2", "DebertaV2ForMaskedLM"),
        ("vit", "ViTForImageClassification"),
    ],
)
@pytest.mark.parametrize("hooked_before", [False, True])
def test_attention_maps_after_slimming(family, cls_name, hooked_before):
    """Eager attention maps have the kept head counts (ALBERT: unshared copies included), whether
    transformers installed its output-recording hooks before or after the cut."""
    model = model_of(family, cls_name)
    inputs = make_inputs(family, model)
    blocks = headcut.model_blocks(model)
    if hooked_before:
        model.set_attn_implementation("eager")
        with torch.no_grad():
            assert len(model(**inputs, output_attentions=True).attentions) == len(blocks)
        model.set_attn_implementation("sdpa")
    keep = {b.name: list(range(i % b.heads)) for i, b in enumerate(blocks)}  # 0, 1, 2, ... heads
    headcut.slim(model, {"keep": keep})
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    assert len(out.attentions) == len(blocks)
    for att, b in zip(out.attentions, blocks):
        assert att.shape[:2] == (2, len(keep[b.name]))
        assert att.shape[-1] == att.shape[-2]
