"""`headcut eval --lm-eval`: lm-evaluation-harness on the model headcut loads, tested with a local multiple-choice
task (a task YAML over a jsonl file written here; the harness's own datasets need the Hub). The accuracy the
harness reports is checked against the model's own log-likelihoods of the choices, computed here.

The whole module is skipped when lm_eval is not importable (it comes with the extras ``lm-eval`` and ``test``);
the refusal without it is tested in tests/test_windows.py, which runs either way."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
import transformers as T
from helpers import VOCAB, WORDS, cls_rows, one_line_error, run, save_tiny, write_rows
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

pytest.importorskip("lm_eval")

import headcut  # noqa: E402

TASK = "headcut_choices"
N = 12


def bos_tokenizer() -> T.PreTrainedTokenizerFast:
    """The tiny models' word-level vocabulary with a Llama-like template: a BOS ([CLS]) before the text, nothing
    after it (the harness splits context and continuation of ``tokenizer(context + continuation)``)."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", 1)])
    return T.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[CLS]", eos_token="[SEP]"
    )


def loglikelihood(model, tok, context: str, choice: str) -> float:
    """log p(" " + choice | context) under ``model``, split as the harness splits it."""
    whole = tok(context + " " + choice)["input_ids"]
    start = len(tok(context)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].float(), -1)
    return float(sum(logp[j - 1, whole[j]] for j in range(start, len(whole))))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny random Llama with the BOS tokenizer, and a task folder: 12 questions with 3 choices each whose
    labels are the model's own best choice for the first 9 and its worst for the last 3 (accuracy 9/12)."""
    root = tmp_path_factory.mktemp("lm-eval")
    folder = save_tiny(root / "llama", "llama", "LlamaForCausalLM", tokenizer=False)
    tok = bos_tokenizer()
    tok.save_pretrained(folder)
    model = headcut.load(folder)
    rng = random.Random(7)
    words = WORDS[:60]
    rows, by_hand = [], []
    for i in range(N):
        question = " ".join(rng.choice(words) for _ in range(5))
        choices = [" ".join(rng.choice(words) for _ in range(1 + (i + c) % 3)) for c in range(3)]
        lls = [loglikelihood(model, tok, question, c) for c in choices]
        best, worst = max(range(3), key=lls.__getitem__), min(range(3), key=lls.__getitem__)
        assert best != worst
        label = best if i < 9 else worst
        rows.append({"question": question, "choices": choices, "label": label})
        by_hand.append((lls, choices, label))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / f"{TASK}.yaml").write_text(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tasks / "data.jsonl"}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
""")
    return folder, tasks, by_hand


def expected(by_hand, first: int | None = None) -> tuple[float, float]:
    """(acc, acc_norm) of the model's choices: the highest log-likelihood, and the highest per character."""
    rows = by_hand[:first] if first is not None else by_hand
    acc = sum(max(range(3), key=lls.__getitem__) == label for lls, _, label in rows) / len(rows)
    norm = sum(max(range(3), key=lambda c: lls[c] / len(choices[c])) == label for lls, choices, label in rows)
    return acc, norm / len(rows)


def test_the_harness_reports_the_accuracy_of_the_models_own_choices(setup):
    folder, tasks, by_hand = setup
    random.seed(123)
    torch.manual_seed(123)
    before = (random.getstate(), torch.get_rng_state())
    ev = headcut.evaluate(str(folder), lm_eval=TASK, lm_eval_include=str(tasks), lm_eval_batch_size=4)
    # the harness seeds the global generators: headcut gives them back as they were
    assert random.getstate() == before[0] and torch.equal(torch.get_rng_state(), before[1])
    entry = ev.lm_eval.tasks[TASK]
    acc, acc_norm = expected(by_hand)
    assert acc == 9 / 12
    assert entry["metrics"]["acc"]["value"] == pytest.approx(acc)
    assert entry["metrics"]["acc_norm"]["value"] == pytest.approx(acc_norm)
    # the harness's standard error of a mean of 0/1 outcomes: sqrt(p (1 - p) / (n - 1))
    assert entry["metrics"]["acc"]["stderr"] == pytest.approx(math.sqrt(acc * (1 - acc) / (N - 1)))
    assert (entry["samples"], entry["num_fewshot"], entry["group"]) == (N, 0, False)
    assert entry["higher_is_better"] == {"acc": True, "acc_norm": True}
    assert ev.report["lm_eval"]["settings"]["batch_size"] == 4 and ev.report["lm_eval"]["version"].startswith("0.4.")
    assert ev.result is None and ev.data is None
    with pytest.raises(headcut.HeadcutError, match="lm-eval only"):
        _ = ev.value


