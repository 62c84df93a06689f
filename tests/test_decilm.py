"""``--format decilm``: per-layer cuts of Llama-layout decoders as DeciLM / Nemotron-NAS checkpoints (vLLM's
``DeciLMForCausalLM``), exact: the padded checkpoint computes what the cut computes."""

from __future__ import annotations

import json
import re

import pytest
import torch
import transformers
from helpers import (
    DECILM_FAMILIES,
    GENERATORS,
    LLAMA3_ROPE,
    YARN_ROPE,
    make_inputs,
    make_model,
    one_line_error,
    run,
    save_tiny,
)
from safetensors.torch import load_file

import headcut
from headcut.errors import HeadcutError
from headcut.outputs.formats.decilm import check_decilm, plan_heads

#: the tiny Llama of tests/helpers.py: 3 layers of 6 query heads in 2 KV groups of 3, head_dim 8
MASK = {"drop": {"self.0": [0, 1, 2, 3, 4, 5], "self.1": [3, 4, 5]}}


@pytest.fixture(scope="module")
def tiny_cut(tmp_path_factory):
    root = tmp_path_factory.mktemp("decilm")
    folder = save_tiny(root / "tiny", "llama", "LlamaForCausalLM")
    res = headcut.export(folder, MASK, formats="safetensors,decilm", out=root / "cut")
    return root / "cut", res.report


def _reference(cut_folder, decilm_folder) -> torch.nn.Module:
    """The cut model (``headcut.load``) with every attention that DeciLM runs given the DeciLM checkpoint's padded
    q/k/v/o weights and its group size: transformers' Llama attention infers head counts from the projection
    widths, so this computes what a DeciLM engine computes with those weights and biases (a no_op layer keeps
    headcut's empty attention, which adds nothing)."""
    model = headcut.load(cut_folder).eval()
    config = json.loads((decilm_folder / "config.json").read_text())
    weights = load_file(decilm_folder / "model.safetensors")
    for i, block in enumerate(config["block_configs"]):
        attention = block["attention"]
        if attention["no_op"]:
            assert not any(k.startswith(f"model.layers.{i}.self_attn.") for k in weights)
            assert f"model.layers.{i}.input_layernorm.weight" not in weights
            continue
        attn = model.model.layers[i].self_attn
        if attn.q_proj.out_features == 0:  # emptied by the cut, a zero placeholder head in DeciLM: adds nothing
            assert all(weights[f"model.layers.{i}.self_attn.{p}_proj.weight"].abs().sum() == 0 for p in "qkvo")
            continue
        for part in ("q", "k", "v", "o"):
            linear = getattr(attn, f"{part}_proj")
            linear.weight = torch.nn.Parameter(weights[f"model.layers.{i}.self_attn.{part}_proj.weight"])
            bias = weights.get(f"model.layers.{i}.self_attn.{part}_proj.bias")
            assert (bias is None) == (linear.bias is None)
            if bias is not None:
                linear.bias = torch.nn.Parameter(bias)
        attn.num_key_value_groups = attention["n_heads_in_group"]
    return model


def test_the_decilm_checkpoint_computes_the_cut(tiny_cut):
    """Layer 0 (emptied) keeps one zero KV head (vLLM's DeciLM starts its residual stream there), layer 1 (one KV
    group) and layer 2 (both) take 6 query heads: the padded weights give the cut's logits exactly."""
    cut, report = tiny_cut
    decilm = cut / "decilm"
    written = report["formats"]["decilm"]
    assert written["query_heads"] == 6 and written["kv_heads"] == [1, 1, 2] and written["no_op_layers"] == []
    assert written["padding"]["query_heads_added"] == 6 + 3 and written["padding"]["kv_heads_added"] == 1
    assert written["kv_bytes_per_token"] == {"written": 4 * 2 * 8 * 4, "cut": 3 * 2 * 8 * 4, "unpruned": 6 * 2 * 8 * 4}
    model = headcut.load(cut).eval()
    inputs = make_inputs("llama", model)
    with torch.no_grad():
        expected = model(**inputs).logits
        got = _reference(cut, decilm)(**inputs).logits
    assert torch.allclose(expected, got, atol=1e-6, rtol=0), (expected - got).abs().max()
    weights = load_file(decilm / "model.safetensors")
    q = weights["model.layers.1.self_attn.q_proj.weight"].view(6, 8, -1)
    assert q[3:].abs().sum() == 0 and q[:3].abs().sum() > 0  # the kept group's 3 heads, then 3 zero ones
    assert weights["model.layers.0.self_attn.o_proj.weight"].abs().sum() == 0
    assert "lm_head.weight" not in weights or not transformers.AutoConfig.from_pretrained(cut).tie_word_embeddings


