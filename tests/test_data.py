"""Calibration data: file types, tasks, column detection, labels, masking, batching, bad input."""

from __future__ import annotations

import bz2
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as T
from helpers import (
    VOCAB,
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

from headcut.data import Calibration, DataConfig, detect_task, load_calibration, load_tokenizer, looks_local
from headcut.errors import HeadcutError


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def bert_cls():
    return make_model("bert", "BertForSequenceClassification")


def calib(model, tok, path, **kw) -> Calibration:
    return load_calibration(model, tok, DataConfig(path=str(path), **kw))


# ------------------------------------------------------------------------------------------- task


@pytest.mark.parametrize(
    "family,cls_name,task",
    [
        ("bert", "BertForSequenceClassification", "classification"),
        ("gpt2", "GPT2ForSequenceClassification", "classification"),
        ("bert", "BertForMaskedLM", "masked-lm"),
        ("distilbert", "DistilBertForMaskedLM", "masked-lm"),
        ("gpt2", "GPT2LMHeadModel", "causal-lm"),
        ("llama", "LlamaForCausalLM", "causal-lm"),
        ("bart", "BartForConditionalGeneration", "seq2seq"),
        ("t5", "T5ForConditionalGeneration", "seq2seq"),
        ("marian", "MarianMTModel", "seq2seq"),
    ],
)
def test_detect_task(family, cls_name, task):
    assert detect_task(make_model(family, cls_name)) == task


def test_detect_task_on_headcut_loaded_slim_model(tmp_path):
    import headcut

    model = make_model("bert", "BertForMaskedLM")
    headcut.slim(model, {"drop": {"self.0": [0]}})
    headcut.save(model, tmp_path / "slim")
    loaded = headcut.load(tmp_path / "slim")
    assert type(loaded).__name__.startswith("Headcut")
    assert detect_task(loaded) == "masked-lm"


def test_detect_task_refuses_base_and_image_models():
    with pytest.raises(HeadcutError, match="no task head.*--task"):
        detect_task(make_model("bert", "BertModel"))
    with pytest.raises(HeadcutError, match="image data is not supported"):
        detect_task(make_model("vit", "ViTForImageClassification"))


# ------------------------------------------------------------------------------------- file types


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl", ".parquet"])
def test_table_formats_give_the_same_batches(tmp_path, tok, bert_cls, suffix):
    rows = cls_rows(20)
    reference = calib(bert_cls, tok, write_rows(tmp_path / "ref.jsonl", rows), batch_size=8)
    c = calib(bert_cls, tok, write_rows(tmp_path / f"data{suffix}", rows), batch_size=8)
    assert c.task == "classification" and c.examples == 20
    assert c.columns == {"text": "text", "label": "label"}
    assert [len(b["labels"]) for b in c.batches] == [8, 8, 4]
    for a, b in zip(c.batches, reference.batches):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k])
    # every example is there once, with its own label
    want = sorted((tuple(tok(r["text"])["input_ids"]), r["label"]) for r in rows)
    got = sorted(
        (tuple(ids[m.bool()].tolist()), int(y))
        for b in c.batches
        for ids, m, y in zip(b["input_ids"], b["attention_mask"], b["labels"])
    )
    assert got == want


def test_json_records_under_one_field(tmp_path, tok, bert_cls):
    p = tmp_path / "wrapped.json"
    p.write_text(json.dumps({"data": cls_rows(6)}))
    assert calib(bert_cls, tok, p).examples == 6


def test_compressed_csv(tmp_path, tok, bert_cls):
    plain = write_rows(tmp_path / "d.csv", cls_rows(10))
    packed = tmp_path / "d.csv.bz2"
    packed.write_bytes(bz2.compress(plain.read_bytes()))
    a, b = calib(bert_cls, tok, plain), calib(bert_cls, tok, packed)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a.batches, b.batches))


def test_txt_one_example_per_line_for_masked_lm(tmp_path, tok):
    p = tmp_path / "lines.txt"
    p.write_text("the good movie\n\nbad plot and dull actor\n   \nfun\n")
    c = calib(make_model("bert", "BertForMaskedLM"), tok, p)
    assert c.task == "masked-lm" and c.examples == 3 and c.columns == {"text": "text"}
    lengths = sorted(int(m.sum()) for b in c.batches for m in b["attention_mask"])
    assert lengths == [3, 5, 7]  # [CLS] words [SEP]


