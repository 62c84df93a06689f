"""Zero query heads (headcut.model.padding): a cut with the same KV heads in every block but different query
heads per KV head is written as a stock checkpoint, each KV head padded to the most query heads of any block with
zero ones (zero q rows and bias, zero o columns), which plain transformers loads with the cut model's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers import ATOL, forward, load_without_headcut, make_inputs, make_model, run, save_tiny

import headcut
from headcut.model.stock import stock_form

#: families with a stock form and grouped-query attention (Qwen2: a q bias; Qwen3, Gemma 3: per-head q norms)
PADDED = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "mistral": "MistralForCausalLM",
}

#: 6 query heads on 2 KV heads per block, cut to 2, 1 and 2 query heads per KV head (--gqa uniform): padded to 2
MASK = {"drop": {"self.0": [2, 5], "self.1": [1, 2, 4, 5], "self.2": [0, 3]}}


def zero_heads(state: dict[str, torch.Tensor], q: str, o: str, head_dim: int) -> list[int]:
    """The heads of one block whose q rows (and bias) and o columns are all zero, counted from the weights."""
    weight = state[f"{q}.weight"]
    heads = weight.shape[0] // head_dim
    bias = state.get(f"{q}.bias")
    cols = state[f"{o}.weight"].reshape(state[f"{o}.weight"].shape[0], heads, head_dim)
    return [
        h
        for h in range(heads)
        if not weight[h * head_dim : (h + 1) * head_dim].any()
        and (bias is None or not bias[h * head_dim : (h + 1) * head_dim].any())
        and not cols[:, h].any()
    ]


def test_padded_cuts_load_with_stock_transformers(tmp_path):
    """Each family: the cut saved plain (no record, no auto_map, no code) with 2 query heads per KV head in every
    layer, the zero heads inside their KV group; plain transformers (in a process without headcut too) gives the
    cut model's logits, and the padding's numbers are what the weights hold."""
    cases = []
    for family, cls in PADDED.items():
        model = make_model(family, cls)
        inputs = make_inputs("llama", model)
        with headcut.gated(model, MASK):
            gated = forward(model, inputs)
        headcut.slim(model, MASK, gqa="uniform")
        cut = forward(model, inputs)
        assert (cut - gated).abs().max().item() <= ATOL, family
        blocks = headcut.model_blocks(model)
        assert [(b.heads, b.kv_heads) for b in blocks] == [(4, 2), (2, 2), (4, 2)]
        saved = headcut.save(model, tmp_path / family)
        form = saved.form
        assert form is not None and form.stock and form.architecture == cls, (family, form)
        folder = Path(saved.path)
        config = json.loads((folder / "config.json").read_text())
        assert "headcut" not in config and "auto_map" not in config, family
        assert not list(folder.glob("*.py")), family
        assert config["architectures"] == [cls]
        assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2 * 2, 2)

        plain = T.AutoModelForCausalLM.from_pretrained(folder).eval()
        assert type(plain).__name__ == cls
        assert (forward(plain, inputs) - cut).abs().max().item() <= 1e-5, family

        # the padding's numbers, counted from the loaded weights: block self.1 got one zero head per KV head, after
        # its real one (query head j reads KV head j // 2)
        state = plain.state_dict()
        base = plain.base_model_prefix
        head_dim, added = blocks[0].head_dim, {}
        for b in headcut.model_blocks(plain):
            found = zero_heads(state, f"{base}.{b.q}", f"{base}.{b.o}", head_dim)
            if found:
                added[b.name] = len(found)
            assert found == ([1, 3] if b.name == "self.1" else []), (family, b.name, found)
        params_added = sum(p.numel() for p in plain.parameters()) - headcut.count_params(model)
        padding = form.to_json()["padding"]
        assert padding == {
            "query_heads_added": 2,
            "params_added": params_added,
            "query_heads_per_kv_head": 2,
            "kv_heads": 2,
            "per_block": added,
        }, family
        q = plain.get_submodule(f"{base}.{blocks[1].q}")
        o = plain.get_submodule(f"{base}.{blocks[1].o}")
        per_head = head_dim * (q.in_features + (q.bias is not None) + o.out_features)
        assert params_added == 2 * per_head, family
        torch.save(inputs, tmp_path / f"{family}-inputs.pt")
        torch.save(cut, tmp_path / f"{family}-expected.pt")
        cases.append(
            {
                "folder": str(folder),
                "auto": "AutoModelForCausalLM",
                "inputs": str(tmp_path / f"{family}-inputs.pt"),
                "expected": str(tmp_path / f"{family}-expected.pt"),
            }
        )
    for folder, got in load_without_headcut(cases).items():
        assert got["diff"] <= ATOL, (folder, got)


def test_different_kv_heads_per_block_stay_in_headcut_form_with_the_reason():
    """Padding query heads cannot even out KV heads: a cut that removes a whole KV group in one block only (or
    every head of one block) is written in headcut's form, and the reason says so."""
    for mask in ({"drop": {"self.0": [3, 4, 5]}}, {"drop": {"self.1": list(range(6))}}):
        model = make_model("llama", "LlamaForCausalLM")
        headcut.slim(model, mask)
        form = stock_form(model)
        assert not form.stock and form.padding is None
        assert "different head counts" in form.why_not_stock
        assert "KV heads differ per layer" in form.why_not_stock
        assert form.to_json()["padding"] is None


