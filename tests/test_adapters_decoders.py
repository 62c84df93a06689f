"""Family-specific checks for the GPT-2, BART/Marian and T5 adapters (on top of test_surgery.py)."""

from __future__ import annotations

import tempfile

import pytest
import torch
import transformers as T
from helpers import make_config, make_inputs, make_model, output_tensor

import headcut

ATOL = 1e-5


def forward(model, inputs, **kwargs):
    with torch.no_grad():
        return output_tensor(model(**inputs, **kwargs))


def gated_then_slimmed(model, inputs, mask):
    with torch.no_grad(), headcut.gated(model, mask):
        expected = forward(model, inputs)
    headcut.slim(model, mask)
    return expected, forward(model, inputs)


# ---------------------------------------------------------------- block naming


@pytest.mark.parametrize(
    "family,cls_name",
    [("bart", "BartForConditionalGeneration"), ("marian", "MarianMTModel"), ("t5", "T5ForConditionalGeneration")],
)
def test_encoder_decoder_block_order(family, cls_name):
    model = make_model(family, cls_name)
    blocks = headcut.model_blocks(model)
    assert [b.name for b in blocks] == ["encoder.0", "encoder.1", "decoder.0", "decoder.1", "cross.0", "cross.1"]
    assert [b.kind for b in blocks] == ["encoder"] * 2 + ["decoder"] * 2 + ["cross"] * 2
    assert [b.layer for b in blocks] == [0, 1, 0, 1, 0, 1]
    assert all(b.heads == 4 and b.kv_heads == 4 and b.head_dim == 8 for b in blocks)
    base = model.base_model
    for b in blocks:  # every path resolves against the base model
        for path in (b.attn, b.q, b.k, b.v, b.o):
            base.get_submodule(path)


def test_t5_encoder_model_has_encoder_blocks_only():
    blocks = headcut.model_blocks(make_model("t5", "T5EncoderModel"))
    assert [b.name for b in blocks] == ["encoder.0", "encoder.1"]
    assert blocks[0].q == "encoder.block.0.layer.0.SelfAttention.q"


def test_gpt2_blocks_are_fused():
    blocks = headcut.model_blocks(make_model("gpt2"))
    assert [b.name for b in blocks] == ["self.0", "self.1", "self.2"]
    assert all(b.fused_qkv and b.q == b.k == b.v == f"h.{b.layer}.attn.c_attn" for b in blocks)
    assert all(b.heads == 4 and b.head_dim == 8 for b in blocks)


# ---------------------------------------------------------------- GPT-2


def test_gpt2_slices_each_qkv_section_and_updates_split_size():
    model = make_model("gpt2")
    attn = model.transformer.h[1].attn
    d, width = attn.head_dim, attn.embed_dim
    w_attn, b_attn, w_proj = attn.c_attn.weight.clone(), attn.c_attn.bias.clone(), attn.c_proj.weight.clone()
    keep = [1, 3]  # masks are sorted; the kept heads keep their order
    headcut.slim(model, {"keep": {"self.1": keep}})
    cols = [s * width + h * d + i for s in range(3) for h in keep for i in range(d)]
    rows = [h * d + i for h in keep for i in range(d)]
    assert torch.equal(attn.c_attn.weight, w_attn[:, cols])
    assert torch.equal(attn.c_attn.bias, b_attn[cols])
    assert torch.equal(attn.c_proj.weight, w_proj[rows])
    assert attn.split_size == 2 * d and attn.num_heads == 2 and attn.c_attn.nf == 6 * d
    assert attn.embed_dim == width  # the model width does not change
    assert headcut.model_blocks(model)[1].heads == 2


def test_gpt2_headless_layer_returns_bias_and_keeps_cache_length():
    model = make_model("gpt2", "GPT2LMHeadModel")
    inputs = make_inputs("gpt2", model)
    expected, got = gated_then_slimmed(model, inputs, {"keep": {"self.0": []}})
    assert (got - expected).abs().max().item() <= ATOL
    proj = model.transformer.h[0].attn.c_proj
    assert proj.weight.shape == (0, 32)
    hidden = torch.randn(2, 3, 0)
    assert torch.equal(proj(hidden), proj.bias.expand(2, 3, 32))
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
    cache = out.past_key_values
    assert cache.layers[0].keys.shape == (2, 1, 7, 1)  # one-column placeholder per position
    assert cache.get_seq_length() == 7


def test_gpt2_refuses_cross_attention():
    config = make_config("gpt2")
    config.add_cross_attention = True
    model = T.GPT2LMHeadModel(config)
    with pytest.raises(headcut.HeadcutError, match="cross-attention"):
        headcut.model_blocks(model)


# ---------------------------------------------------------------- T5 position bias


def _capture_bias(model, stack: str, layer: int) -> list[torch.Tensor]:
    """Record the position_bias that T5 layer ``layer`` of ``stack`` receives."""
    seen: list[torch.Tensor] = []
    attn = getattr(model.base_model, stack).block[layer].layer[0].SelfAttention

    def hook(_module, _args, kwargs):
        seen.append(kwargs["position_bias"])

    attn.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("layer0", [[1, 3], [2], []])
