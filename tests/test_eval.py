"""evaluate() against hand-computed numbers, padding invariance, slimmed models, and `headcut eval`."""

from __future__ import annotations

import bz2
import csv
import importlib.util
import io as stdio
import json
import math
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers import (
    cls_rows,
    make_model,
    make_tokenizer,
    one_line_error,
    save_tiny,
    sentence,
    write_rows,
)
from typer.testing import CliRunner

import headcut
from headcut.cli import app
from headcut.data import Calibration, DataConfig, load_calibration, load_tokenizer
from headcut.model import evaluation
from headcut.model.evaluation import EvalResult, evaluate, macro_f1, mcc

runner = CliRunner()


def run(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def lm_rows(n: int = 12, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "text": sentence(g, 2 + (5 * i) % 11),
            "label": i % 3,
            "source": sentence(g, 3 + i % 4),
            "target": sentence(g, 2 + (3 * i) % 7),
        }
        for i in range(n)
    ]


def calib(model, tok, path, **kw) -> Calibration:
    return load_calibration(model, tok, DataConfig(path=str(path), **kw))


def padded(c: Calibration, extra: int = 5) -> Calibration:
    """The same data with ``extra`` more padding columns in every batch."""
    batches = []
    for b in c.batches:
        n = b["input_ids"].shape[0]
        nb = {}
        for k, v in b.items():
            if v.dim() == 1:
                nb[k] = v
                continue
            fill = {"input_ids": 0, "labels": -100}.get(k, 0)
            nb[k] = torch.cat([v, torch.full((n, extra), fill, dtype=v.dtype)], dim=1)
        batches.append(nb)
    return Calibration(
        task=c.task,
        batches=batches,
        examples=c.examples,
        source=c.source,
        columns=c.columns,
        label_names=c.label_names,
        references=c.references,
        tokenizer=c.tokenizer,
    )


# --------------------------------------------------------------------------------------- numbers


def test_macro_f1_by_hand():
    # class 0: tp 1 fp 1 fn 1 -> 0.5; class 1: tp 2 fp 1 fn 0 -> 0.8; class 2: tp 0 fp 0 fn 1 -> 0
    assert macro_f1([0, 0, 1, 1, 2], [0, 1, 1, 1, 0]) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert macro_f1([1, 1], [1, 1]) == 1.0
    # a class only predicted counts too: class 0 tp 1, class 1 fp 1 fn 0 -> 0, class 2 fn 1 -> 0
    assert macro_f1([0, 2], [0, 1]) == pytest.approx(1 / 3)