def test_the_config_loads_with_headcuts_configuration_code(tiny_cut):
    """transformers reads the folder's config through its auto_map (headcut's configuration_decilm.py): the
    block_configs as objects (what vLLM reads), written back as plain dicts; the tokenizer is there."""
    cut, _ = tiny_cut
    config = transformers.AutoConfig.from_pretrained(cut / "decilm", trust_remote_code=True)
    assert type(config).__name__ == "DeciLMConfig" and config.model_type == "nemotron-nas"
    assert [b.attention.n_heads_in_group for b in config.block_configs] == [6, 6, 3]
    assert not any(b.attention.no_op for b in config.block_configs) and config.head_dim == 8
    assert config.to_dict()["block_configs"][2]["ffn"]["intermediate_size"] == config.intermediate_size
    assert config.num_attention_heads == 6 and not hasattr(config.block_configs[0].ffn, "ffn_mult")
    with pytest.raises(ValueError):  # without trust_remote_code transformers refuses the foreign model type
        transformers.AutoConfig.from_pretrained(cut / "decilm")
    assert (cut / "decilm" / "tokenizer.json").is_file()


def test_a_middle_layer_without_heads_is_no_op(tmp_path):
    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    res = headcut.export(folder, {"drop": {"self.1": list(range(6))}}, formats="safetensors,decilm", out=tmp_path / "c")
    written = res.report["formats"]["decilm"]
    assert (
        written["no_op_layers"] == [1]
        and written["kv_heads"] == [2, 0, 2]
        and written["padding"]["kv_heads_added"] == 0
    )
    model = headcut.load(tmp_path / "c").eval()
    inputs = make_inputs("llama", model)
    with torch.no_grad():
        expected = model(**inputs).logits
        got = _reference(tmp_path / "c", tmp_path / "c" / "decilm")(**inputs).logits
    assert torch.allclose(expected, got, atol=1e-6, rtol=0)


def test_the_plan_weighs_query_padding_against_kv_padding():
    """SmolLM2's shape (9 query heads, groups of 3): layers keeping 1, 2 and 3 KV groups. Q = 9 pads the 2-group
    layer's KV to 3; Q = 12 pads query heads instead. A long context (KV bytes dear) picks 12, a short one 9."""
    kept = [(1, 3), (2, 3), (3, 3)]
    long = plan_heads(kept, set(), 9, q_head_bytes=1, kv_head_bytes=100)
    assert long["chosen"].q == 12 and [x.written for x in long["chosen"].layers] == [1, 2, 3]
    short = plan_heads(kept, set(), 9, q_head_bytes=1, kv_head_bytes=2)
    assert short["chosen"].q == 9 and [x.written for x in short["chosen"].layers] == [1, 3, 3]
    assert short["no_kv_padding"].q == 12 and short["original_q"].q == 9
    forced = plan_heads(kept, set(), 9, query_heads=18)
    assert forced["chosen"].q == 18
    with pytest.raises(HeadcutError, match="cannot hold"):
        plan_heads(kept, set(), 9, query_heads=4)