def test_t5_cut_layer0_passes_full_bias_on(impl, layer0):
    reference = make_model("t5", "T5ForConditionalGeneration", seed=4)
    reference.set_attn_implementation(impl)
    inputs = make_inputs("t5", reference)
    ref_enc, ref_dec = _capture_bias(reference, "encoder", 1), _capture_bias(reference, "decoder", 1)
    forward(reference, inputs)

    model = make_model("t5", "T5ForConditionalGeneration", seed=4)
    model.set_attn_implementation(impl)
    mask = {"keep": {"encoder.0": layer0, "decoder.0": layer0, "cross.0": layer0}}  # later layers: all heads
    expected, got = gated_then_slimmed(model, inputs, mask)
    assert (got - expected).abs().max().item() <= ATOL

    enc, dec = _capture_bias(model, "encoder", 1), _capture_bias(model, "decoder", 1)
    forward(model, inputs)
    assert torch.equal(enc[0], ref_enc[0]) and enc[0].shape[1] == 4
    assert torch.equal(dec[0], ref_dec[0]) and dec[0].shape[1] == 4
    # layer 0 keeps its full-width bias embedding; its projections lost the cut heads
    for stack in (model.encoder, model.decoder):
        attn = stack.block[0].layer[0].SelfAttention
        assert attn.relative_attention_bias.weight.shape == (8, 4)
        assert attn.q.weight.shape == (8 * len(layer0), 32)
        assert attn._hc_heads == layer0 and attn.n_heads == len(layer0)


def test_t5_later_layer_cut_selects_its_heads_from_the_full_bias():
    model = make_model("t5", "T5ForConditionalGeneration", seed=6)
    model.set_attn_implementation("eager")
    inputs = make_inputs("t5", model)
    mask = {"keep": {"encoder.1": [3, 0], "decoder.1": [2], "cross.1": [], "cross.0": [1, 2]}}
    expected, got = gated_then_slimmed(model, inputs, mask)
    assert (got - expected).abs().max().item() <= ATOL
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    assert [a.shape[1] for a in out.encoder_attentions] == [4, 2]
    assert [a.shape[1] for a in out.cross_attentions] == [2, 0]


def test_t5_second_cut_stores_original_head_indices():
    model = make_model("t5", "T5ForConditionalGeneration", seed=8)
    inputs = make_inputs("t5", model)
    with torch.no_grad(), headcut.gated(model, {"keep": {"encoder.0": [1, 3], "decoder.1": [0]}}):
        expected = forward(model, inputs)
    headcut.slim(model, {"keep": {"encoder.0": [1, 2, 3], "decoder.1": [0, 3]}})
    headcut.slim(model, {"keep": {"encoder.0": [0, 2], "decoder.1": [0]}})
    assert (forward(model, inputs) - expected).abs().max().item() <= ATOL
    assert model.encoder.block[0].layer[0].SelfAttention._hc_heads == [1, 3]
    assert model.decoder.block[1].layer[0].SelfAttention._hc_heads == [0]
    record = model.config.headcut
    assert record["blocks"]["encoder.0"]["q"] == [1, 3]
    mixins = {op["path"]: op["attrs"]["_hc_heads"] for op in record["ops"] if op["op"] == "mixin"}
    assert mixins == {"encoder.block.0.layer.0.SelfAttention": [1, 3], "decoder.block.1.layer.0.SelfAttention": [0]}
    with tempfile.TemporaryDirectory() as tmp:
        headcut.save(model, f"{tmp}/m")
        again = headcut.load(f"{tmp}/m")
        assert again.encoder.block[0].layer[0].SelfAttention._hc_heads == [1, 3]
        assert (forward(again, inputs) - expected).abs().max().item() <= ATOL


def test_t5_headless_decoder_layer0_static_cache_generation():
    model = make_model("t5", "T5ForConditionalGeneration", seed=5)
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = {"keep": {"decoder.0": [], "cross.0": [], "decoder.1": [1, 2]}}
    gen = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        with headcut.gated(model, mask):
            expected = model.generate(input_ids=ids, **gen)
        headcut.slim(model, mask)
        got = model.generate(input_ids=ids, **gen)
    assert torch.equal(got, expected)


# ---------------------------------------------------------------- BART / Marian cache


@pytest.mark.parametrize("family,cls_name", [("bart", "BartForConditionalGeneration"), ("marian", "MarianMTModel")])
def test_headless_cross_attention_leaves_cross_cache_alone(family, cls_name):
    model = make_model(family, cls_name, seed=2)
    inputs = make_inputs(family, model)
    expected, got = gated_then_slimmed(model, inputs, {"keep": {"decoder.0": [], "cross.0": [], "cross.1": [0, 3]}})
    assert (got - expected).abs().max().item() <= ATOL
    attn = model.base_model.decoder.layers[1].encoder_attn
    assert attn.num_heads == 2 and attn.q_proj.weight.shape == (16, 32)
    with torch.no_grad():
        cache = model(**inputs, use_cache=True).past_key_values
    assert cache.self_attention_cache.layers[0].keys.shape == (2, 1, 5, 1)  # decoder self-attn placeholder
    assert cache.get_seq_length() == 5
    assert getattr(cache.cross_attention_cache.layers[0], "keys", None) is None  # headless cross: untouched
    assert cache.cross_attention_cache.layers[1].keys.shape == (2, 2, 7, 8)
