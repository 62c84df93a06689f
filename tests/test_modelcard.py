"""The model card (README.md) of every output folder, and the --format plumbing shared by the commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import cls_rows, one_line_error, run, save_tiny, write_rows

import headcut
from headcut.outputs import formats, modelcard


def _front(text: str) -> tuple[list[str], str]:
    assert text.startswith("---\n"), text[:80]
    head, _, body = text[4:].partition("\n---\n")
    return head.splitlines(), body


def _table(body: str) -> dict[str, tuple[int, int, int, int]]:
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith(("self.", "layers.")) and cells[1].isdigit():
            rows[cells[0]] = tuple(int(c) for c in cells[1:])
    return rows


@pytest.fixture()
def bert(tmp_path: Path) -> Path:
    return save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")


def test_export_writes_a_card_that_states_the_cut(tmp_path, bert):
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {"self.0": [0, 3], "self.1": [0, 1, 2, 3]}}))
    result = run("export", bert, "--mask", mask, "--out", tmp_path / "slim")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "slim" / "README.md").read_text()
    head, body = _front(text)
    assert "library_name: transformers" in head and "pipeline_tag: text-classification" in head
    assert "- headcut" in head and "- pruned" in head
    # a local checkpoint has no Hub id: the card says so instead of inventing one
    assert not any(line.startswith("base_model:") for line in head)
    assert any(line.startswith("# base_model: not known") for line in head)
    report = json.loads((tmp_path / "slim" / "headcut-report.json").read_text())
    table = _table(body)
    assert {k: (v[0], v[1]) for k, v in table.items()} == {
        k: (report["heads_per_block_before"][k], report["heads_per_block_after"][k]) for k in table
    }
    assert table["self.1"][1] == 0 and table["self.0"][1] == 2
    assert "Heads: 8 -> 2 (75 % removed)" in body
    assert f"{report['params_before']:,} -> {report['params_after']:,}" in body
    assert "AutoModelForSequenceClassification.from_pretrained" in body and "headcut.load" in body
    assert "model.onnx" not in body and ".gguf" not in body


def test_prune_card_has_method_paper_and_metric(tmp_path, bert):
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=1))
    result = run(
        "prune",
        bert,
        "--method",
        "gradient",
        "--keep",
        "5",
        "--data",
        train,
        "--eval-data",
        dev,
        "--out",
        tmp_path / "slim",
    )
    assert result.exit_code == 0, result.output
    text = (tmp_path / "slim" / "README.md").read_text()
    head, body = _front(text)
    assert "- gradient" in head
    report = json.loads((tmp_path / "slim" / "headcut-report.json").read_text())
    metric = report["metric"]
    assert f"| {metric['name']} | {metric['before']:.4f} | {metric['after']:.4f} |" in body
    assert "12 examples" in body
    assert "Michel" in body and "arXiv:2108.04657" in body  # the method's paper (DSP §4.2.1 states it)
    assert sum(v[1] for v in _table(body).values()) == 5


def test_base_model_is_carried_from_the_source_card(tmp_path, bert):
    mask = {"drop": {"self.0": [1]}}
    first = headcut.export(bert, mask)
    first.save(tmp_path / "a")
    card = (tmp_path / "a" / "README.md").read_text()
    (tmp_path / "a" / "README.md").write_text(
        card.replace('# base_model: not known (made from the local checkpoint "bert")', 'base_model: "org/tiny-bert"')
    )
    second = headcut.export(tmp_path / "a", {"drop": {"self.1": [2]}})
    second.save(tmp_path / "b")
    head, body = _front((tmp_path / "b" / "README.md").read_text())
    assert 'base_model: "org/tiny-bert"' in head
    # the card of a model cut twice counts from the original heads
    assert _table(body) == {"self.0": (4, 3, 4, 3), "self.1": (4, 3, 4, 3)}
    assert modelcard.base_model("org/name", None) == "org/name"
    assert modelcard.base_model("./not/a/hub/id/x", None) is None


def test_finetune_card_says_heads_were_kept(tmp_path, bert):
    headcut.export(bert, {"drop": {"self.0": [0, 1]}}).save(tmp_path / "slim")
    train = write_rows(tmp_path / "train.csv", cls_rows(16))
    result = run(
        "finetune",
        tmp_path / "slim",
        "--data",
        train,
        "--max-steps",
        "2",
        "--out",
        tmp_path / "ft",
        "--distill-from",
        bert,
    )
    assert result.exit_code == 0, result.output
    _, body = _front((tmp_path / "ft" / "README.md").read_text())
    assert "Fine-tuned by `headcut finetune` for 2 steps, distilled from" in body
    assert _table(body)["self.0"][:2] == (4, 2)


def test_speed_section_is_replaced_not_appended():
    card = f"# x\n\n{modelcard.SPEED_MARK}\n## Speed\n\nNot measured yet.\n\n## Citation\n\nA paper\n"
    rows = [
        {"runtime": "torch", "device": "cpu", "dtype": "float32", "input": "8x128", "median_ms": 10.0, "speedup": 1.5}
    ]
    once = modelcard.replace_speed(card, modelcard.speed_section(rows, "orig", "a test machine"))
    twice = modelcard.replace_speed(once, modelcard.speed_section(rows, "orig", "a test machine"))
    assert once == twice
    assert "Not measured yet" not in once and "| 10.0 | 1.50x |" in once
    assert once.count("## Speed") == 1 and once.rstrip().endswith("A paper")


def test_format_values_are_checked_before_work(tmp_path, bert):
    assert formats.parse_formats("onnx, safetensors") == ("safetensors", "onnx")
    assert formats.parse_formats(None) == ("safetensors",)
    result = run("export", bert, "--mask", tmp_path / "m.json", "--out", tmp_path / "o", "--format", "tflite")
    one_line_error(result, "unknown --format 'tflite'", "safetensors, onnx, gguf")
    assert not (tmp_path / "o").exists()
    with pytest.raises(headcut.HeadcutError, match="--format is empty"):
        formats.parse_formats(",")


def test_a_missing_extra_is_refused_before_the_work(tmp_path, bert, monkeypatch):
    from headcut.outputs.formats import onnx

    monkeypatch.setattr(onnx, "missing_modules", lambda runtime=False: ["onnxscript"])
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {"self.0": [0]}}))
    result = run("export", bert, "--mask", mask, "--out", tmp_path / "o", "--format", "safetensors,onnx")
    one_line_error(result, "ONNX export needs the onnx extra (onnxscript missing)", "pip install 'headcut[onnx]'")
    assert not (tmp_path / "o").exists()


def test_bench_update_card_writes_the_speed_section(tmp_path, bert):
    headcut.export(bert, {"drop": {"self.0": [0, 1], "self.1": [3]}}).save(tmp_path / "slim")
    args = (
        "bench",
        bert,
        tmp_path / "slim",
        "--runs",
        "2",
        "--warmup",
        "0",
        "--batch-size",
        "2",
        "--seq-len",
        "8",
        "--update-card",
    )
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert f"speed written to {tmp_path / 'slim' / 'README.md'}" in result.stdout
    card = (tmp_path / "slim" / "README.md").read_text()
    assert "Not measured yet" not in card
    row = next(line for line in card.splitlines() if line.startswith("| torch | cpu |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "2x8" and cells[5].endswith("x") and float(cells[4]) > 0
    again = run(*args)
    assert again.exit_code == 0, again.output
    assert (tmp_path / "slim" / "README.md").read_text().count("## Speed") == 1
    # a folder headcut did not write is timed but not touched
    before = (bert / "config.json").read_bytes()
    other = run(
        "bench",
        tmp_path / "slim",
        bert,
        "--runs",
        "1",
        "--warmup",
        "0",
        "--batch-size",
        "1",
        "--seq-len",
        "4",
        "--update-card",
    )
    assert other.exit_code == 0, other.output
    assert "no headcut model card" in other.stderr and not (bert / "README.md").exists()
    assert (bert / "config.json").read_bytes() == before


@pytest.mark.parametrize(
    "family, cls, block, fmt, needle",
    [
        ("bart", "BartForConditionalGeneration", "encoder.0", "onnx", "encoder-decoder"),
        ("bert", "BertForSequenceClassification", "self.0", "gguf", "Llama-family"),
    ],
)
def test_a_format_the_model_cannot_take_is_refused_before_the_work(tmp_path, family, cls, block, fmt, needle):
    pytest.importorskip({"onnx": "onnxscript", "gguf": "gguf"}[fmt])
    src = save_tiny(tmp_path / family, family, cls)
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {block: [0]}}))
    result = run("export", src, "--mask", mask, "--out", tmp_path / "o", "--format", fmt)
    one_line_error(result, needle)
    assert not (tmp_path / "o").exists()