def test_mcc_by_hand():
    # binary: tp 3, tn 3, fp 1, fn 1 -> (9 - 1) / sqrt(4 * 4 * 4 * 4) = 0.5
    assert mcc([1, 1, 1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1, 1, 0]) == pytest.approx(0.5)
    # three classes (Gorodkin): c 3, s 5, sum p_k t_k = 10 -> (15 - 10) / sqrt((25 - 13) * (25 - 9))
    assert mcc([0, 0, 1, 1, 2], [0, 1, 1, 1, 0]) == pytest.approx(5 / (12 * 16) ** 0.5)
    assert mcc([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0  # constant predictions
    assert mcc([0, 1], [1, 0]) == pytest.approx(-1.0)


def test_classification_metrics_by_hand(tmp_path, tok):
    model = make_model("bert", "BertForSequenceClassification")
    rows = cls_rows(30, seed=4)
    c = calib(model, tok, write_rows(tmp_path / "d.csv", rows), batch_size=7)
    result = evaluate(model, c)
    assert result.primary == "accuracy" and result.higher_is_better and result.examples == 30
    # one example at a time, no padding
    labels, preds, losses = [], [], []
    with torch.no_grad():
        for r in rows:
            enc = tok(r["text"], return_tensors="pt")
            logits = model(**enc).logits[0]
            labels.append(r["label"])
            preds.append(int(logits.argmax()))
            losses.append(float(-torch.log_softmax(logits, -1)[r["label"]]))
    accuracy = sum(y == p for y, p in zip(labels, preds)) / 30
    per_class = []
    for k in sorted(set(labels) | set(preds)):
        tp = sum(y == k and p == k for y, p in zip(labels, preds))
        prec = tp / max(sum(p == k for p in preds), 1)
        rec = tp / max(sum(y == k for y in labels), 1)
        per_class.append(0.0 if prec + rec == 0 else 2 * prec * rec / (prec + rec))
    assert result.metrics["accuracy"] == pytest.approx(accuracy)
    assert result.metrics["macro_f1"] == pytest.approx(sum(per_class) / len(per_class))
    assert result.metrics["loss"] == pytest.approx(sum(losses) / 30, rel=1e-5)
    assert result.value == result.metrics["accuracy"]
    assert result.seconds > 0 and result.examples_per_s == pytest.approx(30 / result.seconds)


def test_causal_lm_perplexity_is_token_weighted(tmp_path, tok):
    model = make_model("llama", "LlamaForCausalLM")
    rows = lm_rows(10)
    c = calib(model, tok, write_rows(tmp_path / "d.jsonl", rows), batch_size=4, seq_len=32)
    result = evaluate(model, c)
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            ids = tok(r["text"], return_tensors="pt")["input_ids"]
            n = ids.shape[1] - 1
            total += float(model(input_ids=ids, labels=ids).loss) * n  # the model's mean over n predictions
            count += n
    assert result.metrics["tokens"] == count == c.scored_tokens
    assert result.metrics["loss"] == pytest.approx(total / count, rel=1e-5)
    assert result.metrics["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)
    assert result.primary == "perplexity" and not result.higher_is_better


def test_masked_lm_perplexity_over_masked_tokens(tmp_path, tok):
    model = make_model("bert", "BertForMaskedLM")
    c = calib(model, tok, write_rows(tmp_path / "d.csv", lm_rows(12)), batch_size=64)
    assert len(c.batches) == 1
    result = evaluate(model, c)
    with torch.no_grad():
        loss = float(model(**c.batches[0]).loss)  # transformers' mean over the masked positions
    assert result.metrics["loss"] == pytest.approx(loss, rel=1e-5)
    assert result.metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert result.metrics["tokens"] == int((c.batches[0]["labels"] != -100).sum())


@pytest.mark.parametrize(
    "family,cls_name",
    [
        ("bart", "BartForConditionalGeneration"),
        ("t5", "T5ForConditionalGeneration"),
    ],
)
def test_seq2seq_loss_and_bleu_note(tmp_path, tok, family, cls_name, monkeypatch):
    monkeypatch.setattr(evaluation, "_bleu_available", lambda: False)
    model = make_model(family, cls_name)
    c = calib(model, tok, write_rows(tmp_path / "d.csv", lm_rows(6)), batch_size=6, seq_len=32)
    result = evaluate(model, c)
    with torch.no_grad():
        loss = float(model(**c.batches[0]).loss)
    assert result.metrics["loss"] == pytest.approx(loss, rel=1e-5)
    assert result.metrics["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert "bleu" not in result.metrics
    assert any("sacrebleu" in n for n in result.notes)


@pytest.mark.skipif(importlib.util.find_spec("sacrebleu") is None, reason="sacrebleu not installed")
def test_seq2seq_bleu_with_sacrebleu(tmp_path, tok):
    import sacrebleu

    model = make_model("bart", "BartForConditionalGeneration")
    c = calib(model, tok, write_rows(tmp_path / "d.csv", lm_rows(5)), batch_size=2, seq_len=32)
    result = evaluate(model, c)
    hyps = []
    with torch.no_grad():
        for b in c.batches:
            n = int((b["labels"] != -100).sum(1).max())
            out = model.generate(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                max_new_tokens=n,
                do_sample=False,
                num_beams=1,
            )
            hyps += [t.strip() for t in tok.batch_decode(out, skip_special_tokens=True)]
    assert result.metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [c.references]).score)
    assert not result.notes


# ------------------------------------------------------------------------------------ padding etc.


@pytest.mark.parametrize(
    "family,cls_name",
    [
        ("bert", "BertForSequenceClassification"),
        ("gpt2", "GPT2ForSequenceClassification"),
        ("gpt2", "GPT2LMHeadModel"),
        ("llama", "LlamaForCausalLM"),
        ("bert", "BertForMaskedLM"),
        ("bart", "BartForConditionalGeneration"),
        ("t5", "T5ForConditionalGeneration"),
    ],
)
def test_extra_padding_changes_no_metric(tmp_path, tok, family, cls_name, monkeypatch):
    monkeypatch.setattr(evaluation, "_bleu_available", lambda: False)
    model = make_model(family, cls_name)
    c = calib(model, tok, write_rows(tmp_path / "d.csv", lm_rows(10)), batch_size=4, seq_len=24)
    assert any((b["attention_mask"] == 0).any() for b in c.batches)
    a, b = evaluate(model, c), evaluate(model, padded(c, extra=6))
    assert a.metrics.keys() == b.metrics.keys()
    for k in a.metrics:
        assert a.metrics[k] == pytest.approx(b.metrics[k], rel=1e-4, abs=1e-6), k


def test_slimmed_and_gated_models_evaluate_alike(tmp_path, tok):
    model = make_model("bert", "BertForMaskedLM")
    c = calib(model, tok, write_rows(tmp_path / "d.csv", lm_rows(12)), batch_size=5)
    mask = {"drop": {"self.0": [0, 2], "self.1": [1]}}
    full = evaluate(model, c)
    with headcut.gated(model, mask):
        gated = evaluate(model, c)
    headcut.slim(model, mask)
    slim = evaluate(model, c)
    assert slim.metrics["loss"] == pytest.approx(gated.metrics["loss"], rel=1e-5)
    assert slim.metrics["loss"] != pytest.approx(full.metrics["loss"], rel=1e-5)


def test_progress_and_training_mode(tmp_path, tok):
    model = make_model("bert", "BertForSequenceClassification")
    c = calib(model, tok, write_rows(tmp_path / "d.csv", cls_rows(10)), batch_size=4)
    calls: list[tuple[int, int]] = []
    model.train()
    a = evaluate(model, c, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert model.training  # the mode is restored
    b = evaluate(model, c)
    assert a.metrics == b.metrics  # eval mode inside: dropout off, deterministic


def test_eval_result_json_roundtrip(tmp_path, tok):
    model = make_model("bert", "BertForSequenceClassification")
    result = evaluate(model, calib(model, tok, write_rows(tmp_path / "d.csv", cls_rows(4))))
    data = json.loads(json.dumps(result.to_json()))
    assert EvalResult(**data) == result


# ------------------------------------------------------------------------------------------- CLI


def test_cli_eval_json_matches_the_library(tmp_path, tok):
    model_dir = save_tiny(tmp_path / "m", "bert", "BertForSequenceClassification")
    data = write_rows(tmp_path / "d.csv", cls_rows(20))
    result = run("eval", model_dir, "--data", data, "--batch-size", 6, "--max-examples", 15, "--seed", 3, "--json", "-")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert "accuracy" in result.stderr and "examples/s" in result.stderr
    model = headcut.load(model_dir)
    c = load_calibration(model, load_tokenizer(model_dir), DataConfig(str(data), batch_size=6, max_examples=15, seed=3))
    lib = evaluate(model, c)
    assert out["metrics"] == pytest.approx(lib.metrics)
    assert out["examples"] == 15 and out["primary"] == "accuracy" and out["task"] == "classification"
    assert out["data"]["columns"] == {"text": "text", "label": "label"} and out["data"]["batches"] == 3


def test_cli_eval_json_file_and_causal_lm_txt(tmp_path):
    model_dir = save_tiny(tmp_path / "gpt", "gpt2", "GPT2LMHeadModel")
    g = torch.Generator().manual_seed(1)
    (tmp_path / "book.txt").write_text("\n".join(sentence(g, 9) for _ in range(20)))
    result = run("eval", model_dir, "--data", tmp_path / "book.txt", "--seq-len", 20, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["task"] == "causal-lm" and out["examples"] == 180 // 18
    assert out["metrics"]["perplexity"] == pytest.approx(math.exp(out["metrics"]["loss"]))
    assert "perplexity" in result.stdout  # the table is the result: stdout


def test_cli_eval_bad_input_is_one_line(tmp_path):
    model_dir = save_tiny(tmp_path / "m", "bert", "BertForSequenceClassification")
    gpt_dir = save_tiny(tmp_path / "gpt", "gpt2", "GPT2LMHeadModel")
    one_line_error(run("eval", model_dir, "--data", tmp_path / "nope.csv"), "data file not found")
    (tmp_path / "empty.csv").write_text("")
    one_line_error(run("eval", model_dir, "--data", tmp_path / "empty.csv"), "is empty")
    cols = write_rows(tmp_path / "cols.csv", [{"review_text": "good", "stars": 1}])
    one_line_error(run("eval", model_dir, "--data", cols), "its columns: review_text, stars")
    labels = write_rows(tmp_path / "labels.csv", [{"text": "good", "label": "great"}])
    one_line_error(run("eval", model_dir, "--data", labels), "'great'", "LABEL_0, LABEL_1, LABEL_2")
    (tmp_path / "short.txt").write_text("good movie\n")
    one_line_error(
        run("eval", gpt_dir, "--data", tmp_path / "short.txt", "--seq-len", 16), "shorter than one block of 16 tokens"
    )
    one_line_error(run("eval", model_dir, "--data", cols, "--seq-len", 1), "--seq-len must be an integer >= 2 (got 1)")
    bare = save_tiny(tmp_path / "bare", "bert", "BertForSequenceClassification", tokenizer=False)
    one_line_error(run("eval", bare, "--data", labels), "has no tokenizer")
    base = save_tiny(tmp_path / "base", "bert", "BertModel")
    one_line_error(run("eval", base, "--data", labels), "no task head")


def test_cli_eval_task_flag_picks_the_head(tmp_path):
    model_dir = save_tiny(tmp_path / "base", "bert", "BertForMaskedLM")
    data = write_rows(tmp_path / "d.csv", lm_rows(6))
    result = run("eval", model_dir, "--data", data, "--task", "masked-lm", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["task"] == "masked-lm"


# ------------------------------------------------------------------------------------- real data


def _real_paths() -> tuple[Path, Path]:
    import headcut_offline as offline
    from headcut.errors import HeadcutError

    try:
        return offline.minilm_dir(), offline.data_dir()
    except HeadcutError as exc:
        pytest.skip(str(exc))


@pytest.mark.real
def test_real_minilm_classifier_on_rotten_tomatoes(tmp_path):
    import shutil

    minilm, data_dir = _real_paths()
    reviews = data_dir / "rotten_tomatoes_corpus_full.csv.bz2"
    model = T.AutoModelForSequenceClassification.from_pretrained(
        minilm, num_labels=2, id2label={0: "rotten", 1: "fresh"}, label2id={"rotten": 0, "fresh": 1}
    )
    model_dir = tmp_path / "minilm-cls"
    model.save_pretrained(model_dir)
    for f in minilm.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(f, model_dir / f.name)
    # the file also has "plot" rows: the error names the model's labels
    one_line_error(run("eval", model_dir, "--data", reviews, "--label-col", "category"), "'plot'", "(rotten, fresh)")
    # the reviews only, as a bz2 csv again; the first 64 after shuffling
    with bz2.open(reviews, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")]
    buf = stdio.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    filtered = tmp_path / "reviews.csv.bz2"
    filtered.write_bytes(bz2.compress(buf.getvalue().encode()))
    result = run(
        "eval",
        model_dir,
        "--data",
        filtered,
        "--label-col",
        "category",
        "--max-examples",
        64,
        "--batch-size",
        32,
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["examples"] == 64 and out["data"]["columns"] == {"text": "text", "label": "category"}
    assert 0.0 <= out["metrics"]["accuracy"] <= 1.0 and math.isfinite(out["metrics"]["loss"])
    # the same numbers from the library
    loaded = headcut.load(model_dir)
    c = load_calibration(
        loaded,
        load_tokenizer(model_dir),
        DataConfig(str(filtered), label_col="category", max_examples=64, batch_size=32),
    )
    labels = torch.cat([b["labels"] for b in c.batches])
    assert 0 < int(labels.sum()) < 64  # both classes drawn
    assert evaluate(loaded, c).metrics == pytest.approx(out["metrics"])


@pytest.mark.real
def test_real_hamlet_blocks_with_the_minilm_tokenizer(tmp_path):
    minilm, data_dir = _real_paths()
    tok = load_tokenizer(minilm)
    cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, vocab_size=len(tok))
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(cfg).eval()
    c = load_calibration(model, tok, DataConfig(str(data_dir / "hamlet.txt"), seq_len=128, max_examples=8))
    assert c.examples == 8 and all(b["input_ids"].shape[1] == 128 for b in c.batches)
    assert all((b["input_ids"][:, 0] == tok.cls_token_id).all() for b in c.batches)
    result = evaluate(model, c)
    # an untrained model is close to uniform over the vocabulary
    assert 0.5 * len(tok) < result.metrics["perplexity"] < 2 * len(tok)
