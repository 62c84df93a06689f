"""``headcut finetune`` and :func:`headcut.finetune.finetune` on tiny models: distillation lowers the
KL to the teacher, slimmed models keep their heads and reload, exact resume, one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers import (
    cls_rows,
    make_config,
    make_model,
    make_tokenizer,
    one_line_error,
    run,
    save_tiny,
    sentence,
    write_rows,
)
from safetensors.torch import load_file

import headcut
from headcut.config import FinetuneConfig
from headcut.data import DataConfig, load_calibration
from headcut.errors import HeadcutError
from headcut.outputs.reports import FINETUNE_REPORT as REPORT_NAME
from headcut.training import engine
from headcut.training.checkpoint import checkpoint_dir_for
from headcut.training.finetuning import finetune, kl_to_teacher

CLS = "BertForSequenceClassification"


@pytest.fixture()
def setup(tmp_path: Path) -> dict[str, Path]:
    student = save_tiny(tmp_path / "student", "bert", CLS, seed=0)
    teacher = save_tiny(tmp_path / "teacher", "bert", CLS, seed=1)
    train = write_rows(tmp_path / "train.csv", cls_rows(24, seed=0))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=5))
    return {"student": student, "teacher": teacher, "train": train, "dev": dev, "tmp": tmp_path}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_cli_distill_lowers_kl_to_teacher_and_writes_report(setup):
    s, out = setup, setup["tmp"] / "out"
    student, teacher = headcut.load(s["student"]), headcut.load(s["teacher"])
    cal = load_calibration(student, make_tokenizer(), DataConfig(path=str(s["train"]), batch_size=8))
    before = kl_to_teacher(student, teacher, cal)
    result = run(
        "finetune",
        s["student"],
        "--data",
        s["train"],
        "--eval-data",
        s["dev"],
        "--out",
        out,
        "--distill-from",
        s["teacher"],
        "--alpha",
        "1.0",
        "--max-steps",
        "30",
        "--lr",
        "3e-3",
        "--batch-size",
        "8",
        "--eval-every",
        "10",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == json.loads((out / REPORT_NAME).read_text())
    assert report["command"] == "finetune" and report["steps"] == 30 and report["seed"] == 0
    assert report["metric"]["name"] == "accuracy" and report["metric"]["before"] is not None
    assert {"headcut", "torch", "transformers"} <= set(report["versions"])
    assert "kl" in report["history"][0] and "task_loss" in report["history"][0]
    assert [e["step"] for e in report["history_summary"]["evals"]] == [10, 20, 30]
    assert not checkpoint_dir_for(out).exists()
    after = kl_to_teacher(headcut.load(out), teacher, cal)
    assert after < 0.5 * before, (before, after)


def test_library_distill_on_causal_lm_lowers_kl(tmp_path):
    g = torch.Generator().manual_seed(0)
    txt = tmp_path / "train.txt"
    txt.write_text("\n".join(sentence(g, 12) for _ in range(40)) + "\n")
    student, teacher = make_model("llama", "LlamaForCausalLM", seed=0), make_model("llama", "LlamaForCausalLM", seed=1)
    cal = load_calibration(student, make_tokenizer(), DataConfig(path=str(txt), seq_len=16, batch_size=8))
    before = kl_to_teacher(student, teacher, cal)
    result = finetune(student, cal, FinetuneConfig(max_steps=25, lr=3e-3, alpha=1.0, seed=0), teacher=teacher)
    assert result.distilled and result.steps == 25
    assert kl_to_teacher(student, teacher, cal) < before
    assert not any(p.grad is not None for p in teacher.parameters())


def test_slimmed_model_keeps_heads_and_reloads(setup):
    s = setup
    slim_dir = s["tmp"] / "slim"
    model = headcut.load(s["student"])
    headcut.slim(model, {"drop": {"self.0": [0, 2], "self.1": [3]}})
    headcut.save(model, slim_dir, source=s["student"])
    heads = {b.name: b.heads for b in headcut.info(headcut.load(slim_dir)).blocks}
    out = s["tmp"] / "out"
    result = run(
        "finetune",
        slim_dir,
        "--data",
        s["train"],
        "--out",
        out,
        "--max-steps",
        "4",
        "--lr",
        "1e-3",
        "--batch-size",
        "8",
        "--seed",
        "3",
    )
    assert result.exit_code == 0, result.output
    tuned = headcut.load(out)
    assert {b.name: b.heads for b in headcut.info(tuned).blocks} == heads == {"self.0": 2, "self.1": 3}
    # the same fine-tuning in memory
    mem = headcut.load(slim_dir)
    cal = load_calibration(mem, make_tokenizer(), DataConfig(path=str(s["train"]), batch_size=8, seed=3))
    finetune(mem, cal, FinetuneConfig(max_steps=4, lr=1e-3, seed=3))
    remote = T.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    batch = {k: v for k, v in cal.batches[0].items() if k != "labels"}
    with torch.no_grad():
        want = mem(**batch).logits
        torch.testing.assert_close(tuned(**batch).logits, want)
        torch.testing.assert_close(remote(**batch).logits, want)
        assert not torch.allclose(headcut.load(slim_dir)(**batch).logits, want)


def test_resume_after_interruption_gives_the_same_weights(setup, monkeypatch):
    s = setup
    args = ["--data", s["train"], "--max-steps", "6", "--lr", "1e-3", "--batch-size", "4", "--checkpoint-every", "2"]
    full = s["tmp"] / "full"
    assert run("finetune", s["student"], *args, "--out", full).exit_code == 0
    out = s["tmp"] / "out"
    original = engine.Trainer.save_checkpoint

    def crash_after_step_4(self):
        path = original(self)
        if self.step == 4:
            raise RuntimeError("simulated crash")
        return path

    monkeypatch.setattr(engine.Trainer, "save_checkpoint", crash_after_step_4)
    crashed = run("finetune", s["student"], *args, "--out", out)
    assert crashed.exit_code != 0 and isinstance(crashed.exception, RuntimeError)
    monkeypatch.setattr(engine.Trainer, "save_checkpoint", original)
    assert not out.exists() and (checkpoint_dir_for(out) / "checkpoint.pt").is_file()
    # without --resume (or --force) the stale checkpoint is refused
    one_line_error(run("finetune", s["student"], *args, "--out", out), "--resume")
    result = run("finetune", s["student"], *args, "--out", out, "--resume", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resumed_from"] == 4
    assert not checkpoint_dir_for(out).exists()
    a, b = _weights(full), _weights(out)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _nothing_written(tmp: Path, before: set[str]) -> None:
    assert {p.name for p in tmp.iterdir()} == before


def test_bad_inputs_one_line_errors_write_nothing(setup):
    s, tmp = setup, setup["tmp"]
    base = ["finetune", s["student"], "--data", s["train"], "--max-steps", "2"]
    existing = tmp / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("x")
    before = {p.name for p in tmp.iterdir()}
    one_line_error(run(*base, "--out", existing), "--force")
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    one_line_error(run(*base, "--out", tmp / "o1", "--distill-from", s["teacher"], "--alpha", "1.5"), "--alpha")
    one_line_error(run(*base, "--out", tmp / "o2", "--distill-from", s["teacher"], "--alpha", "-0.1"), "--alpha")
    two = tmp / "teacher2"
    T.BertForSequenceClassification(make_config("bert", num_labels=2)).save_pretrained(two)
    make_tokenizer().save_pretrained(two)
    before.add("teacher2")
    one_line_error(run(*base, "--out", tmp / "o3", "--distill-from", two), "teacher", "labels")
    one_line_error(run(*base, "--out", tmp / "o4", "--resume"), "no checkpoint")
    one_line_error(run(*base, "--out", tmp / "o5", "--epochs", "1"), "--epochs")
    _nothing_written(tmp, before)


def test_config_validation():
    with pytest.raises(HeadcutError, match="alpha"):
        FinetuneConfig(max_steps=1, alpha=2.0).validate()
    with pytest.raises(HeadcutError, match="temperature"):
        FinetuneConfig(max_steps=1, temperature=0.0).validate()
    assert FinetuneConfig().resolved().epochs == 3 and FinetuneConfig(max_steps=5).resolved().epochs is None


def test_a_new_task_head_is_initialised_from_the_seed(tmp_path):
    """A base checkpoint given a classification head (``--task sequence-classification --labels``):
    the head's random weights come from ``--seed``, so the same call twice, in one process whose
    global RNG has moved on, gives the same model; another seed gives another head."""
    folder = save_tiny(tmp_path / "base", "bert", "BertModel")
    data = write_rows(
        tmp_path / "train.csv", [{"text": r["text"], "label": ["a", "b", "c"][r["label"]]} for r in cls_rows(12)]
    )

    def head(seed: int) -> torch.Tensor:
        torch.rand(7)  # move the global RNG: the result must not depend on it
        tuned = headcut.finetune(
            folder,
            data,
            task="sequence-classification",
            labels=["a", "b", "c"],
            max_steps=1,
            seed=seed,
            checkpoint_every=None,
        )
        return tuned.model.classifier.weight.detach().clone()

    first, again, other = head(0), head(0), head(1)
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_patience_stops_early_and_keeps_the_best_weights(setup):
    """--patience: a learning rate that wrecks the model makes every evaluation worse than the start, so
    the run stops after N evaluations and gives back the starting weights (step 0 is the best); the report
    and the summary say so. Refusals: no --eval-every, no --eval-data, with --resume."""
    s, tmp = setup, setup["tmp"]
    result = run(
        "finetune",
        s["student"],
        "--data",
        s["train"],
        "--eval-data",
        s["dev"],
        "--max-steps",
        "12",
        "--eval-every",
        "2",
        "--patience",
        "2",
        "--lr",
        "5",
        "--out",
        tmp / "early",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    early = report["early_stopping"]
    assert early["patience"] == 2 and early["evaluations"] == 3  # step 0, then 2 and 4: both worse
    assert early["best_step"] == 0 and early["stopped_at"] == 4
    # the starting weights came back: the saved model is the student, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(_weights(s["student"]).values(), _weights(tmp / "early").values()))
    assert report["metric"]["after"] == pytest.approx(early["best"])
    assert "early stopping (2 evaluations)" in result.stderr
    base = ["finetune", s["student"], "--data", s["train"], "--max-steps", "4", "--patience", "2"]
    one_line_error(run(*base, "--out", tmp / "p1", "--eval-data", s["dev"]), "--eval-every")
    one_line_error(run(*base, "--out", tmp / "p2", "--eval-every", "2"), "--eval-data")
    one_line_error(
        run(*base, "--out", tmp / "p3", "--eval-every", "2", "--eval-data", s["dev"], "--resume"), "--patience"
    )
