"""``--format decilm``: per-layer cuts of Llama-layout decoders as DeciLM / Nemotron-NAS checkpoints (vLLM's
``DeciLMForCausalLM``), exact: the padded checkpoint computes what the cut computes."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import make_inputs, run, save_tiny
from safetensors.torch import load_file

import headcut
from headcut.errors import HeadcutError
from headcut.outputs.formats.decilm import plan_heads

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
    widths, so this computes what a DeciLM engine computes with those weights (a no_op layer keeps headcut's empty
    attention, which adds nothing)."""
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


def _mask(tmp_path, mask) -> str:
    path = tmp_path / f"mask{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(mask))
    return str(path)