def test_the_cli_and_the_card_say_what_was_written(tmp_path):
    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    result = run("export", str(folder), "--mask", _mask(tmp_path, MASK), "--format", "safetensors,decilm",
                 "--out", str(tmp_path / "o"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "wrote decilm/ (DeciLM for vLLM: 6 query heads per layer, 4 KV heads written, 9 zero query heads" in (
        result.output.replace("\n", " ")
    )
    assert "serves in: vLLM: vllm serve " in result.output
    card = (tmp_path / "o" / "README.md").read_text()
    assert "vllm serve path/to/this/folder/decilm --trust-remote-code" in card and "- decilm" in card


def test_decilm_is_refused_where_it_cannot_be_written(tmp_path):
    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    uniform = run("export", str(folder), "--mask", _mask(tmp_path, {"drop": {f"self.{i}": [0, 1, 2] for i in range(3)}}),
                  "--format", "safetensors,decilm", "--out", str(tmp_path / "u"))  # fmt: skip
    assert uniform.exit_code != 0 and "stock checkpoint is what engines serve" in uniform.output
    bert = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    refused = run("export", str(bert), "--mask", _mask(tmp_path, {"drop": {"self.0": [0]}}), "--format", "decilm",
                  "--out", str(tmp_path / "b"))  # fmt: skip
    assert refused.exit_code != 0 and "causal LMs" in refused.output
    assert not (tmp_path / "b").exists() and not (tmp_path / "u").exists()


#: the tiny Mistral without its default window (a window is refused)
WINDOWLESS = {"mistral": {"sliding_window": None}}
#: every head of every layer of the tiny Llama
EMPTY = {"drop": {f"self.{i}": list(range(6)) for i in range(3)}}


@pytest.mark.parametrize("family", sorted(GENERATORS))
def test_decilm_accepts_exactly_the_families_served_in_vllm(family):
    """Every generating family of the tiny models: those of ``DECILM_FAMILIES`` (each served in vLLM by
    tests/test_vllm.py) pass the check; every other one is refused, its reason in one line."""
    model = make_model(family, GENERATORS[family], **WINDOWLESS.get(family, {}))
    if family in DECILM_FAMILIES:
        check_decilm(model)
        return
    with pytest.raises(HeadcutError) as refused:
        check_decilm(model)
    assert str(refused.value).startswith("--format decilm") and "\n" not in str(refused.value)


#: families built on Llama's adapter whose attention vLLM's DeciLM computes otherwise (both were written before)
NOT_LLAMA = {
    "smollm3": "--format decilm: smollm3: layers that skip the rotary embedding (no_rope_layers)",
    "qwen3": "--format decilm: qwen3: per-head q/k RMSNorms (q_norm, k_norm)",
}


@pytest.mark.parametrize("family", sorted(NOT_LLAMA))
def test_families_whose_attention_decilm_cannot_hold_are_refused(tmp_path, family):
    """SmolLM3's layers without RoPE (vLLM served other log-probabilities) and Qwen3's q/k norms (vLLM refused the
    folder): refused before the cut, by the CLI (one line, exit 2) and the API alike, and nothing is written."""
    folder = save_tiny(tmp_path / family, family, GENERATORS[family])
    cli = run("export", folder, "--mask", _mask(tmp_path, MASK), "--format", "safetensors,decilm",
              "--out", tmp_path / "cli")  # fmt: skip
    one_line_error(cli, NOT_LLAMA[family])
    with pytest.raises(HeadcutError, match=re.escape(NOT_LLAMA[family])):
        headcut.export(folder, MASK, formats="safetensors,decilm", out=tmp_path / "api")
    assert not (tmp_path / "cli").exists() and not (tmp_path / "api").exists()


FULL, SLIDING = "full_attention", "sliding_attention"
#: settings of an accepted family that vLLM's DeciLM computes otherwise: (family, config fields, the reason)
REFUSED_SETTINGS = {
    "mistral-window": ("mistral", {}, "mistral: a sliding window of 4096"),
    "qwen2-window": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "layer_types": [FULL, SLIDING, SLIDING]},
        "qwen2: a sliding window of 4",
    ),
    "rope-dynamic": (
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
        "llama: rope_type 'dynamic': transformers rescales its frequencies with the sequence",
    ),
    "rope-longrope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 16,
                "short_factor": [1.0, 1.1, 1.2, 1.3],
                "long_factor": [1.0, 2.0, 3.0, 4.0],
            }
        },
        "llama: rope_type 'longrope': transformers picks the short or long factors",
    ),
    "partial-rotary": (
        "llama",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
        "llama: partial_rotary_factor 0.5",
    ),
    "activation": ("llama", {"hidden_act": "gelu"}, "llama: hidden_act 'gelu' (vLLM's DeciLM MLP runs SiLU only)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_SETTINGS))
def test_settings_decilm_computes_otherwise_are_refused(tmp_path, case):
    family, settings, reason = REFUSED_SETTINGS[case]
    folder = save_tiny(tmp_path / family, family, GENERATORS[family], **settings)
    with pytest.raises(HeadcutError, match=re.escape(f"--format decilm: {reason}")):
        headcut.export(folder, MASK, formats="safetensors,decilm", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


#: settings vLLM's DeciLM computes as transformers does (RoPE types compared position by position: linear and
#: dynamic past max_position_embeddings, the others up to it), each accepted; tests/test_vllm.py serves them
ACCEPTED_SETTINGS = {
    "rope-linear": ("qwen2", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "rope-llama3": (
        "llama",
        {"rope_parameters": LLAMA3_ROPE},
    ),
    "rope-yarn": (
        "mistral",
        {
            "sliding_window": None,
            "rope_parameters": YARN_ROPE,
        },
    ),
    "biases-head-dim": ("llama", {"attention_bias": True, "mlp_bias": True, "head_dim": 12}),
    "qwen2-window-unused": ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "layer_types": [FULL] * 3}),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED_SETTINGS))