def test_local_data_folder_is_not_written(tmp_path, tok, bert_cls):
    folder = tmp_path / "mydata"
    folder.mkdir()
    write_rows(folder / "d.csv", cls_rows(5))
    calib(bert_cls, tok, folder / "d.csv")
    assert sorted(p.name for p in folder.rglob("*")) == ["d.csv"]


# ---------------------------------------------------------------------------------- classification


def test_sentence_pairs_get_token_types(tmp_path, tok, bert_cls):
    rows = [
        {"sentence1": "the movie", "sentence2": "a good plot here", "label": 1},
        {"sentence1": "bad", "sentence2": "dull", "label": 0},
    ]
    c = calib(bert_cls, tok, write_rows(tmp_path / "pairs.csv", rows))
    assert c.columns == {"text": "sentence1", "label": "label", "text_pair": "sentence2"}
    b = c.batches[0]
    order = b["labels"].tolist()
    first = order.index(1)
    assert b["input_ids"][first].tolist() == tok("the movie", "a good plot here")["input_ids"]
    assert b["token_type_ids"][first].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    second = order.index(0)
    assert b["token_type_ids"][second].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]  # padding: type 0
    assert b["attention_mask"][second].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0]


def test_token_types_only_for_models_that_take_them(tmp_path, tok):
    rows = [{"text": "the movie", "text_pair": "good", "label": 1}]
    model = make_model("distilbert", "DistilBertForSequenceClassification")
    c = calib(model, tok, write_rows(tmp_path / "p.csv", rows))
    assert set(c.batches[0]) == {"input_ids", "attention_mask", "labels"}


def test_explicit_columns(tmp_path, tok, bert_cls):
    rows = [{"body": "good film", "other": "x", "y": 2}, {"body": "bad film", "other": "z", "y": 0}]
    c = calib(bert_cls, tok, write_rows(tmp_path / "d.jsonl", rows), text_col="body", label_col="y")
    assert c.columns == {"text": "body", "label": "y"}
    assert sorted(c.batches[0]["labels"].tolist()) == [0, 2]


def test_string_labels_map_through_label2id(tmp_path, tok):
    model = make_model("bert", "BertForSequenceClassification")
    model.config.id2label = {0: "neg", 1: "pos", 2: "Mixed"}
    model.config.label2id = {"neg": 0, "pos": 1, "Mixed": 2}
    rows = [
        {"text": "good", "category": "pos"},
        {"text": "bad", "category": "NEG"},
        {"text": "fine", "category": "Mixed"},
        {"text": "dull", "category": "mixed"},
    ]
    c = calib(model, tok, write_rows(tmp_path / "d.csv", rows), batch_size=10)
    assert c.columns["label"] == "category"
    assert c.label_names == ["neg", "pos", "Mixed"]
    got = dict(zip(c.batches[0]["input_ids"][:, 1].tolist(), c.batches[0]["labels"].tolist()))
    assert got == {VOCAB["good"]: 1, VOCAB["bad"]: 0, VOCAB["fine"]: 2, VOCAB["dull"]: 2}


def test_label_not_in_model_lists_the_model_labels(tmp_path, tok):
    model = make_model("bert", "BertForSequenceClassification")
    model.config.id2label = {0: "neg", 1: "pos", 2: "mixed"}
    model.config.label2id = {"neg": 0, "pos": 1, "mixed": 2}
    rows = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "terrible"}]
    with pytest.raises(HeadcutError) as err:
        calib(model, tok, write_rows(tmp_path / "d.csv", rows))
    assert "'terrible'" in str(err.value) and "neg, pos, mixed" in str(err.value)


def test_integer_labels_must_be_in_range(tmp_path, tok, bert_cls):
    rows = [{"text": "good", "label": 1}, {"text": "bad", "label": 3}]
    with pytest.raises(HeadcutError, match="label 3 .* out of range: the model has 3 labels"):
        calib(bert_cls, tok, write_rows(tmp_path / "d.csv", rows))


