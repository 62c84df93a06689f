"""Uniform cuts written as stock transformers checkpoints (headcut.model.stock).

A cut with the same query and KV heads in every block of a family whose stock config can state them is saved
with the stock config and no headcut code; a fresh Python process in which headcut cannot be imported loads
it with ``AutoModelFor*.from_pretrained(out)`` (no ``trust_remote_code``) and gets the gated model's logits.
Any other cut is written in headcut's form, with the reason in the report and the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers import ATOL, forward, load_without_headcut, make_inputs, make_model, run, save_tiny, write_rows

import headcut
from headcut.model.stock import stock_form

#: the families whose stock config holds a uniform cut, and one causal-LM class each
STOCK = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def drop_last_group(model) -> dict:
    """A uniform mask: the last KV group of every block removed."""
    blocks = headcut.model_blocks(model)
    return {"drop": {b.name: list(range(b.heads - b.group_size, b.heads)) for b in blocks}}


def case(tmp_path: Path, name: str, model, inputs: dict, expected: torch.Tensor) -> dict:
    folder = tmp_path / name
    torch.save(inputs, tmp_path / f"{name}-inputs.pt")
    torch.save(expected, tmp_path / f"{name}-expected.pt")
    return {
        "folder": str(folder),
        "auto": "AutoModelForCausalLM",
        "inputs": str(tmp_path / f"{name}-inputs.pt"),
        "expected": str(tmp_path / f"{name}-expected.pt"),
    }


def test_uniform_cuts_load_with_stock_transformers_without_headcut(tmp_path):
    """Every family with a stock form: saved plain (no record, no auto_map, no code), loaded in a process without
    headcut, logits equal to the gated model's. A Llama whose head count no longer divides hidden_size is
    written as Mistral (LlamaConfig refuses it)."""
    cases, expected_class = [], {}
    models = [(family, cls, make_model(family, cls)) for family, cls in STOCK.items()]
    cfg = T.LlamaConfig(
        vocab_size=99,
        hidden_size=48,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=4,
        max_position_embeddings=64,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    models.append(("llama-9-heads", "MistralForCausalLM", T.LlamaForCausalLM(cfg).eval()))
    for name, cls, model in models:
        inputs = make_inputs("llama", model)
        mask = drop_last_group(model)
        with headcut.gated(model, mask):
            gated = forward(model, inputs)
        headcut.slim(model, mask)
        saved = headcut.save(model, tmp_path / name)
        assert saved.form is not None and saved.form.stock, (name, saved.form)
        folder = Path(saved.path)
        config = json.loads((folder / "config.json").read_text())
        assert "headcut" not in config and "auto_map" not in config, name
        assert not list(folder.glob("*.py")), name
        assert config["architectures"] == [cls]
        blocks = headcut.model_blocks(model)
        assert config["num_attention_heads"] == blocks[0].heads and config["num_key_value_heads"] == blocks[0].kv_heads
        cases.append(case(tmp_path, name, model, inputs, gated))
        expected_class[str(folder)] = cls
        # headcut's own loader reads the plain checkpoint too
        assert (forward(headcut.load(folder), inputs) - gated).abs().max().item() <= ATOL
    loaded = load_without_headcut(cases)
    for folder, got in loaded.items():
        assert got["class"] == expected_class[folder]
        assert got["diff"] <= ATOL, (folder, got)


@pytest.mark.parametrize(
    "family,cls,why",
    [
        ("olmo2", "Olmo2ForCausalLM", "q/k norms run over all heads"),
        ("gpt2", "GPT2LMHeadModel", "derives the head size"),
        ("t5", "T5ForConditionalGeneration", "relative position bias"),
    ],
)
def test_families_without_a_stock_form_say_why(family, cls, why, tmp_path):
    model = make_model(family, cls)
    blocks = headcut.model_blocks(model)
    headcut.slim(
        model, drop_last_group(model) if family == "olmo2" else {"drop": {b.name: [b.heads - 1] for b in blocks}}
    )
    form = stock_form(model)
    assert not form.stock and why in form.why_not_stock
    saved = headcut.save(model, tmp_path / "out")
    config = json.loads((Path(saved.path) / "config.json").read_text())
    assert "headcut" in config and "auto_map" in config
    assert (Path(saved.path) / "modeling_headcut.py").is_file()


def test_non_uniform_cut_is_written_in_headcut_form_with_the_reason(tmp_path):
    model = make_model("llama", "LlamaForCausalLM")
    blocks = headcut.model_blocks(model)
    headcut.slim(model, {"drop": {blocks[0].name: list(range(blocks[0].group_size))}})
    form = stock_form(model)
    assert not form.stock and "different head counts" in form.why_not_stock
    assert "trust_remote_code=True" in form.loader


def test_uncut_model_and_reslimmed_stock_checkpoint(tmp_path):
    """An uncut model is written as it is; a stock checkpoint slimmed again with a uniform mask stays stock."""
    model = make_model("qwen3", "Qwen3ForCausalLM")
    assert stock_form(model).stock and stock_form(model).model is None
    headcut.slim(model, drop_last_group(model))
    first = headcut.save(model, tmp_path / "first")
    again = headcut.load(first)
    inputs = make_inputs("llama", again)
    mask = {"drop": {b.name: [b.heads - 1] for b in headcut.model_blocks(again)}}  # 3 -> 2 query heads per KV head
    with headcut.gated(again, mask):
        gated = forward(again, inputs)
    headcut.slim(again, mask, gqa="uniform")
    second = headcut.save(again, tmp_path / "second")
    assert second.form.stock
    reloaded = T.AutoModelForCausalLM.from_pretrained(second.path).eval()
    assert (forward(reloaded, inputs) - gated).abs().max().item() <= ATOL


def _text_rows(n: int = 24) -> list[dict]:
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
    return [{"text": " ".join(words[(i + j) % len(words)] for j in range(6))} for i in range(n)]


def test_prune_reports_the_checkpoint_form_and_the_uniform_budgets(tmp_path):
    """Without --uniform a non-uniform cut says which --uniform budgets would give a plain checkpoint; with
    --uniform the output is plain, and the model card says how to load each."""
    src = save_tiny(tmp_path / "model", "llama", "LlamaForCausalLM")
    data = write_rows(tmp_path / "cal.jsonl", _text_rows())
    result = run(
        "prune",
        src,
        "--method",
        "magnitude",
        "--keep",
        "12",
        "--data",
        data,
        "--out",
        tmp_path / "a",
        "--json",
        tmp_path / "a.json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["checkpoint"]["form"] == "headcut" and report["uniform_budgets"]
    assert "--uniform would write a plain one" in result.output
    assert "trust_remote_code=True" in (tmp_path / "a" / "README.md").read_text()
    keep = report["uniform_budgets"][0]
    result = run(
        "prune",
        src,
        "--method",
        "magnitude",
        "--keep",
        str(keep),
        "--uniform",
        "--data",
        data,
        "--out",
        tmp_path / "b",
        "--json",
        tmp_path / "b.json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["checkpoint"]["form"] == "stock" and "uniform_budgets" not in report
    assert "checkpoint: plain transformers LlamaForCausalLM" in result.output
    card = (tmp_path / "b" / "README.md").read_text()
    assert "A plain transformers checkpoint" in card and "trust_remote_code=True" not in card