def test_settings_decilm_computes_alike_are_accepted(case):
    family, settings = ACCEPTED_SETTINGS[case]
    check_decilm(make_model(family, GENERATORS[family], **settings))


def test_biases_and_the_fields_vllm_reads_are_written_as_the_family_computes(tmp_path):
    """Qwen2 (random q/k/v biases, none on o) and a Llama with attention and MLP biases: the padded biases give the
    cut's logits exactly; the config states the biases as the family has them, and fields the family ignores but
    vLLM's DeciLM reads (a stray logit_scale, bias or qkv_bias) are not written."""
    for family, settings, expected in (
        ("qwen2", {"logit_scale": 4.0, "bias": True}, {"qkv_bias": True, "attention_bias": False, "mlp_bias": False}),
        ("llama", {"attention_bias": True, "mlp_bias": True, "logit_scale": 4.0, "qkv_bias": False},
         {"attention_bias": True, "mlp_bias": True}),
    ):  # fmt: skip
        folder = save_tiny(tmp_path / family, family, GENERATORS[family], **settings)
        cut = tmp_path / f"{family}-cut"
        headcut.export(folder, MASK, formats="safetensors,decilm", out=cut)
        config = json.loads((cut / "decilm" / "config.json").read_text())
        assert {k: config.get(k) for k in expected} == expected, family
        assert not {"logit_scale", "bias"} & set(config) and ("qkv_bias" in config) == (family == "qwen2")
        weights = load_file(cut / "decilm" / "model.safetensors")
        assert weights["model.layers.2.self_attn.q_proj.bias"].abs().sum() > 0
        model = headcut.load(cut).eval()
        inputs = make_inputs(family, model)
        with torch.no_grad():
            expected_logits = model(**inputs).logits
            got = _reference(cut, cut / "decilm")(**inputs).logits
        assert torch.allclose(expected_logits, got, atol=1e-6, rtol=0), (family, (expected_logits - got).abs().max())


def test_a_cut_without_heads_is_written_as_decilm(tmp_path):
    """Every head of every layer dropped: no stock checkpoint holds zero heads (the report says headcut's form), so
    it is not refused as a stock cut but written, by the CLI and the API alike: layer 0 keeps one zero KV head and
    one zero query head (vLLM's DeciLM starts its residual stream there), the others are no_op; the logits are the
    cut's."""
    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    cli = run("export", folder, "--mask", _mask(tmp_path, EMPTY), "--format", "safetensors,decilm",
              "--out", tmp_path / "cli")  # fmt: skip
    assert cli.exit_code == 0, cli.output
    assert "wrote decilm/" in cli.output and "stock checkpoint" not in cli.output
    api = headcut.export(folder, EMPTY, formats="safetensors,decilm", out=tmp_path / "api")
    reports = [json.loads((tmp_path / "cli" / "headcut-report.json").read_text()), api.report]
    for out, report in zip((tmp_path / "cli", tmp_path / "api"), reports):
        assert report["checkpoint"]["form"] == "headcut", report["checkpoint"]
        assert "every block lost all its heads" in report["checkpoint"]["why_not_stock"]
        written = report["formats"]["decilm"]
        assert written["query_heads"] == 1 and written["kv_heads"] == [1, 0, 0] and written["no_op_layers"] == [1, 2]
        model = headcut.load(out).eval()
        inputs = make_inputs("llama", model)
        with torch.no_grad():
            expected = model(**inputs).logits
            got = _reference(out, out / "decilm")(**inputs).logits
        assert torch.allclose(expected, got, atol=1e-6, rtol=0), (expected - got).abs().max()


def _mask(tmp_path, mask) -> str:
    path = tmp_path / f"mask{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(mask))
    return str(path)
