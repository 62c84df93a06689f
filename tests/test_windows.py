"""`headcut eval --windows`: a causal LM's perplexity over non-overlapping windows of the whole text, against
the same numbers computed here by hand; datasets names joined as the papers join wikitext-2; the window in the
output and the report; the refusals, alike from the command line and Python."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers as T
from helpers import VOCAB, cls_rows, make_model, one_line_error, run, save_tiny, sentence, write_rows
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

import headcut
import headcut.jobs.evaluate
from headcut.errors import HeadcutError


def line_tokenizer() -> T.PreTrainedTokenizerFast:
    """The tiny models' word-level vocabulary, with every line break a token of its own ([UNK], id 3): how rows
    are joined shows in the tokens. [CLS] (the BOS) before a text, [SEP] after it."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex("\n"), behavior="isolated"), pre_tokenizers.Split(" ", behavior="removed")]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    return T.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
    )


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny Llama (64 positions) saved with the line tokenizer, and the text of a book."""
    root = tmp_path_factory.mktemp("windows")
    folder = save_tiny(root / "llama", "llama", "LlamaForCausalLM", tokenizer=False)
    line_tokenizer().save_pretrained(folder)
    g = torch.Generator().manual_seed(5)
    book = root / "book.txt"
    book.write_text("\n".join(sentence(g, 3 + i % 7) for i in range(40)) + "\n")
    return folder, book


def by_hand(
    model, ids: list[int], window: int, first: int | None = None, prefix: tuple[int, ...] = (1,)
) -> tuple[float, int, int]:
    """(perplexity, windows, scored tokens) of the text's tokens ``ids`` (no special tokens) cut into
    non-overlapping windows, one forward each, every window read after ``prefix`` (the tokenizer's [CLS], the
    BOS: every token of the window predicted) or, without one, its first token context only; the loss the model
    itself computes (its mean over the window's predictions)."""
    count = len(ids) // window if first is None else first
    predicted = window if prefix else window - 1
    total = 0.0
    with torch.no_grad():
        for k in range(count):
            x = torch.tensor([[*prefix, *ids[k * window : (k + 1) * window]]])
            labels = x.clone()
            labels[:, : len(prefix)] = -100
            total += float(model(input_ids=x, labels=labels).loss) * predicted
    return math.exp(total / (count * predicted)), count, count * predicted


def test_perplexity_at_each_window_is_exp_of_the_mean_nll_over_its_windows(lm):
    folder, book = lm
    model = headcut.load(folder)
    tok = line_tokenizer()
    ids = tok(book.read_text().removesuffix("\n"), add_special_tokens=False)["input_ids"]  # the whole text, once
    assert 1 not in ids and 2 not in ids and ids.count(3) == 39  # a [UNK] per line break
    assert tok("x")["input_ids"][0] == 1  # the tokenizer starts every text with [CLS]: every window read after it
    ev = headcut.evaluate(folder, str(book), windows="16,48", data_options={"batch_size": 3, "seq_len": 16})
    assert list(ev.windows) == [16, 48] and ev.result is ev.windows[16]
    for window in (16, 48):
        ppl, count, scored = by_hand(model, ids, window)
        got = ev.windows[window]
        assert got.metrics["perplexity"] == pytest.approx(ppl, rel=1e-5)
        assert got.metrics["loss"] == pytest.approx(math.log(ppl), rel=1e-5)
        assert (got.examples, got.metrics["tokens"]) == (count, scored)
        assert ev.report["perplexity"][str(window)] == got.metrics["perplexity"]
        assert ev.report["data"]["windows"][str(window)]["windows"] == count
    assert [w["window"] for w in ev.report["windows"]] == [16, 48]
    assert ev.report["data"]["text_tokens"] == len(ids) and ev.report["data"]["rows_joined"] is None
    assert ev.report["data"]["window_prefix"] == [1]
    # the batches only size the forwards: 3 x 16 tokens per forward, or everything at once
    assert ev.report["data"]["windows"]["16"]["windows_per_batch"] == 3
    assert ev.report["data"]["windows"]["48"]["windows_per_batch"] == 1
    once = headcut.evaluate(folder, str(book), windows=[48, 16], data_options={"batch_size": 64})
    assert list(once.windows) == [48, 16]
    for window in (16, 48):
        assert once.windows[window].metrics["perplexity"] == pytest.approx(
            ev.windows[window].metrics["perplexity"], rel=1e-5
        )
    # the blocks of --seq-len differ: the tokenizer's [CLS] ... [SEP] in every block
    blocks = headcut.evaluate(folder, str(book), data_options={"seq_len": 16})
    assert blocks.report["data"]["layout"] == "blocks"
    assert blocks.value != pytest.approx(ev.windows[16].value, rel=1e-4)


def test_max_examples_takes_the_first_windows_of_each_length(lm):
    folder, book = lm
    model = headcut.load(folder)
    ids = line_tokenizer()(book.read_text().removesuffix("\n"), add_special_tokens=False)["input_ids"]
    ev = headcut.evaluate(folder, str(book), windows=(8, 24), data_options={"max_examples": 2})
    for window in (8, 24):
        ppl, count, scored = by_hand(model, ids, window, first=2)
        assert ev.windows[window].metrics["perplexity"] == pytest.approx(ppl, rel=1e-5)
        assert ev.windows[window].examples == 2
    assert ev.report["data"]["text_tokens"] == 48 and not ev.report["data"]["complete"]
    assert any("read the first 48 tokens" in n for n in ev.notes)


def wikitext_rows(n: int = 30) -> list[dict]:
    """Rows shaped like wikitext-2's: empty rows, headings, lines ending in ' \\n'."""
    g = torch.Generator().manual_seed(2)
    rows = [{"text": ""}, {"text": " = the story = \n"}, {"text": ""}]
    rows += [{"text": " " + sentence(g, 4 + i % 9) + " \n"} for i in range(n)]
    return rows + [{"text": ""}]


def test_a_datasets_name_is_joined_as_the_papers_join_wikitext(lm, monkeypatch):
    import datasets

    folder, _ = lm
    rows = wikitext_rows()
    asked = []

    def load_dataset(name, config=None, split=None, **kwargs):
        asked.append((name, config, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    model = headcut.load(folder)
    tok = line_tokenizer()
    ids = tok("\n\n".join(r["text"] for r in rows), add_special_tokens=False)["input_ids"]
    assert ids != tok(" ".join(r["text"] for r in rows), add_special_tokens=False)["input_ids"]  # line breaks
    result = run(
        "eval", folder, "--data", "wikitext:wikitext-2-raw-v1", "--split", "test", "--windows", "16,32", "--json", "-"
    )
    assert result.exit_code == 0, result.output
    assert asked == [("wikitext", "wikitext-2-raw-v1", "test")]
    out = json.loads(result.stdout)
    assert out["data"]["source"] == "wikitext:wikitext-2-raw-v1[test]" and out["data"]["rows_joined"] == len(rows)
    assert out["data"]["joined_with"] == "\n\n" and out["data"]["text_tokens"] == len(ids)
    for window in (16, 32):
        ppl, count, scored = by_hand(model, ids, window)
        assert out["perplexity"][str(window)] == pytest.approx(ppl, rel=1e-5)
        entry = next(w for w in out["windows"] if w["window"] == window)
        assert (entry["examples"], entry["metrics"]["tokens"]) == (count, scored)
    # the window is in the human output (stderr under --json -) and the same from Python, on the rows in memory
    assert "16 tokens" in result.stderr and "32 tokens" in result.stderr and "non-overlapping" in result.stderr
    ev = headcut.evaluate(folder, datasets.Dataset.from_list(rows), windows="16,32")
    assert ev.report["perplexity"] == pytest.approx(out["perplexity"])


def test_the_human_output_states_the_window_and_the_blocks(lm, tmp_path):
    folder, book = lm
    result = run("eval", folder, "--data", book, "--windows", "16,48")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any("16 tokens" in ln for ln in lines) and any("48 tokens" in ln for ln in lines)
    assert "perplexity" in result.stdout and "non-overlapping windows" in result.stdout
    plain = run("eval", folder, "--data", book, "--seq-len", 16)
    assert plain.exit_code == 0 and "blocks of 16 tokens" in plain.stdout
    table = write_rows(
        tmp_path / "rows.csv", [{"text": sentence(torch.Generator().manual_seed(i), 6)} for i in range(4)]
    )
    rows = run("eval", folder, "--data", table, "--seq-len", 16)
    assert rows.exit_code == 0 and "one example per row, at most 16 tokens" in rows.stdout


# (command-line arguments after MODEL, the same request in Python, what the refusal says, keyword form)
BAD = [
    (
        ["--data", "BOOK", "--windows", "16,x"],
        dict(data="BOOK", windows="16,x"),
        "{windows} takes window lengths of at least 2 tokens",
    ),
    (["--data", "BOOK", "--windows", "1"], dict(data="BOOK", windows=1), "{windows} takes window lengths"),
    (
        ["--data", "BOOK", "--windows", "128"],
        dict(data="BOOK", windows=128),
        "{windows} 128 is longer than the model's 64 positions",
    ),
    ([], dict(), "nothing to evaluate: give {data}"),
    (
        ["--data", "BOOK", "--lm-eval-limit", "3"],
        dict(data="BOOK", lm_eval_limit=3),
        "{lm_eval_limit} applies to {lm_eval} TASKS",
    ),
    (
        ["--data", "BOOK", "--lm-eval-batch-size", "4"],
        dict(data="BOOK", lm_eval_batch_size=4),
        "{lm_eval_batch_size} applies to {lm_eval} TASKS",
    ),
    (["--data", "BOOK", "--device", "tpu"], dict(data="BOOK", device="tpu"), "unknown {device} 'tpu'"),
    (["--lm-eval", " , "], dict(lm_eval=" , "), "{lm_eval} names no task"),
    (
        ["--lm-eval", "x", "--lm-eval-include", "BOOK"],
        dict(lm_eval="x", lm_eval_include="BOOK"),
        "{lm_eval_include} BOOK: not a folder",
    ),
]
FLAGS = {
    "data": "--data",
    "windows": "--windows",
    "lm_eval": "--lm-eval",
    "lm_eval_limit": "--lm-eval-limit",
    "lm_eval_batch_size": "--lm-eval-batch-size",
    "device": "--device",
    "lm_eval_include": "--lm-eval-include",
}


@pytest.mark.parametrize("args,kwargs,says", BAD, ids=[" ".join(a[-2:]) or "nothing" for a, _, _ in BAD])
def test_a_bad_request_gets_the_same_refusal_from_cli_and_python(lm, monkeypatch, args, kwargs, says):
    folder, book = lm

    def put(value):
        return str(book) if value == "BOOK" else value

    if "128" not in args:  # refused before the model is loaded
        monkeypatch.setattr(headcut.jobs.evaluate, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    cli = one_line_error(run("eval", folder, *[put(a) for a in args])).removeprefix("error: ")
    with pytest.raises(HeadcutError) as caught:
        headcut.evaluate(str(folder), **{k: put(v) for k, v in kwargs.items()})
    as_keywords = says.format(**{k: k for k in FLAGS}).replace("BOOK", str(book))
    as_flags = says.format(**FLAGS).replace("BOOK", str(book))
    assert as_keywords in str(caught.value), str(caught.value)
    assert as_flags in cli, cli


def test_windows_need_data_and_a_causal_lm(lm, tmp_path):
    folder, book = lm
    with pytest.raises(HeadcutError, match="windows needs data"):
        headcut.evaluate(str(folder), windows=16, lm_eval="anything")
    cls_dir = save_tiny(tmp_path / "cls", "bert", "BertForSequenceClassification")
    data = write_rows(tmp_path / "d.csv", cls_rows(6))
    one_line_error(
        run("eval", cls_dir, "--data", data, "--windows", "16"),
        "--windows measures the perplexity of a causal LM; this model has a classification head",
    )
    short = tmp_path / "short.txt"
    short.write_text("the movie was good\n")
    one_line_error(
        run("eval", folder, "--data", short, "--windows", "4,32"),
        "has 4 tokens, shorter than one window of 32 (--windows)",
    )
    # a window is read after the tokenizer's BOS: one position more than the window (the tiny Llama has 64)
    one_line_error(
        run("eval", folder, "--data", book, "--windows", "64"),
        "--windows 64: each window is read after the 1 token the tokenizer puts before a text (its BOS), 65 "
        "positions, longer than the model's 64; give at most 63",
    )
    assert headcut.evaluate(str(folder), str(book), windows=63).windows[63].metrics["tokens"] == 63 * (
        len(line_tokenizer()(book.read_text().removesuffix("\n"), add_special_tokens=False)["input_ids"]) // 63
    )
    model = make_model("llama", "LlamaForCausalLM")  # a module: the tokenizer comes from tokenizer=
    ev = headcut.evaluate(model, str(book), tokenizer=line_tokenizer(), windows=16)
    assert ev.windows[16].examples == ev.report["data"]["text_tokens"] // 16


def test_lm_eval_without_the_harness_installed_is_a_one_line_refusal(lm, monkeypatch):
    import importlib.util

    folder, book = lm
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else find_spec(name, *a)
    )
    monkeypatch.setattr(headcut.jobs.evaluate, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    one_line_error(
        run("eval", folder, "--lm-eval", "default"),
        "--lm-eval needs lm-evaluation-harness, which is not installed: pip install 'headcut[lm-eval]'",
    )
    with pytest.raises(HeadcutError, match=r"lm_eval needs lm-evaluation-harness.*pip install 'headcut\[lm-eval\]'"):
        headcut.evaluate(str(folder), str(book), lm_eval="boolq,piqa")


def test_the_benchmark_page_reads_its_windows_as_the_command_does(lm):
    """Issue 70: the page's perplexity (benchmarks/harness/perplexity.py) and headcut eval --windows read every
    window after the tokenizer's BOS, with one function (headcut.data.windows.window_tensors): the same numbers."""
    from benchmarks.harness.perplexity import perplexity

    folder, book = lm
    model = headcut.load(folder)
    ids = line_tokenizer()(book.read_text().removesuffix("\n"), add_special_tokens=False)["input_ids"]
    ev = headcut.evaluate(folder, str(book), windows="16,48")
    for window in (16, 48):
        page = perplexity(model, torch.tensor(ids), window, tokens_per_batch=32, bos=1)
        assert page == pytest.approx(ev.windows[window].value, rel=1e-5)
        assert page == pytest.approx(by_hand(model, ids, window)[0], rel=1e-5)
        # without the BOS, every window measures its absence: another number
        assert perplexity(model, torch.tensor(ids), window) != pytest.approx(page, rel=1e-3)