def test_missing_columns_error_lists_the_columns(tmp_path, tok, bert_cls):
    p = write_rows(tmp_path / "d.csv", [{"words": "good", "stars": 1}])
    with pytest.raises(HeadcutError, match="no text column .*--text-col.*its columns: words, stars"):
        calib(bert_cls, tok, p)
    with pytest.raises(HeadcutError, match="no label column .*--label-col.*its columns: words, stars"):
        calib(bert_cls, tok, p, text_col="words")
    with pytest.raises(HeadcutError, match="no column 'nope' \\(--label-col\\); its columns: words, stars"):
        calib(bert_cls, tok, p, text_col="words", label_col="nope")


def test_txt_has_no_labels_for_classification(tmp_path, tok, bert_cls):
    p = tmp_path / "d.txt"
    p.write_text("good movie\n")
    with pytest.raises(HeadcutError, match="needs labels"):
        calib(bert_cls, tok, p)


def test_decoder_classifier_without_pad_id_needs_batch_size_one(tmp_path, tok):
    model = make_model("gpt2", "GPT2ForSequenceClassification")
    model.config.pad_token_id = None
    p = write_rows(tmp_path / "d.csv", cls_rows(4))
    with pytest.raises(HeadcutError, match="no pad_token_id.*--batch-size 1"):
        calib(model, tok, p, seq_len=32)
    assert calib(model, tok, p, batch_size=1, seq_len=32).examples == 4


# ---------------------------------------------------------------------------------------- causal LM


def test_causal_lm_txt_is_cut_into_blocks(tmp_path, tok):
    g = torch.Generator().manual_seed(3)
    lines = [sentence(g, 7) for _ in range(10)]  # 70 words = 70 tokens
    p = tmp_path / "book.txt"
    p.write_text("\n".join(lines) + "\n")
    model = make_model("gpt2", "GPT2LMHeadModel")
    c = calib(model, tok, p, seq_len=16, batch_size=2)
    # the tokenizer wraps a text in [CLS] ... [SEP]: 14 text tokens per block, 70 // 14 = 5 blocks
    assert c.task == "causal-lm" and c.examples == 5
    assert c.notes == []  # 70 tokens are exactly 5 blocks
    blocks = torch.cat([b["input_ids"] for b in c.batches])
    assert blocks.shape == (5, 16)
    assert (blocks[:, 0] == 1).all() and (blocks[:, -1] == 2).all()
    whole = tok(" ".join(lines), add_special_tokens=False)["input_ids"]
    assert sorted(blocks[:, 1:-1].tolist()) == sorted(whole[i * 14 : (i + 1) * 14] for i in range(5))
    for b in c.batches:
        assert torch.equal(b["labels"], b["input_ids"]) and b["attention_mask"].all()
    assert c.scored_tokens == 5 * 15


def test_causal_lm_text_shorter_than_one_block(tmp_path, tok):
    p = tmp_path / "short.txt"
    p.write_text("the good movie\n")
    with pytest.raises(HeadcutError, match="shorter than one block of 32 tokens \\(3 tokens of text\\)"):
        calib(make_model("gpt2", "GPT2LMHeadModel"), tok, p, seq_len=32)


def test_causal_lm_table_rows_pad_to_minus_100(tmp_path, tok):
    rows = [{"text": "the good movie was fun"}, {"text": "bad"}]
    c = calib(make_model("llama", "LlamaForCausalLM"), tok, write_rows(tmp_path / "d.jsonl", rows), seq_len=32)
    b = c.batches[0]
    short = int(b["attention_mask"].sum(1).argmin())
    assert b["attention_mask"][short].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert b["labels"][short].tolist() == [1, VOCAB["bad"], 2, -100, -100, -100, -100]
    assert b["input_ids"][short, 3:].tolist() == [0, 0, 0, 0]


def test_seq_len_longer_than_the_model(tmp_path, tok):
    p = tmp_path / "t.txt"
    p.write_text("good\n" * 200)
    with pytest.raises(HeadcutError, match="--seq-len 128 is longer than the model's 64 positions"):
        calib(make_model("gpt2", "GPT2LMHeadModel"), tok, p)


# ------------------------------------------------------------------------------------------ seq2seq


