"""Distillation from the unpruned model during learned-gate training (``--alpha``/``--temperature``)
and the teacher cache shared with ``finetune``."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import cls_rows, make_batch, make_model, one_line_error, run, save_tiny, write_rows

from headcut.data import Calibration, detect_task, load_tokenizer
from headcut.errors import HeadcutError
from headcut.model.loading import load as headcut_load
from headcut.pruning import PruneConfig, plan_prune
from headcut.training.finetuning import TeacherCache


def calibration(model, n: int = 3) -> Calibration:
    return Calibration(
        task=detect_task(model),
        batches=[make_batch(model, seed=i) for i in range(n)],
        examples=3 * n,
        source="random",
        columns={},
    )


def test_alpha_zero_is_the_papers_loss_exactly():
    a, b = make_model("bert", "BertForSequenceClassification"), make_model("bert", "BertForSequenceClassification")
    ra = plan_prune(a, calibration(a), PruneConfig(method="pass", keep=3), {"max_steps": 4, "lr": 1e-3})
    rb = plan_prune(b, calibration(b), PruneConfig(method="pass", keep=3), {"max_steps": 4, "lr": 1e-3, "alpha": 0.0})
    assert ra.mask.keep == rb.mask.keep
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert "kl" not in ra.training.history[-1] and ra.training.distillation is None


def test_distillation_changes_training_and_runs_the_teacher_once_per_batch():
    plain, kd = make_model("bert", "BertForSequenceClassification"), make_model("bert", "BertForSequenceClassification")
    base = {"epochs": 2, "lr": 1e-3}
    plan_prune(plain, calibration(plain), PruneConfig(method="dsp", keep=3), base)
    result = plan_prune(kd, calibration(kd), PruneConfig(method="dsp", keep=3), dict(base, alpha=0.7, temperature=3.0))
    run_ = result.training
    assert all("kl" in e and e["kl"] >= 0 for e in run_.history if "loss" in e)
    # 3 distinct batches, 2 epochs: three teacher forwards (plus the check), the second epoch from the cache
    assert run_.distillation["teacher_forwards"] == 3 and run_.distillation["cache_hits"] == 3
    assert run_.distillation["alpha"] == 0.7 and run_.distillation["temperature"] == 3.0
    assert any(not torch.equal(x, y) for x, y in zip(plain.state_dict().values(), kd.state_dict().values()))
    assert run_.to_json()["distillation"]["cached_bytes"] > 0


def test_teacher_cache_gives_the_teachers_logits_once_per_batch():
    """The cached logits are the teacher's own; a second call is a hit; past the byte budget they are
    recomputed, not kept."""
    model = make_model("bert", "BertForSequenceClassification")
    cal = calibration(model, n=1)
    with torch.no_grad():
        expected = model(**{k: v for k, v in cal.batches[0].items() if k != "labels"}).logits
    cache = TeacherCache(model, cal.task)
    got = cache.logits(cal.batches[0])
    assert torch.allclose(got, expected) and cache.forwards == 1
    assert torch.equal(cache.logits(cal.batches[0]), got) and cache.hits == 1
    small = TeacherCache(model, cal.task, budget_bytes=0)
    small.logits(cal.batches[0])
    small.logits(cal.batches[0])
    assert small.forwards == 2 and small.hits == 0 and small.bytes == 0


def test_distillation_refusals():
    model = make_model("bert", "BertForSequenceClassification")
    cal = calibration(model)
    with pytest.raises(HeadcutError, match="alpha must be in"):
        plan_prune(model, cal, PruneConfig(method="pass", keep=3), {"alpha": 1.5})
    with pytest.raises(HeadcutError, match="temperature must be positive"):
        plan_prune(model, cal, PruneConfig(method="pass", keep=3), {"alpha": 0.5, "temperature": 0.0})
    with pytest.raises(HeadcutError, match="alpha does not apply to michel"):
        plan_prune(model, cal, PruneConfig(method="michel", keep=3), {"alpha": 0.5})


def test_cli_prune_with_alpha_reports_the_distillation(tmp_path):
    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    result = run(
        "prune",
        src,
        "--method",
        "pass",
        "--keep",
        "5",
        "--data",
        train,
        "--max-steps",
        "3",
        "--alpha",
        "0.5",
        "--out",
        tmp_path / "o",
        "--json",
        tmp_path / "r.json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["training"]["distillation"]["alpha"] == 0.5
    # 24 rows in 2 batches of 16 and 8, 3 steps: the third step's teacher logits come from the cache
    assert report["training"]["distillation"]["teacher_forwards"] == 2
    assert report["training"]["distillation"]["cache_hits"] == 1
    bad = run("prune", src, "--method", "pass", "--keep", "5", "--data", train, "--alpha", "2", "--out", tmp_path / "p")
    one_line_error(bad, "--alpha must be in [0, 1]")


def test_recover_steps_fine_tune_the_cut_model_from_the_unpruned_one(tmp_path):
    import headcut

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=1))
    cut_only = headcut.prune(src, "magnitude", keep=4, eval_data=dev)
    recovered = headcut.prune(src, "magnitude", keep=4, data=train, eval_data=dev, recover_steps=3)
    assert recovered.mask.keep == cut_only.mask.keep  # the same cut, then trained
    report = recovered.report
    assert report["recovery"]["steps"] == 3 and len(report["recovery"]["curve"]) == 3
    assert all("kl" in e for e in report["recovery"]["curve"])
    assert report["metric"]["after_pruning"] == pytest.approx(cut_only.report["metric"]["after"])
    assert not any("reads no data" in n for n in report["notes"])
    recovered.save(tmp_path / "o")
    again = headcut.evaluate(tmp_path / "o", dev)
    assert again.value == pytest.approx(report["metric"]["after"])
    changed = [k for k, v in recovered.model.state_dict().items() if not torch.equal(v, cut_only.model.state_dict()[k])]
    assert changed
    with pytest.raises(HeadcutError, match="recover_steps trains the pruned model: it needs data"):
        headcut.prune(src, "magnitude", keep=4, recover_steps=2)
    result = run(
        "prune",
        src,
        "--method",
        "magnitude",
        "--keep",
        "4",
        "--data",
        train,
        "--eval-data",
        dev,
        "--recover-steps",
        "2",
        "--out",
        tmp_path / "p",
    )
    assert result.exit_code == 0, result.output
    assert "recovery: 2 steps distilled from the unpruned model" in result.stdout


def test_unlabelled_inputs_load_without_labels_and_are_distilled_alone(tmp_path):
    """load_calibration(unlabelled=True) reads a text-only file (batches without labels; a label column is not
    read), refuses a seq2seq model; DistillationLoss learns such a batch from the teacher alone (T^2 KL whatever
    alpha) and refuses it without a teacher."""
    from headcut.data import DataConfig, load_calibration
    from headcut.training.finetuning import DistillationLoss, distillation_kl, frozen_teacher

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    model = headcut_load(src)
    tok = load_tokenizer(str(src))
    texts = write_rows(tmp_path / "texts.csv", [{"text": r["text"]} for r in cls_rows(10)])
    cal = load_calibration(model, tok, DataConfig(path=str(texts), batch_size=4), unlabelled=True)
    assert cal.examples == 10 and len(cal.batches) == 3 and all("labels" not in b for b in cal.batches)
    assert cal.scored_tokens == 10 and "label" not in cal.columns
    labelled = write_rows(tmp_path / "labelled.csv", cls_rows(10))
    same = load_calibration(model, tok, DataConfig(path=str(labelled), batch_size=4), unlabelled=True)
    assert all(
        torch.equal(a["input_ids"], b["input_ids"]) and "labels" not in b for a, b in zip(cal.batches, same.batches)
    )
    with pytest.raises(HeadcutError, match="label"):
        load_calibration(model, tok, DataConfig(path=str(texts), batch_size=4))
    t5 = save_tiny(tmp_path / "t5", "t5", "T5ForConditionalGeneration")
    with pytest.raises(HeadcutError, match="seq2seq model: the teacher's outputs are read at the target tokens"):
        load_calibration(headcut_load(t5), load_tokenizer(str(t5)), DataConfig(path=str(texts)), unlabelled=True)

    student = make_model("bert", "BertForSequenceClassification", seed=1)
    teacher = frozen_teacher(model)
    batch = cal.batches[0]
    for alpha in (0.0, 0.5):
        loss, logs = DistillationLoss("classification", teacher, alpha, 2.0)(student, batch, 0)
        with torch.no_grad():
            kl = distillation_kl(student(**batch).logits, teacher(**batch).logits, "classification", None, 2.0)
        assert float(loss.detach()) == pytest.approx(4.0 * float(kl), rel=1e-5) and "task_loss" not in logs
    with pytest.raises(HeadcutError, match="inputs without labels can only be distilled from a teacher"):
        DistillationLoss("classification", None, 0.5, 2.0)(student, batch, 0)


def test_recover_data_adds_unlabelled_rows_to_the_recovery(tmp_path):
    import headcut

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=1))
    extra = write_rows(tmp_path / "extra.csv", [{"text": r["text"]} for r in cls_rows(16, seed=2)])
    options = {"batch_size": 4}
    plain = headcut.prune(src, "magnitude", keep=4, data=train, eval_data=dev, recover_steps=10, data_options=options)
    more = headcut.prune(
        src, "magnitude", keep=4, data=train, eval_data=dev, recover_steps=10, data_options=options, recover_data=extra
    )
    recovery = more.report["recovery"]
    assert recovery["recover_data"]["examples"] == 16 and recovery["config"]["alpha"] == 1.0
    assert plain.report["recovery"]["config"]["alpha"] == 0.5 and "recover_data" not in plain.report["recovery"]
    # few labelled rows and no --recover-data: the note says what helped on small data; with it, no note
    assert any("data: 24 labelled examples" in n and "--recover-data" in n for n in plain.report["notes"])
    assert not any("labelled examples" in n for n in more.report["notes"])
    # one epoch of 6 labelled and 4 unlabelled batches: the 4 have no task loss
    assert sum("task_loss" not in e for e in recovery["curve"]) == 4
    assert all("task_loss" in e for e in plain.report["recovery"]["curve"])
    assert more.mask.keep == plain.mask.keep
    assert any(not torch.equal(v, plain.model.state_dict()[k]) for k, v in more.model.state_dict().items())
    more.save(tmp_path / "o")
    assert headcut.evaluate(tmp_path / "o", dev).value == pytest.approx(more.report["metric"]["after"])
    assert "16 unlabelled rows" in (tmp_path / "o" / "README.md").read_text()

    with pytest.raises(HeadcutError, match="recover_data is read by the recovery fine-tuning: it needs recover_steps"):
        headcut.prune(src, "magnitude", keep=4, data=train, recover_data=extra)
    with pytest.raises(HeadcutError, match="recover_data and eval_data are the same data"):
        headcut.prune(src, "magnitude", keep=4, data=train, eval_data=dev, recover_steps=2, recover_data=dev)
    with pytest.raises(HeadcutError, match="data file not found"):
        headcut.prune(src, "magnitude", keep=4, data=train, recover_steps=2, recover_data=tmp_path / "nope.csv")
    result = run(
        "prune",
        src,
        "--method",
        "magnitude",
        "--keep",
        "4",
        "--data",
        train,
        "--eval-data",
        dev,
        "--recover-steps",
        "2",
        "--recover-data",
        extra,
        "--out",
        tmp_path / "p",
    )
    assert result.exit_code == 0, result.output
    assert "(alpha 1, with 16 unlabelled rows of" in result.stdout
    bad = run(
        "prune",
        src,
        "--method",
        "magnitude",
        "--keep",
        "4",
        "--data",
        train,
        "--recover-data",
        extra,
        "--out",
        tmp_path / "q",
    )
    one_line_error(bad, "--recover-data is read by the recovery fine-tuning: it needs --recover-steps N")
    t5 = save_tiny(tmp_path / "t5", "t5", "T5ForConditionalGeneration")
    pairs = write_rows(tmp_path / "pairs.csv", [{"source": "a b c", "target": "c b a"}] * 8)
    with pytest.raises(HeadcutError, match="seq2seq model"):
        headcut.prune(t5, "magnitude", keep=4, data=pairs, recover_steps=2, recover_data=extra)


def _recovery_case(tmp_path, steps: int):
    """A tiny classifier, its training and eval rows, batch options, and its magnitude cut to 4 heads with ``steps``
    of plain recovery (what a recovery option is compared with)."""
    import headcut

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=1))
    options = {"batch_size": 8}
    plain = headcut.prune(src, "magnitude", keep=4, data=train, recover_steps=steps, data_options=options)
    return src, train, dev, options, plain


def test_recover_hidden_weight_adds_hidden_state_matching_to_the_recovery(tmp_path):
    import headcut

    src, train, dev, options, plain = _recovery_case(tmp_path, 3)
    hidden = headcut.prune(
        src,
        "magnitude",
        keep=4,
        data=train,
        eval_data=dev,
        recover_steps=3,
        data_options=options,
        recover_hidden_weight=2.0,
    )
    assert hidden.mask.keep == plain.mask.keep
    recovery = hidden.report["recovery"]
    assert recovery["config"]["hidden_weight"] == 2.0 and plain.report["recovery"]["config"]["hidden_weight"] == 0.0
    assert all(e["hidden"] > 0 for e in recovery["curve"])
    assert not any("hidden" in e for e in plain.report["recovery"]["curve"])
    # the logged loss is the distillation loss plus 2 x the hidden-state term
    first = recovery["curve"][0]
    expected = 0.5 * 4 * first["kl"] + 0.5 * first["task_loss"] + 2.0 * first["hidden"]  # alpha 0.5, T 2
    assert first["loss"] == pytest.approx(expected, rel=1e-4)
    assert any(not torch.equal(v, plain.model.state_dict()[k]) for k, v in hidden.model.state_dict().items())
    hidden.save(tmp_path / "o")
    assert headcut.evaluate(tmp_path / "o", dev).value == pytest.approx(hidden.report["metric"]["after"])
    assert "hidden states matched with weight 2" in (tmp_path / "o" / "README.md").read_text()

    with pytest.raises(
        HeadcutError, match="recover_hidden_weight weighs a term of the recovery fine-tuning: it needs recover_steps"
    ):
        headcut.prune(src, "magnitude", keep=4, data=train, recover_hidden_weight=1.0)
    with pytest.raises(HeadcutError, match="recover_hidden_weight must be >= 0 and finite"):
        headcut.prune(src, "magnitude", keep=4, data=train, recover_steps=2, recover_hidden_weight=-1.0)
    _recovery_flag(
        tmp_path,
        src,
        train,
        ["--recover-hidden-weight", "1"],
        "hidden states matched (weight 1)",
        "--recover-hidden-weight weighs a term of the recovery fine-tuning: it needs --recover-steps N",
    )


def _recovery_flag(tmp_path, src, train, flag: list[str], printed: str, refusal: str) -> None:
    """``flag`` on the command line: with ``--recover-steps`` the summary prints ``printed``; without, the one-line
    error ``refusal``."""
    result = run(
        "prune",
        src,
        "--method",
        "magnitude",
        "--keep",
        "4",
        "--data",
        train,
        "--recover-steps",
        "2",
        *flag,
        "--out",
        tmp_path / "p",
    )
    assert result.exit_code == 0, result.output
    assert printed in result.stdout
    bad = run("prune", src, "--method", "magnitude", "--keep", "4", "--data", train, *flag, "--out", tmp_path / "q")
    one_line_error(bad, refusal)


def test_via_cuts_in_two_rounds_and_reports_one_cut_of_the_input_model(tmp_path):
    import headcut

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")  # 2 blocks x 4 heads
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=1))
    # magnitude scores read only the weights, which a cut leaves as they are: two rounds choose the one-shot heads,
    # and the composed mask is in the input model's numbering
    one = headcut.prune(src, "magnitude", keep=3)
    two = headcut.prune(src, "magnitude", keep=3, via=6)
    assert two.mask.keep == one.mask.keep and two.report["mask"] == one.report["mask"]
    assert two.report["heads"]["before"] == 8 and two.report["heads"]["after"] == 3
    assert two.report["params"] == one.report["params"]
    (first,) = two.report["rounds"]
    assert first["keep"] == 6 and sum(map(len, first["mask"]["keep"].values())) == 6
    assert all(set(two.mask.keep[b]) <= set(first["mask"]["keep"][b]) for b in two.mask.keep)
    ids = torch.randint(5, 90, (2, 7))
    with torch.no_grad():
        assert torch.allclose(one.model(input_ids=ids).logits, two.model(input_ids=ids).logits, atol=1e-6)

    tuned = headcut.prune(
        src,
        "fluctuation",
        keep=3,
        via=6,
        data=train,
        eval_data=dev,
        refit=True,
        recover_steps=2,
        recover_hidden_weight=1.0,
        data_options={"batch_size": 8},
    )
    (first,) = tuned.report["rounds"]
    assert set(first["metric"]) == {"after_pruning", "after_refit", "after"} and first["recovery"]["steps"] == 2
    assert first["refit"]["refitted"] and tuned.report["recovery"]["steps"] == 2
    assert tuned.report["metric"]["before"] == pytest.approx(headcut.evaluate(src, dev).value)
    tuned.save(tmp_path / "o")
    assert headcut.evaluate(tmp_path / "o", dev).value == pytest.approx(tuned.report["metric"]["after"])
    assert (
        "two rounds: first to 6 heads, refitted and fine-tuned for 2 steps"
        in (tmp_path / "o" / "README.md").read_text()
    )
    replay = headcut.export(src, mask=tuned.mask)  # the composed mask replays the structure on the input model
    assert replay.report["heads_per_block_after"] == tuned.report["heads"]["per_block_after"]

    for bad, match in (
        (dict(keep=3, via=9), "via 9 must lie between the heads kept in the end \\(3\\) and the model's 8"),
        (dict(keep=3, via=3), "via 3 must lie between"),
        (dict(sparsity=0.5, via=2), "via 2 must lie between the heads kept in the end \\(4\\)"),
        (dict(via=6), "no budget"),
    ):
        with pytest.raises(HeadcutError, match=match):
            headcut.prune(src, "magnitude", **bad)
    with pytest.raises(
        HeadcutError,
        match="via cuts in two rounds, each scored on the model the one before left: "
        "it applies to the score-based methods",
    ):
        headcut.prune(src, "pass", keep=3, via=6, data=train)
    with pytest.raises(HeadcutError, match="via cuts to a number of heads in two rounds"):
        headcut.prune(src, "magnitude", max_drop=0.1, via=6, eval_data=dev)
    result = run(
        "prune",
        src,
        "--method",
        "fluctuation",
        "--keep",
        "3",
        "--via",
        "6",
        "--data",
        train,
        "--eval-data",
        dev,
        "--refit",
        "--out",
        tmp_path / "p",
    )
    assert result.exit_code == 0, result.output
    assert "round 1: cut to 6 heads; accuracy after the cut" in result.stdout
    bad = run("prune", src, "--method", "magnitude", "--keep", "3", "--via", "8", "--out", tmp_path / "q")
    one_line_error(bad, "--via 8 must lie between the heads kept in the end (3) and the model's 8")


def test_via_steps_sets_the_first_rounds_recovery_steps(tmp_path):
    import headcut

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")  # 2 blocks x 4 heads
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    options = {"batch_size": 8}
    short = headcut.prune(
        src, "fluctuation", keep=3, via=6, data=train, recover_steps=3, via_steps=1, data_options=options
    )
    (first,) = short.report["rounds"]
    assert first["recovery"]["steps"] == 1 and short.report["recovery"]["steps"] == 3
    assert len(short.report["recovery"]["curve"]) == 3
    none = headcut.prune(
        src, "fluctuation", keep=3, via=6, data=train, recover_steps=2, via_steps=0, data_options=options
    )
    (first,) = none.report["rounds"]
    assert "recovery" not in first and "after" not in first["metric"] and none.report["recovery"]["steps"] == 2
    same = headcut.prune(src, "fluctuation", keep=3, via=6, data=train, recover_steps=2, data_options=options)
    assert same.report["rounds"][0]["recovery"]["steps"] == 2  # default: --recover-steps in both rounds

    with pytest.raises(
        HeadcutError, match="via_steps sets the recovery steps of via's first round: it needs via K and recover_steps N"
    ):
        headcut.prune(src, "fluctuation", keep=3, data=train, recover_steps=2, via_steps=1)
    with pytest.raises(HeadcutError, match="via_steps sets the recovery steps"):
        headcut.prune(src, "fluctuation", keep=3, via=6, data=train, via_steps=1)
    with pytest.raises(HeadcutError, match="via_steps must be an integer >= 0"):
        headcut.prune(src, "fluctuation", keep=3, via=6, data=train, recover_steps=2, via_steps=-1)
    result = run(
        "prune",
        src,
        "--method",
        "fluctuation",
        "--keep",
        "3",
        "--via",
        "6",
        "--data",
        train,
        "--recover-steps",
        "2",
        "--via-steps",
        "1",
        "--out",
        tmp_path / "p",
    )
    assert result.exit_code == 0, result.output
    assert "first to 6 heads and fine-tuned for 1 step," in (tmp_path / "p" / "README.md").read_text()
    bad = run(
        "prune",
        src,
        "--method",
        "fluctuation",
        "--keep",
        "3",
        "--via-steps",
        "1",
        "--data",
        train,
        "--recover-steps",
        "2",
        "--out",
        tmp_path / "q",
    )
    one_line_error(
        bad, "--via-steps sets the recovery steps of --via's first round: it needs --via K and --recover-steps N"
    )


def test_hidden_matching_is_zero_for_the_teacher_itself_and_trains_towards_it():
    """hidden_matching(teacher, teacher) is 0 and 1 for all-zero states; padding does not count; finetune with
    hidden_weight logs the term and runs the teacher once per step (its states are not cached)."""
    from headcut.config import FinetuneConfig
    from headcut.training.finetuning import finetune, frozen_teacher, hidden_matching

    model = make_model("bert", "BertForSequenceClassification")
    cal = calibration(model)
    batch = cal.batches[0]
    with torch.no_grad():
        states = list(model(**batch, output_hidden_states=True).hidden_states)
    mask = batch["attention_mask"]
    assert float(hidden_matching(states, states, mask)) == 0.0
    assert float(hidden_matching([torch.zeros_like(s) for s in states], states, mask)) == pytest.approx(1.0)
    padded = torch.ones_like(mask)
    padded[:, -1] = 0
    noisy = [s.clone() for s in states]
    for s in noisy:
        s[:, -1] += 100.0  # only padded positions differ
    assert float(hidden_matching(noisy, states, padded)) == 0.0
    teacher = frozen_teacher(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    result = finetune(
        model, cal, FinetuneConfig(max_steps=6, lr=1e-3, hidden_weight=1.0, checkpoint_every=None), teacher=teacher
    )
    hidden = [e["hidden"] for e in result.history]
    assert len(hidden) == 6 and hidden[-1] < hidden[0]
    with pytest.raises(HeadcutError, match="hidden_weight must be >= 0"):
        FinetuneConfig(hidden_weight=-1.0).validate()


@pytest.mark.parametrize(
    "method, extra",
    [
        ("lottery", ["--keep", "3", "--reset-at", "2", "--prune-every", "2", "--eval-every", "2", "--max-steps", "4"]),
        ("auber", ["--episodes", "2", "--reward-examples", "6", "--layer-epochs", "1", "--max-steps", "3"]),
    ],
)
def test_lottery_and_auber_distil_from_the_unpruned_model(tmp_path, method, extra):
    """--alpha reaches the training loops of lottery and AUBER: their report has the distillation, the
    teacher runs once per distinct batch (the lottery's rewound iterations reuse the batches), and the
    result differs from the task loss alone."""
    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    train = write_rows(tmp_path / "train.csv", cls_rows(32, seed=1))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(16, seed=2))
    reports = []
    for alpha in ("0", "0.8"):
        result = run(
            "prune",
            src,
            "--method",
            method,
            "--data",
            train,
            "--eval-data",
            dev,
            "--seq-len",
            "16",
            "--batch-size",
            "8",
            "--alpha",
            alpha,
            "--out",
            tmp_path / f"o{alpha}",
            "--json",
            "-",
            *extra,
        )
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout))
    plain, kd = (r[method] for r in reports)
    assert plain["distillation"] is None
    stats = kd["distillation"]
    assert stats["alpha"] == 0.8 and stats["temperature"] == 2.0 and stats["teacher_forwards"] >= 1
    if method == "lottery":  # 4 distinct batches of 8, trained over and over: the cache answers the rest
        assert stats["teacher_forwards"] == 4 and stats["cache_hits"] > 0
    import headcut

    a, b = headcut.load(tmp_path / "o0"), headcut.load(tmp_path / "o0.8")
    assert reports[0]["mask"] != reports[1]["mask"] or any(
        not torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values())
    )


def test_mixup_distillation_is_zero_for_the_teacher_itself_and_deterministic():
    """MixKD's term (mixed input embeddings, KL to the teacher on them) is 0 for the teacher itself, the same for
    the same seed and step, logged by finetune, and refused for a task that is not sequence classification."""
    from headcut.config import FinetuneConfig
    from headcut.training.finetuning import DistillationLoss, finetune, frozen_teacher

    model = make_model("bert", "BertForSequenceClassification")
    cal = calibration(model)
    batch = cal.batches[0]
    teacher = frozen_teacher(model)
    same = DistillationLoss("classification", teacher, 0.5, 2.0, mixup=0.4)
    assert float(same.mixed_kl(model.eval(), batch, 3)) == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    first, again = (
        float(DistillationLoss("classification", teacher, 0.5, 2.0, mixup=0.4, seed=1).mixed_kl(model, batch, 3))
        for _ in range(2)
    )
    assert first == again > 0
    result = finetune(
        model, cal, FinetuneConfig(max_steps=4, lr=1e-3, mixup=0.4, checkpoint_every=None), teacher=teacher
    )
    assert len(result.history) == 4 and all(e["kl_mixed"] >= 0 for e in result.history)
    with pytest.raises(HeadcutError, match="needs a sequence classifier"):
        DistillationLoss("causal-lm", teacher, 0.5, 2.0, mixup=0.4)
    with pytest.raises(HeadcutError, match="mixup must be >= 0"):
        FinetuneConfig(mixup=-1.0).validate()


def test_majority_note_flags_a_pruned_classifier_no_better_than_its_most_frequent_label() -> None:
    from headcut.jobs.prune.job import _majority_note

    cal = Calibration(
        task="classification",
        batches=[{"labels": torch.tensor([0, 1, 1])}, {"labels": torch.tensor([1, 2])}],
        examples=5,
        source="rows",
        columns={},
        label_names=["neg", "pos", "plot"],
    )
    assert cal.majority() == ("pos", 0.6)
    (note,) = _majority_note(cal, before=0.8, after=0.6)
    assert "'pos'" in note and "0.6000" in note and "0.8000" in note
    assert _majority_note(cal, before=0.8, after=0.61) == []  # better than the majority answer
    assert _majority_note(cal, before=0.6, after=0.4) == []  # the input model was no better either
    assert _majority_note(None, before=0.8, after=0.2) == []
    lm = Calibration(task="causal-lm", batches=[{"labels": torch.tensor([[1, 2]])}], examples=1, source="t", columns={})
    assert lm.majority() is None and _majority_note(lm, before=3.0, after=9.0) == []


def test_recover_average_runs_the_recovery_at_a_constant_rate_and_averages_its_weights(tmp_path):
    import headcut

    src, train, dev, options, plain = _recovery_case(tmp_path, 4)
    averaged = headcut.prune(
        src, "magnitude", keep=4, data=train, eval_data=dev, recover_steps=4, data_options=options, recover_average=0.5
    )
    config = averaged.report["recovery"]["config"]
    assert (config["average_last"], config["schedule"]) == (0.5, "constant")
    assert (plain.report["recovery"]["config"]["average_last"], plain.report["recovery"]["config"]["schedule"]) == (
        0.0,
        "linear",
    )
    assert [e["lr"] for e in averaged.report["recovery"]["curve"]] == [5e-5] * 4  # constant
    assert any(not torch.equal(v, plain.model.state_dict()[k]) for k, v in averaged.model.state_dict().items())
    averaged.save(tmp_path / "o")
    assert headcut.evaluate(tmp_path / "o", dev).value == pytest.approx(averaged.report["metric"]["after"])
    assert "weights averaged over the last 0.5 of the steps" in (tmp_path / "o" / "README.md").read_text()
    # both rounds of --via average
    two = headcut.prune(
        src, "magnitude", keep=3, via=6, data=train, recover_steps=2, data_options=options, recover_average=1.0
    )
    assert two.report["recovery"]["config"]["average_last"] == 1.0

    with pytest.raises(
        HeadcutError, match="recover_average averages the weights of the recovery fine-tuning: it needs recover_steps"
    ):
        headcut.prune(src, "magnitude", keep=4, data=train, recover_average=0.5)
    with pytest.raises(HeadcutError, match=r"recover_average must be in \[0, 1\]"):
        headcut.prune(src, "magnitude", keep=4, data=train, recover_steps=2, recover_average=2.0)
    _recovery_flag(
        tmp_path,
        src,
        train,
        ["--recover-average", "0.5"],
        "weights averaged over the last 0.5 of the steps (constant LR)",
        "--recover-average averages the weights of the recovery fine-tuning: it needs --recover-steps N",
    )
