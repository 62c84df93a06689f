"""The least-squares refit of the output projections after a cut (``headcut.pruning.refit``, ``prune --refit``)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import CLASSES, FAMILIES, cls_rows, is_base_model, make_batch, make_model, run, save_tiny, write_rows

from headcut.data import Calibration, detect_task
from headcut.errors import HeadcutError
from headcut.model.masks import HeadMask
from headcut.model.surgery import model_blocks, slim
from headcut.pruning.refit import refit_outputs

#: one class with a task head per text family (data commands need one)
TEXT = {f: next(c for c in CLASSES[f] if not is_base_model(c)) for f in FAMILIES if f != "vit"}


def _calibration(model, n: int = 3) -> Calibration:
    return Calibration(
        task=detect_task(model),
        batches=[make_batch(model, seed=i) for i in range(n)],
        examples=3 * n,
        source="random",
        columns={},
    )


def _cut(model, empty_first: bool = True) -> HeadMask:
    """Keep whole KV groups, about half of each block's heads; the first block in forward order emptied."""
    blocks = model_blocks(model)
    keep = {}
    for i, b in enumerate(blocks):
        groups = max(1, b.kv_heads // 2) if b.kv_heads else 1
        keep[b.name] = [] if (i == 0 and empty_first) else list(range(min(b.heads, b.group_size * groups)))
    return HeadMask(keep)


@pytest.mark.parametrize("family", sorted(TEXT))
def test_refit_lowers_every_fit_error_and_leaves_an_uncut_model_exact(family):
    """On every text family: refitting a cut model lowers each projection's error against the unpruned model, a
    block that kept no head is skipped with its bias unchanged, and the refit of an uncut copy changes nothing
    (the unpruned weights are then the exact fit)."""
    teacher = make_model(family, TEXT[family])
    cal = _calibration(teacher)
    student = copy.deepcopy(teacher)
    mask = _cut(student)
    slim(student, mask, gqa="auto")
    empty = [b for b in model_blocks(student) if b.heads == 0]
    biases = {b.name: getattr(student.base_model.get_submodule(b.o), "bias", None) for b in empty}
    biases = {n: v.detach().clone() for n, v in biases.items() if v is not None}
    result = refit_outputs(student, teacher, cal)
    assert result.refitted and result.tokens > 0
    assert sorted(result.skipped) == sorted(b.name for b in empty)
    for r in result.refitted:
        assert r.error_after <= r.error_before, r
    assert any(r.error_after < 0.9 * r.error_before for r in result.refitted)
    for name, bias in biases.items():
        block = next(b for b in model_blocks(student) if b.name == name)
        assert torch.equal(student.base_model.get_submodule(block.o).bias, bias)

    same = copy.deepcopy(teacher)
    before = {k: v.clone() for k, v in same.state_dict().items()}
    again = refit_outputs(same, teacher, cal)
    assert all(r.error_before == pytest.approx(0.0, abs=1e-9) for r in again.refitted)
    for k, v in same.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=1e-5)


def test_refit_is_the_ridge_least_squares_solution():
    """The first block's refitted projection solves the ridge problem of the module's doc, checked against an
    independent solve (lstsq of the stacked system) on activations captured here."""
    teacher = make_model("roberta", TEXT["roberta"])
    cal = _calibration(teacher)
    student = copy.deepcopy(teacher)
    slim(student, _cut(student, empty_first=False), gqa="auto")
    first = model_blocks(student)[0]
    o_student = student.base_model.get_submodule(first.o)
    o_teacher = teacher.base_model.get_submodule(first.o)
    w0 = torch.cat([o_student.weight.detach().T, o_student.bias.detach()[None]]).double()
    zs, ys = [], []
    h1 = o_student.register_forward_pre_hook(lambda m, a: zs.append(a[0].detach()))
    h2 = o_teacher.register_forward_hook(lambda m, a, o: ys.append(o.detach()))
    with torch.no_grad():
        for batch in cal.batches:
            student(**batch)
            teacher(**batch)
    h1.remove()
    h2.remove()
    masks = [b["attention_mask"].bool() for b in cal.batches]
    z = torch.cat([zz[m] for zz, m in zip(zs, masks)]).double()
    z = torch.cat([z, torch.ones(len(z), 1, dtype=z.dtype)], 1)
    y = torch.cat([yy[m] for yy, m in zip(ys, masks)]).double()
    ridge = 0.05
    lam = ridge * float((z * z).sum(0).mean())
    stacked = torch.cat([z, lam**0.5 * torch.eye(z.shape[1], dtype=z.dtype)])
    target = torch.cat([y, lam**0.5 * w0])
    expected = torch.linalg.lstsq(stacked, target).solution
    refit_outputs(student, teacher, cal, ridge=ridge)
    torch.testing.assert_close(o_student.weight.detach().T.double(), expected[:-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(o_student.bias.detach().double(), expected[-1], rtol=1e-4, atol=1e-5)


def test_refit_refuses_a_bad_request():
    teacher = make_model("roberta", TEXT["roberta"])
    with pytest.raises(HeadcutError, match="ridge must be > 0"):
        refit_outputs(copy.deepcopy(teacher), teacher, _calibration(teacher), ridge=0.0)
    empty = Calibration(task="sequence-classification", batches=[], examples=0, source="none", columns={})
    with pytest.raises(HeadcutError, match="calibration set is empty"):
        refit_outputs(copy.deepcopy(teacher), teacher, empty)
    other = make_model("gpt2", TEXT["gpt2"])
    with pytest.raises(HeadcutError, match="not the cut model's source"):
        refit_outputs(other, teacher, _calibration(teacher))


def test_prune_refit_reports_saves_and_prints_it(tmp_path):
    """``prune(refit=True)``: the report's refit and metrics, the saved model evaluates to the reported metric, a
    refit without data is refused (API and CLI), and the summary prints the refit line."""
    import headcut

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    train = write_rows(tmp_path / "train.csv", cls_rows(24))
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12, seed=1))
    cut_only = headcut.prune(src, "magnitude", keep=4, eval_data=dev)
    refitted = headcut.prune(src, "magnitude", keep=4, data=train, eval_data=dev, refit=True)
    assert refitted.mask.keep == cut_only.mask.keep
    metric = refitted.report["metric"]
    assert metric["after_pruning"] == pytest.approx(cut_only.report["metric"]["after"])
    assert metric["after"] == metric["after_refit"]
    assert refitted.report["refit"]["refitted"] and not any("reads no data" in n for n in refitted.report["notes"])
    refitted.save(tmp_path / "o")
    assert headcut.evaluate(tmp_path / "o", dev).value == pytest.approx(metric["after"])
    with pytest.raises(HeadcutError, match="refit fits the kept heads' output projections"):
        headcut.prune(src, "magnitude", keep=4, refit=True)
    both = headcut.prune(src, "magnitude", keep=4, data=train, eval_data=dev, refit=True, recover_steps=2)
    assert both.report["metric"]["after_refit"] == pytest.approx(metric["after_refit"])
    assert both.report["recovery"]["steps"] == 2
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
        "--refit",
        "--out",
        tmp_path / "p",
    )
    assert result.exit_code == 0, result.output
    assert "refit: " in result.stdout and "after the refit" in result.stdout
    result = run("prune", src, "--method", "magnitude", "--keep", "4", "--refit", "--out", tmp_path / "q")
    assert result.exit_code != 0 and "--refit fits the kept heads' output projections" in result.output