def test_seq2seq_source_and_target(tmp_path, tok):
    rows = [
        {"article": "the movie was good and fun", "summary": "good"},
        {"article": "bad", "summary": "a very dull plot"},
    ]
    c = calib(
        make_model("bart", "BartForConditionalGeneration"),
        tok,
        write_rows(tmp_path / "d.csv", rows),
        seq_len=32,
        batch_size=2,
    )
    assert c.task == "seq2seq" and c.columns == {"source": "article", "target": "summary"}
    b = c.batches[0]
    refs = c.references
    assert sorted(refs) == ["a very dull plot", "good"]
    i = refs.index("good")
    assert b["labels"][i].tolist() == [1, VOCAB["good"], 2, -100, -100, -100]
    assert b["input_ids"][i].tolist() == tok("the movie was good and fun")["input_ids"]
    j = refs.index("a very dull plot")
    assert b["attention_mask"][j].tolist() == [1, 1, 1] + [0] * 5
    assert b["input_ids"][j, 3:].tolist() == [0] * 5
    assert c.scored_tokens == 3 + 6


def test_seq2seq_missing_target(tmp_path, tok):
    p = write_rows(tmp_path / "d.csv", [{"source": "good", "answer": "bad"}])
    with pytest.raises(HeadcutError, match="no target column.*--target-col.*its columns: source, answer"):
        calib(make_model("t5", "T5ForConditionalGeneration"), tok, p)


# ---------------------------------------------------------------------------------------- masked LM


def mlm_data(tmp_path: Path, n: int = 400) -> Path:
    g = torch.Generator().manual_seed(5)
    return write_rows(tmp_path / "mlm.csv", [{"text": sentence(g, 1 + i % 12)} for i in range(n)])


def test_masked_lm_masking_statistics(tmp_path, tok):
    model = make_model("bert", "BertForMaskedLM")
    p = mlm_data(tmp_path)
    c = calib(model, tok, p, batch_size=32)
    chosen = kept = masked = randomised = eligible = 0
    for b in c.batches:
        real = b["attention_mask"].bool()
        ids, labels = b["input_ids"], b["labels"]
        special = (labels == -100) & real & ((ids == 1) | (ids == 2))
        assert (labels[~real] == -100).all()
        sel = labels != -100
        assert (sel.sum(1) >= 1).all(), "every example has a masked token"
        assert not (sel & special).any()
        # the first and last real tokens are [CLS] and [SEP]: never chosen
        assert (labels[:, 0] == -100).all()
        lengths = real.sum(1)
        assert (labels[torch.arange(len(ids)), lengths - 1] == -100).all()
        eligible += int((lengths - 2).sum())
        chosen += int(sel.sum())
        masked += int((ids[sel] == 4).sum())
        kept += int((ids[sel] == labels[sel]).sum())
        randomised += int(((ids[sel] != 4) & (ids[sel] != labels[sel])).sum())
    assert c.examples == 400
    # 15 % of eligible tokens (a little more: short examples get at least one)
    assert 0.14 < chosen / eligible < 0.22
    assert 0.72 < masked / chosen < 0.88
    assert 0.05 < kept / chosen < 0.16  # 10 % kept, plus random picks of the same token
    assert 0.05 < randomised / chosen < 0.15
    # with probability 1 every real, non-special token is chosen
    every = load_calibration(model, tok, DataConfig(str(p), batch_size=32, mlm_probability=1.0))
    for b in every.batches:
        assert int((b["labels"] != -100).sum()) == int(b["attention_mask"].sum()) - 2 * len(b["labels"])


def test_masked_lm_is_deterministic_with_the_seed(tmp_path, tok):
    model = make_model("bert", "BertForMaskedLM")
    p = mlm_data(tmp_path, 60)
    a = calib(model, tok, p, seed=7)
    b = calib(model, tok, p, seed=7)
    c = calib(model, tok, p, seed=8)
    for x, y in zip(a.batches, b.batches):
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert any(not torch.equal(x["labels"], y["labels"]) for x, y in zip(a.batches, c.batches))


def test_masked_lm_needs_a_mask_token(tmp_path):
    tok = make_tokenizer()
    tok.mask_token = None
    with pytest.raises(HeadcutError, match="no mask token"):
        calib(make_model("bert", "BertForMaskedLM"), tok, mlm_data(tmp_path, 5))


