"""``--format onnx`` end to end: the output folder without PyTorch weights, the onnxruntime check in
the report, the card, bench in onnxruntime from the folder's own file, and refusals before work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import make_tokenizer, run, save_tiny

import headcut

pytest.importorskip("onnx", reason="pip install 'headcut[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="pip install 'headcut[onnx]'")


def test_onnx_only_output_runs_in_onnxruntime_with_the_same_answers(tmp_path):
    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"keep": {"self.0": [1, 2, 3], "self.1": []}}))
    out = tmp_path / "slim"
    result = run("export", src, "--mask", mask, "--out", out, "--format", "onnx")
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert "model.onnx" in names and "config.json" in names and "tokenizer.json" in names
    assert not any(n.endswith(".safetensors") or n.endswith(".py") for n in names)
    assert "auto_map" not in json.loads((out / "config.json").read_text())
    report = json.loads((out / "headcut-report.json").read_text())
    entry = report["formats"]["onnx"]
    assert entry["parity"] is not None and entry["parity"] <= 1e-4
    assert "no safetensors weights written" in result.stdout and "wrote model.onnx" in result.stdout
    card = (out / "README.md").read_text()
    assert "onnxruntime.InferenceSession" in card and "trust_remote_code" not in card
    # the same answers as the slimmed PyTorch model, on a padded batch a user tokenises
    torch_model = headcut.export(src, mask).model
    batch = make_tokenizer()(["good movie", "a very dull and boring plot"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch_model(**batch).logits.numpy()
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    got = session.run(["logits"], {k: v.numpy() for k, v in batch.items() if k in wanted})[0]
    assert np.abs(got - expected).max() <= 1e-4


def test_bench_times_the_folders_onnx_file_and_updates_the_card(tmp_path):
    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    headcut.export(src, {"drop": {"self.0": [0]}}, formats="safetensors,onnx").save(tmp_path / "slim")
    result = run(
        "bench",
        src,
        tmp_path / "slim",
        "--runtime",
        "torch,onnxruntime",
        "--runs",
        "2",
        "--warmup",
        "0",
        "--batch-size",
        "2",
        "--seq-len",
        "8",
        "--update-card",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout[result.stdout.index("{") :])["models"]
    assert [(r["name"].endswith("slim"), r["runtime"]) for r in rows] == [
        (False, "torch"),
        (False, "onnxruntime"),
        (True, "torch"),
        (True, "onnxruntime"),
    ]
    card = (tmp_path / "slim" / "README.md").read_text()
    assert "| onnxruntime | cpu |" in card and "| torch | cpu |" in card


def test_help_names_the_extras_literally():
    """Rich markup would swallow ``[onnx]``; the help texts escape it."""

    def words(command: str) -> str:
        return " ".join(run(command, "--help").stdout.replace("│", " ").split())

    text = words("export")
    assert "extra [onnx]" in text and "extra [gguf]" in text
    assert "'headcut[plots]'" in words("score")
    assert "extra [onnx]" in words("bench")
