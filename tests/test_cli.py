"""The CLI on tiny checkpoints: info/export output, and every bad input of the surgery issue
(one-line error, exit code 2, nothing written, input never modified)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers import digest, make_inputs, make_model, one_line_error, output_tensor, run

import headcut
from headcut.model import saving as hio


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ckpt") / "bert"
    make_model("bert", "BertForSequenceClassification").save_pretrained(d)
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n")  # a tokenizer-side file to be copied
    return d


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ckpt") / "llama"
    make_model("llama", "LlamaForCausalLM").save_pretrained(d)
    return d


def write_mask(tmp_path: Path, mask: dict) -> Path:
    p = tmp_path / "mask.json"
    p.write_text(json.dumps(mask))
    return p


def test_info_json(bert_dir):
    result = run("info", bert_dir, "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["total_heads"] == 8
    assert [b["name"] for b in data["blocks"]] == ["self.0", "self.1"]
    assert set(data["blocks"][0]) == {"name", "kind", "layer", "heads", "kv_heads", "head_dim", "mixer"}
    assert data["params"] == headcut.count_params(headcut.load(bert_dir))


def test_export_roundtrip_and_input_untouched(bert_dir, tmp_path):
    before = digest(bert_dir)
    mask = write_mask(tmp_path, {"drop": {"self.0": [0, 2], "self.1": [0, 1, 2, 3]}})
    out = tmp_path / "slim"
    result = run("export", bert_dir, "--mask", mask, "--out", out, "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["heads_before"], report["heads_after"]) == (8, 2)
    assert digest(bert_dir) == before
    assert {"config.json", "model.safetensors", "modeling_headcut.py", "headcut_runtime.py", "vocab.txt"} <= {
        p.name for p in out.iterdir()
    }
    info = json.loads(run("info", out, "--json", "-").stdout)
    assert [b["heads"] for b in info["blocks"]] == [2, 0]
    assert info["params"] == report["params_after"]
    # the export equals gating the original
    original = headcut.load(bert_dir)
    inputs = make_inputs("bert", original)
    with torch.no_grad(), headcut.gated(original, {"drop": {"self.0": [0, 2], "self.1": [0, 1, 2, 3]}}):
        expected = output_tensor(original(**inputs))
    with torch.no_grad():
        got = output_tensor(headcut.load(out)(**inputs))
    assert torch.allclose(got, expected, atol=1e-5)
    # a slimmed model can be slimmed again from the CLI (indices are the current ones)
    mask2 = write_mask(tmp_path, {"keep": {"self.0": [1]}})
    again = run("export", out, "--mask", mask2, "--out", tmp_path / "slim2")
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "slim2" / "config.json").read_text())["headcut"]["blocks"]["self.0"]["q"] == [3]


def test_missing_path(tmp_path):
    one_line_error(run("info", tmp_path / "nope"), "not found")


def test_folder_without_config(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    one_line_error(run("info", tmp_path), "no config.json")


def test_folder_without_weights(tmp_path, bert_dir):
    (tmp_path / "config.json").write_text((bert_dir / "config.json").read_text())
    one_line_error(run("info", tmp_path), "no weights")


def test_pickle_weights_refused_unless_allowed(tmp_path, bert_dir):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text((bert_dir / "config.json").read_text())
    model = headcut.load(bert_dir)
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    one_line_error(run("info", d), "pickle", "--allow-pickle")
    ok = run("info", d, "--allow-pickle", "--json", "-")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["total_heads"] == 8


def test_unsupported_architecture(tmp_path):
    cfg = T.GPTNeoConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, attention_types=[[["global"], 2]])
    T.GPTNeoForCausalLM(cfg).save_pretrained(tmp_path / "neo")
    text = one_line_error(run("info", tmp_path / "neo"), "unsupported architecture", "gpt_neo")
    for family in ("bert", "llama", "t5", "vit"):
        assert family in text


def test_remote_code_refused(tmp_path, bert_dir):
    d = tmp_path / "remote"
    d.mkdir()
    cfg = json.loads((bert_dir / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_x.X"}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes((bert_dir / "model.safetensors").read_bytes())
    one_line_error(run("info", d), "--trust-remote-code")


@pytest.mark.parametrize(
    "mask,needle",
    [
        ({"keep": {"self.9": [0]}}, "unknown block name 'self.9'"),
        ({"keep": {"self.0": [4]}}, "out of range"),
        ({"drop": {"self.0": [1, 1]}}, "repeated"),
        ({"keep": {"self.0": "all"}}, "list of integers"),
        ({"keep": {}, "drop": {}}, "exactly one"),
    ],
)
def test_bad_masks_write_nothing(bert_dir, tmp_path, mask, needle):
    out = tmp_path / "out"
    one_line_error(run("export", bert_dir, "--mask", write_mask(tmp_path, mask), "--out", out), needle)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["mask.json"]


def test_mask_file_not_json(bert_dir, tmp_path):
    p = tmp_path / "mask.json"
    p.write_text("{nope")
    one_line_error(run("export", bert_dir, "--mask", p, "--out", tmp_path / "o"), "not valid JSON")


def test_impossible_gqa_mask_names_valid_budgets(llama_dir, tmp_path):
    # tiny llama: 6 query heads, 2 KV groups of 3; heads 0 and 3 sit in different groups
    out = tmp_path / "out"
    text = one_line_error(
        run(
            "export",
            llama_dir,
            "--mask",
            write_mask(tmp_path, {"keep": {"self.0": [0, 1, 3]}}),
            "--out",
            out,
            "--gqa",
            "uniform",
        ),
        "--gqa uniform",
        "self.0",
        "nearest",
    )
    assert "valid counts for this block: 0, 1, 2, 3, 4, 6" in text
    assert not out.exists()
    text = one_line_error(
        run(
            "export",
            llama_dir,
            "--mask",
            write_mask(tmp_path, {"keep": {"self.0": [0, 1, 2, 3]}}),
            "--out",
            out,
            "--gqa",
            "group",
        ),
        "0, 3, 6",
    )
    assert not out.exists()
    ok = run(
        "export",
        llama_dir,
        "--mask",
        write_mask(tmp_path, {"keep": {"self.0": [0, 1, 3]}}),
        "--out",
        out,
        "--gqa",
        "duplicate",
    )
    assert ok.exit_code == 0, ok.output


def test_gqa_policies_shapes(llama_dir):
    for policy, keep, kv, groups in [
        ("group", [3, 4, 5], 1, 3),
        ("uniform", [0, 3], 2, 1),
        ("uniform", [0, 1, 4, 5], 2, 2),
        ("duplicate", [0, 1, 3], 3, 1),
        ("auto", [0, 1, 2], 1, 3),
        ("auto", [1, 4], 2, 1),
    ]:
        model = headcut.load(llama_dir)
        headcut.slim(model, {"keep": {"self.0": keep}}, gqa=policy)
        block = headcut.model_blocks(model)[0]
        assert (block.heads, block.kv_heads) == (len(keep), kv), policy
        assert model.base_model.layers[0].self_attn.num_key_value_groups == groups


def test_unknown_gqa_policy(llama_dir, tmp_path):
    one_line_error(
        run("export", llama_dir, "--mask", write_mask(tmp_path, {"keep": {}}), "--out", tmp_path / "o", "--gqa", "x"),
        "unknown --gqa policy",
    )


def test_existing_output_needs_force(bert_dir, tmp_path):
    out = tmp_path / "out"
    mask = write_mask(tmp_path, {"drop": {"self.0": [0]}})
    assert run("export", bert_dir, "--mask", mask, "--out", out).exit_code == 0
    first = digest(out)
    one_line_error(run("export", bert_dir, "--mask", mask, "--out", out), "--force")
    assert digest(out) == first
    mask2 = write_mask(tmp_path, {"drop": {"self.0": [0, 1]}})
    ok = run("export", bert_dir, "--mask", mask2, "--out", out, "--force")
    assert ok.exit_code == 0, ok.output
    assert digest(out)["model.safetensors"] != first["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mask.json", "out"]  # no temporary leftovers


def test_interrupted_export_leaves_nothing(bert_dir, tmp_path, monkeypatch):
    real = hio.write_checkpoint

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(hio, "write_checkpoint", interrupted)
    mask = write_mask(tmp_path, {"drop": {"self.0": [0]}})
    result = run("export", bert_dir, "--mask", mask, "--out", tmp_path / "out")
    assert result.exit_code == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mask.json"]


def test_hub_id_is_passed_to_transformers(monkeypatch, tmp_path):
    # a name that is not a local path goes to transformers (the Hub); a missing local path does not
    asked: list[str] = []

    def offline(name, *args, **kwargs):
        asked.append(str(name))
        raise OSError(f"We couldn't connect to the Hub to load {name}")

    monkeypatch.setattr(T.AutoConfig, "from_pretrained", offline)
    monkeypatch.chdir(tmp_path)
    one_line_error(
        run("info", "someone/some-model"), "cannot read the config of someone/some-model", "couldn't connect"
    )
    assert asked == ["someone/some-model"]
    one_line_error(run("info", "./someone/some-model"), "checkpoint not found")
    assert asked == ["someone/some-model"]