# ------------------------------------------------------------------------------------ order, padding


def test_shuffle_and_max_examples_are_deterministic_prefixes(tmp_path, tok, bert_cls):
    p = write_rows(tmp_path / "d.csv", cls_rows(30))

    def firsts(**kw):
        c = calib(bert_cls, tok, p, batch_size=4, **kw)
        return [tuple(ids[m.bool()].tolist()) for b in c.batches for ids, m in zip(b["input_ids"], b["attention_mask"])]

    full = firsts(seed=1)
    assert len(full) == 30 and firsts(seed=1) == full
    assert firsts(seed=1, max_examples=10) == full[:10]
    assert firsts(seed=2) != full
    in_file_order = [tuple(tok(r["text"])["input_ids"]) for r in cls_rows(30)]
    assert full != in_file_order and sorted(full) == sorted(in_file_order)


@pytest.mark.parametrize(
    "family,cls_name,suffix",
    [
        ("bert", "BertForSequenceClassification", ".csv"),
        ("gpt2", "GPT2LMHeadModel", ".csv"),
        ("bert", "BertForMaskedLM", ".csv"),
        ("t5", "T5ForConditionalGeneration", ".csv"),
    ],
)
def test_padding_is_masked_and_never_labelled(tmp_path, tok, family, cls_name, suffix):
    g = torch.Generator().manual_seed(0)
    rows = [
        {"text": sentence(g, 1 + 3 * i), "label": i % 3, "source": sentence(g, 2 + i), "target": sentence(g, 9 - i)}
        for i in range(8)
    ]
    c = calib(make_model(family, cls_name), tok, write_rows(tmp_path / f"d{suffix}", rows), batch_size=8, seq_len=32)
    b = c.batches[0]
    pad = b["attention_mask"] == 0
    assert pad.any()
    assert (b["input_ids"][pad] == 0).all()
    if b["labels"].dim() == 2:
        if c.task == "seq2seq":
            assert (b["labels"] == -100).any()
        else:
            assert (b["labels"][pad] == -100).all()
    assert c.tokens == int(b["attention_mask"].sum())


# ----------------------------------------------------------------------------------------- bad input