def test_cli_and_python_agree_and_the_options_reach_the_harness(setup, tmp_path):
    folder, tasks, by_hand = setup
    result = run(
        "eval",
        folder,
        "--lm-eval",
        TASK,
        "--lm-eval-include",
        tasks,
        "--lm-eval-limit",
        5,
        "--json",
        tmp_path / "r.json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads((tmp_path / "r.json").read_text())
    entry = out["lm_eval"]["tasks"][TASK]
    assert entry["samples"] == 5  # the first five questions: all labelled with the model's best choice
    assert entry["metrics"]["acc"]["value"] == pytest.approx(expected(by_hand, first=5)[0]) == 1.0
    assert TASK in result.stdout and "acc_norm" in result.stdout and "lm-evaluation-harness 0.4." in result.stdout
    assert "--lm-eval-limit 5" in result.stderr  # the note: not the full set
    py = headcut.evaluate(str(folder), lm_eval=[TASK], lm_eval_include=str(tasks), lm_eval_limit=5)
    assert py.lm_eval.tasks[TASK]["metrics"] == entry["metrics"]
    shots = run("eval", folder, "--lm-eval", TASK, "--lm-eval-include", tasks, "--lm-eval-fewshot", 1, "--json", "-")
    assert shots.exit_code == 0, shots.output
    one_shot = json.loads(shots.stdout)["lm_eval"]["tasks"][TASK]
    assert one_shot["num_fewshot"] == 1 and one_shot["samples"] == N
    assert 0.0 <= one_shot["metrics"]["acc"]["value"] <= 1.0


def test_perplexity_windows_and_the_harness_in_one_run(setup, tmp_path):
    folder, tasks, by_hand = setup
    book = tmp_path / "book.txt"
    book.write_text("\n".join(" ".join(WORDS[(7 * i + j) % 90] for j in range(9)) for i in range(30)))
    result = run(
        "eval",
        folder,
        "--data",
        book,
        "--windows",
        "16,32",
        "--lm-eval",
        TASK,
        "--lm-eval-include",
        tasks,
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["perplexity"]) == {"16", "32"}
    assert out["lm_eval"]["tasks"][TASK]["metrics"]["acc"]["value"] == pytest.approx(expected(by_hand)[0])
    alone = headcut.evaluate(str(folder), str(book), windows="16,32")
    assert out["perplexity"] == pytest.approx(alone.report["perplexity"])


def test_refusals_before_the_harness_runs(setup, tmp_path):
    folder, tasks, _ = setup
    one_line_error(
        run("eval", folder, "--lm-eval", "headcut_choice", "--lm-eval-include", tasks),
        "unknown lm-eval task 'headcut_choice'",
        f"did you mean {TASK}",
    )
    one_line_error(run("eval", folder, "--lm-eval", "headcut_nothing_like_it"), "--lm-eval-include DIR")
    cls_dir = save_tiny(tmp_path / "cls", "bert", "BertForSequenceClassification")
    one_line_error(
        run("eval", cls_dir, "--lm-eval", TASK, "--lm-eval-include", tasks),
        "--lm-eval runs a causal LM or a seq2seq LM; this model has a classification head",
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad.yaml").write_text(
        f"task: headcut_broken\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'missing.jsonl'}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: x\ndoc_to_choice: '{{c}}'\n"
        "doc_to_target: 0\n"
    )
    data = write_rows(tmp_path / "d.csv", cls_rows(4))
    one_line_error(
        run("eval", folder, "--lm-eval", "headcut_broken", "--lm-eval-include", broken, "--data", data),
        "lm-eval cannot load task 'headcut_broken'",
    )