def test_no_padding_without_the_weights_or_with_a_fused_projection():
    """A layer-wise cut (meta=True: the weights are written layer by layer) is not padded, and says why; Phi-3's
    fused q|k|v projection is not padded and keeps the reason it had."""
    model = make_model("llama", "LlamaForCausalLM")
    headcut.slim(model, MASK, gqa="uniform")
    form = stock_form(model, verify=False, meta=True)
    assert not form.stock and "padding needs the weights in memory" in form.why_not_stock
    phi = make_model("phi3", "Phi3ForCausalLM")
    headcut.slim(phi, MASK, gqa="uniform")
    form = stock_form(phi)
    assert not form.stock and "different head counts" in form.why_not_stock
    assert "padding" not in form.why_not_stock


@pytest.mark.parametrize("family,cls", [("qwen3", "Qwen3ForCausalLM")])
def test_export_reports_the_padding_and_the_card_says_what_it_costs(family, cls, tmp_path):
    src = save_tiny(tmp_path / "model", family, cls)
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps(MASK))
    out = tmp_path / "slim"
    result = run("export", src, "--mask", mask, "--gqa", "uniform", "--out", out, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    checkpoint = report["checkpoint"]
    assert checkpoint["form"] == "stock" and checkpoint["why_not_stock"] is None
    padding = checkpoint["padding"]
    assert padding["query_heads_added"] == 2 and padding["per_block"] == {"self.1": 2}
    plain = T.AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in plain.parameters()) == report["params_after"] + padding["params_added"]
    assert "2 zero query heads added" in result.output
    card = (out / "README.md").read_text()
    assert "A plain transformers checkpoint" in card and "trust_remote_code=True" not in card
    assert "2 zero query heads were added" in card and f"{padding['params_added']:,} parameters" in card
    assert "the KV cache and the K/V projections are unchanged" in card


def test_more_zero_heads_where_the_config_refuses_the_largest_count(tmp_path):
    """Gemma 3 270M's shape (4 query heads on 1 KV head) cut to 1, 3 and 2 query heads: Gemma3's config refuses 3
    heads (they do not divide hidden_size 40), so each layer is padded to the uncut model's 4."""
    config = make_model("gemma3", "Gemma3ForCausalLM").config
    config.hidden_size, config.num_attention_heads, config.num_key_value_heads = 40, 4, 1
    torch.manual_seed(0)
    model = T.Gemma3ForCausalLM(config).eval()
    inputs = make_inputs("llama", model)
    headcut.slim(model, {"drop": {"self.0": [1, 2, 3], "self.1": [0], "self.2": [0, 3]}}, gqa="uniform")
    cut = forward(model, inputs)
    assert [b.heads for b in headcut.model_blocks(model)] == [1, 3, 2]
    saved = headcut.save(model, tmp_path / "out")
    assert saved.form is not None and saved.form.stock, saved.form
    assert saved.form.to_json()["padding"]["per_block"] == {"self.0": 3, "self.1": 1, "self.2": 2}
    plain = T.AutoModelForCausalLM.from_pretrained(saved.path).eval()
    assert plain.config.num_attention_heads == 4
    assert (forward(plain, inputs) - cut).abs().max().item() <= 1e-5