def test_missing_empty_unreadable_and_odd_files(tmp_path, tok, bert_cls):
    with pytest.raises(HeadcutError, match="data file not found"):
        calib(bert_cls, tok, tmp_path / "nope.csv")
    with pytest.raises(HeadcutError, match="data file not found"):
        calib(bert_cls, tok, "nope.jsonl")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(HeadcutError, match="empty.csv is empty"):
        calib(bert_cls, tok, tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(HeadcutError, match="has no examples"):
        calib(bert_cls, tok, tmp_path / "header.csv")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(HeadcutError, match="cannot read .*broken.json: "):
        calib(bert_cls, tok, tmp_path / "broken.json")
    (tmp_path / "broken.parquet").write_text("hello")
    with pytest.raises(HeadcutError, match="cannot read .*broken.parquet: "):
        calib(bert_cls, tok, tmp_path / "broken.parquet")
    (tmp_path / "data.xlsx").write_text("x")
    with pytest.raises(HeadcutError, match="not a supported data file"):
        calib(bert_cls, tok, tmp_path / "data.xlsx")
    with pytest.raises(HeadcutError, match="is a folder"):
        calib(bert_cls, tok, tmp_path)
    with pytest.raises(HeadcutError, match="batch_size must be an integer >= 1"):
        calib(bert_cls, tok, tmp_path / "header.csv", batch_size=0)


def test_empty_texts_and_wrong_types(tmp_path, tok, bert_cls):
    p = tmp_path / "d.jsonl"
    p.write_text(
        '{"text": "good", "label": 1}\n{"text": null, "label": 0}\n{"text": "bad", "label": null}\n'
        '{"text": "fun", "label": 2}\n'
    )
    c = calib(bert_cls, tok, p, max_examples=2)  # rows with a missing value are skipped before the selection
    assert c.examples == 2 and c.notes == ["skipped 2 rows with a missing value in 'text', 'label'"]
    assert sorted(c.batches[0]["labels"].tolist()) == [1, 2]
    p.write_text('{"text": null, "label": 1}\n')
    with pytest.raises(HeadcutError, match="no usable examples"):
        calib(bert_cls, tok, p)
    p.write_text('{"text": 5, "label": 1}\n')
    with pytest.raises(HeadcutError, match="column 'text' holds int values, not text"):
        calib(bert_cls, tok, p)


def test_looks_local():
    assert looks_local("./x") and looks_local("/a/b") and looks_local("a/b/c") and looks_local("reviews.csv")
    assert looks_local("reviews.csv.gz")
    assert not looks_local("imdb") and not looks_local("glue:sst2") and not looks_local("org/name:cfg")


def test_datasets_name_offline_is_a_one_line_error(tmp_path, tok, bert_cls, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(HeadcutError, match="cannot load the datasets dataset 'glue:sst2' \\(split 'validation'\\)"):
        calib(bert_cls, tok, "glue:sst2", split="validation")
    model = save_tiny(tmp_path / "m", "bert", "BertForSequenceClassification")
    result = run("eval", model, "--data", "glue:sst2", "--split", "validation")
    one_line_error(result, "cannot load the datasets dataset 'glue:sst2'")


def test_load_tokenizer(tmp_path):
    m = save_tiny(tmp_path / "m", "bert", "BertForSequenceClassification")
    assert load_tokenizer(m)("good movie")["input_ids"] == [1, VOCAB["good"], VOCAB["movie"], 2]
    bare = save_tiny(tmp_path / "bare", "bert", "BertForSequenceClassification", tokenizer=False)
    with pytest.raises(HeadcutError, match="has no tokenizer"):
        load_tokenizer(bare)


def test_tokenizer_of_another_model_is_refused(tmp_path, tok):
    cfg = make_config("bert")
    cfg.vocab_size = 50
    model = T.BertForSequenceClassification(cfg).eval()
    p = write_rows(tmp_path / "d.csv", [{"text": "zero one two", "label": 0}, {"text": "some such", "label": 1}])
    with pytest.raises(HeadcutError, match="token id .* but the model has 50 token embeddings"):
        calib(model, tok, p)


def test_masked_lm_skips_texts_with_nothing_to_mask(tmp_path, tok):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": ""}\n{"text": "good movie"}\n')
    c = calib(make_model("bert", "BertForMaskedLM"), tok, p)
    assert c.examples == 1 and c.notes == ["skipped 1 example without tokens to score"]


# ----------------------------------------------------------------------------- datasets given in memory


def same_batches(a: Calibration, b: Calibration) -> bool:
    return len(a.batches) == len(b.batches) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a.batches, b.batches)
    )


def test_in_memory_dataset_gives_the_same_batches_as_a_file(tmp_path, tok, bert_cls):
    import datasets

    rows = cls_rows(20)
    kw: dict[str, Any] = {"batch_size": 8, "seed": 3, "max_examples": 15}
    from_file = calib(bert_cls, tok, write_rows(tmp_path / "d.csv", rows), **kw)
    c = load_calibration(bert_cls, tok, DataConfig(path="", **kw), dataset=datasets.Dataset.from_list(rows))
    assert same_batches(c, from_file)
    assert c.source == "<datasets.Dataset of 20 rows>" and c.to_json()["source"] == c.source
    assert (c.examples, c.columns, c.notes, c.tokens, c.scored_tokens) == (
        from_file.examples,
        from_file.columns,
        from_file.notes,
        from_file.tokens,
        from_file.scored_tokens,
    )
    # config.path is ignored; a dataset formatted for torch is read as plain values
    torch_ds = datasets.Dataset.from_list(rows).with_format("torch")
    assert same_batches(load_calibration(bert_cls, tok, DataConfig(path="nope.csv", **kw), dataset=torch_ds), c)


def test_in_memory_list_of_rows_and_other_tasks(tmp_path, tok):
    g = torch.Generator().manual_seed(0)
    rows = [{"text": sentence(g, 2 + i % 6), "source": sentence(g, 3), "target": sentence(g, 4)} for i in range(12)]
    for family, cls_name in (
        ("bert", "BertForMaskedLM"),
        ("gpt2", "GPT2LMHeadModel"),
        ("t5", "T5ForConditionalGeneration"),
    ):
        model = make_model(family, cls_name)
        from_file = calib(model, tok, write_rows(tmp_path / "d.jsonl", rows), batch_size=5, seq_len=16)
        c = load_calibration(model, tok, DataConfig(path="", batch_size=5, seq_len=16), dataset=rows)
        assert same_batches(c, from_file), cls_name
        assert c.source == "<list of 12 rows>" and c.references == from_file.references
    # a causal LM gets one example per row from memory (blocks are cut from .txt files only)
    c = load_calibration(
        make_model("gpt2", "GPT2LMHeadModel"),
        tok,
        DataConfig(path="", seq_len=64),
        dataset=[{"text": "good movie"}, {"text": "bad plot and dull actor"}],
    )
    assert c.examples == 2 and sorted(int(m.sum()) for m in c.batches[0]["attention_mask"]) == [4, 7]


def test_in_memory_dataset_dict_uses_the_split(tok, bert_cls):
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(cls_rows(20)),
            "validation": datasets.Dataset.from_list(cls_rows(6, seed=1)),
        }
    )
    c = load_calibration(bert_cls, tok, DataConfig(path="", split="validation"), dataset=dd)
    assert c.examples == 6 and c.source == "<datasets.DatasetDict['validation'] of 6 rows>"
    assert load_calibration(bert_cls, tok, DataConfig(path=""), dataset=dd).examples == 20
    with pytest.raises(HeadcutError, match=r"DatasetDict has no split 'test' \(its splits: 'train', 'validation'\)"):
        load_calibration(bert_cls, tok, DataConfig(path="", split="test"), dataset=dd)


@pytest.mark.parametrize(
    "bad,message",
    [
        (42, "dataset must be a datasets.Dataset, a datasets.DatasetDict or a list of dict rows, not int"),
        ("reviews.csv", "a list of dict rows, not str"),
        ({"text": ["good"], "label": [1]}, "a list of dict rows, not dict"),
        ([], "the list of rows is empty"),
        ([{"text": "good", "label": 1}, "bad"], "dataset rows must be dicts \\(column -> value\\); row 2 is str"),
        ([{"text": "good", "label": 1}, {"text": 5, "label": "x"}], "cannot make a dataset of the list of rows: "),
        ("empty-dataset", "<datasets.Dataset of 0 rows> has no examples"),
        ("no-text-column", "<list of 1 row> has no text column"),
    ],
)
def test_bad_in_memory_datasets_are_one_line_errors(tok, bert_cls, bad, message):
    import datasets

    if bad == "empty-dataset":
        bad = datasets.Dataset.from_dict({"text": [], "label": []})
    elif bad == "no-text-column":
        bad = [{"words": "good", "label": 1}]
    with pytest.raises(HeadcutError, match=message) as info:
        load_calibration(bert_cls, tok, DataConfig(path=""), dataset=bad)
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(HeadcutError, match="no data given"):  # without a dataset the path is still needed
        load_calibration(bert_cls, tok, DataConfig(path=""))


# ------------------------------------------------------------------------------------ package layout


def test_light_modules_import_no_heavy_packages():
    import subprocess
    import sys

    import headcut.data

    src = Path(headcut.data.__file__).parents[1]  # headcut/ itself imports torch: load only the light modules
    code = (
        "import sys, types; pkg = types.ModuleType('headcut'); pkg.__path__ = [%r]; sys.modules['headcut'] = pkg\n"
        "import headcut.sources, headcut.data.config\n"
        "from headcut.data import DataConfig, looks_local, TEXT_COLUMNS, COMPRESSIONS, FILE_FORMATS\n"
        "heavy = [m for m in ('torch', 'transformers', 'datasets', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from headcut.data import Calibration, load_calibration\n"
        "assert 'torch' in sys.modules and Calibration.__module__ == 'headcut.data.tasks'\n"
    ) % str(src)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_file_formats_match_the_suffixes_of_sources():
    from headcut.data.config import COMPRESSIONS, FILE_FORMATS
    from headcut.sources import COMPRESSIONS as SOURCE_COMPRESSIONS
    from headcut.sources import DATA_SUFFIXES

    assert tuple(FILE_FORMATS) == DATA_SUFFIXES and COMPRESSIONS == SOURCE_COMPRESSIONS
