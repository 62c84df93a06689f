"""Training that diverges: a run whose loss, gradients or weights become non-finite stops with a
one-line error (exit 2), writes no model and keeps only finite resume checkpoints; a float option that is
nan, inf or not a number is refused before any work; a damaged resume checkpoint (non-finite tensors, an
impossible step) is refused with one line.

The module-wide fixture ``model_dir`` is a tiny BERT classifier with a tokenizer; an autouse fixture checks
after every test that its bytes are unchanged."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import cls_rows, digest, one_line_error, run, save_tiny, write_rows

import headcut
from headcut.config import DistillOptions, FinetuneConfig, TrainConfig
from headcut.errors import HeadcutError
from headcut.pruning import lottery
from headcut.training import CHECKPOINT_NAME, Trainer, TrainingDiverged, finetuning
from headcut.training.checkpoint import checkpoint_dir_for
from headcut.training.finite import first_nonfinite

CLS = "BertForSequenceClassification"
SMALL = {"seq_len": 16, "batch_size": 4}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The module's folder: the tiny classifier in models/m, its training rows in train.csv."""
    folder = tmp_path_factory.mktemp("diverge")
    save_tiny(folder / "models" / "m", "bert", CLS)
    write_rows(folder / "train.csv", cls_rows(16, seed=0))
    return folder


@pytest.fixture(scope="module")
def model_dir(root) -> Path:
    return root / "models" / "m"


@pytest.fixture(scope="module")
def train_csv(root) -> Path:
    return root / "train.csv"


@pytest.fixture(autouse=True)
def input_untouched(request, root):
    folder = root / "models" / "m"
    before = digest(folder) if folder.exists() else None
    yield
    if before is not None:
        assert digest(folder) == before


def checkpoints_are_finite(folder: Path) -> list[Path]:
    """Every ``*.pt`` in the checkpoint folder (if any) holds only finite tensors; returns them."""
    files = sorted(folder.glob("*.pt")) if folder.exists() else []
    for f in files:
        state = torch.load(f, map_location="cpu", weights_only=True)
        assert first_nonfinite(state) is None, (f, first_nonfinite(state))
    return files


# ---- runs that diverge ---------------------------------------------------------------------------------


def test_finetune_with_a_huge_lr_stops_writes_nothing_and_keeps_the_last_good_checkpoint(
    model_dir, train_csv, tmp_path
):
    out = tmp_path / "tuned"
    res = run(
        "finetune",
        model_dir,
        "--data",
        train_csv,
        "--out",
        out,
        "--lr",
        "1e30",
        "--max-steps",
        "6",
        "--checkpoint-every",
        "1",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
    )
    line = one_line_error(
        res, "training diverged at step 2", "the loss is nan", "lr 1e+30", "lower --lr", "no model was written"
    )
    assert not out.exists()
    ckpt = checkpoint_dir_for(out)
    assert f"kept in {ckpt}" in line
    (kept,) = checkpoints_are_finite(ckpt)
    assert torch.load(kept, weights_only=True)["step"] == 1  # the step before the one that diverged


def test_finetune_that_diverges_before_any_checkpoint_leaves_no_checkpoint_folder(model_dir, train_csv, tmp_path):
    out = tmp_path / "tuned"
    res = run(
        "finetune",
        model_dir,
        "--data",
        train_csv,
        "--out",
        out,
        "--lr",
        "1e30",
        "--max-steps",
        "4",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
    )
    line = one_line_error(res, "training diverged", "nan")
    assert "kept in" not in line
    assert not out.exists() and not checkpoint_dir_for(out).exists()


def test_the_python_api_raises_a_headcut_error_and_returns_no_model(model_dir, train_csv, tmp_path):
    ckpt = tmp_path / "ck"
    with pytest.raises(TrainingDiverged, match="training diverged at step 2") as info:
        headcut.finetune(
            str(model_dir),
            str(train_csv),
            lr=1e30,
            max_steps=4,
            checkpoint_every=1,
            checkpoint_dir=ckpt,
            data_options=SMALL,
        )
    assert isinstance(info.value, HeadcutError) and info.value.step == 2 and info.value.checkpoint == ckpt
    assert len(checkpoints_are_finite(ckpt)) == 1


@pytest.mark.parametrize("method", ["dsp", "lag"])
def test_a_learned_gate_prune_with_a_huge_lr_writes_nothing(model_dir, train_csv, tmp_path, method):
    out = tmp_path / "pruned"
    res = run(
        "prune",
        model_dir,
        "--method",
        method,
        "--keep",
        "4",
        "--data",
        train_csv,
        "--out",
        out,
        "--lr",
        "1e30",
        "--max-steps",
        "4",
        "--checkpoint-every",
        "1",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
    )
    one_line_error(res, "training diverged at step 2", "lr 1e+30", "gate lr", "lower --lr or --gate-lr")
    assert not out.exists()
    assert len(checkpoints_are_finite(checkpoint_dir_for(out))) == 1


def test_recovery_fine_tuning_that_diverges_writes_nothing(model_dir, train_csv, tmp_path, monkeypatch):
    real = finetuning.finetune

    def hot(model: Any, train: Any, config: FinetuneConfig, **kw: Any) -> Any:
        return real(model, train, dataclasses.replace(config, lr=1e30), **kw)

    monkeypatch.setattr(finetuning, "finetune", hot)  # --recover-steps has no --lr of its own
    out = tmp_path / "pruned"
    res = run(
        "prune",
        model_dir,
        "--method",
        "magnitude",
        "--keep",
        "4",
        "--data",
        train_csv,
        "--out",
        out,
        "--recover-steps",
        "4",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
    )
    one_line_error(res, "training diverged at step 2", "the loss is nan")
    assert not out.exists()


def test_the_lottery_keeps_its_last_good_state(model_dir, train_csv, tmp_path):
    ckpt = tmp_path / "ck"
    with pytest.raises(TrainingDiverged, match="the last good state of the run is kept in") as info:
        headcut.prune(
            str(model_dir),
            "lottery",
            keep=4,
            data=str(train_csv),
            lr=1e30,
            reset_at=1,
            prune_every=2,
            checkpoint_dir=ckpt,
            data_options=SMALL,
        )
    assert str(ckpt) in str(info.value) and "\n" not in str(info.value)
    assert [p.name for p in checkpoints_are_finite(ckpt)] == [lottery.STATE_NAME]


def test_auber_fine_tuning_that_diverges_raises(model_dir, train_csv):
    with pytest.raises(TrainingDiverged, match="training diverged"):
        headcut.prune(
            str(model_dir),
            "auber",
            data=str(train_csv),
            lr=1e30,
            episodes=2,
            reward_examples=4,
            max_steps=3,
            data_options=SMALL,
        )


# ---- the engine's checks -------------------------------------------------------------------------------


class Line(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))


BATCHES = [{"x": torch.tensor([1.0, 2.0, 3.0])} for _ in range(4)]


def test_a_nan_loss_stops_before_the_update(tmp_path):
    model = Line()

    def loss_fn(m: torch.nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        loss = (m.w * batch["x"]).sum() ** 2
        return (loss * math.nan if step == 2 else loss), {}

    trainer = Trainer(
        model,
        None,
        BATCHES,
        TrainConfig(max_steps=5, lr=0.1, checkpoint_every=1),
        loss_fn=loss_fn,
        checkpoint_dir=tmp_path / "ck",
    )
    with pytest.raises(TrainingDiverged, match=r"at step 3: the loss is nan \(lr 0.1\).*step 2\) is kept in"):
        trainer.train()
    assert torch.isfinite(model.w).all() and trainer.step == 2  # no update from the nan step
    assert torch.load(tmp_path / "ck" / CHECKPOINT_NAME, weights_only=True)["step"] == 2


def test_weights_made_non_finite_after_a_step_are_never_checkpointed(tmp_path):
    model = Line()

    def after(step: int) -> None:
        if step == 2:
            model.w[0] = math.inf

    trainer = Trainer(
        model,
        None,
        BATCHES,
        TrainConfig(max_steps=5, lr=0.1, checkpoint_every=1),
        loss_fn=lambda m, b, s: ((m.w * b["x"]).sum(), {}),
        checkpoint_dir=tmp_path / "ck",
        after_step=after,
    )
    with pytest.raises(TrainingDiverged, match="at step 2: the weights are not finite after the update"):
        trainer.train()
    assert torch.load(tmp_path / "ck" / CHECKPOINT_NAME, weights_only=True)["step"] == 1


def test_a_model_with_nan_weights_is_refused_before_training():
    model = Line()
    with torch.no_grad():
        model.w[1] = math.nan
    trainer = Trainer(
        model, None, BATCHES, TrainConfig(max_steps=2), loss_fn=lambda m, b, s: ((m.w * b["x"]).sum(), {})
    )
    with pytest.raises(HeadcutError, match="non-finite values .* before training, in w"):
        trainer.train()


# ---- float options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("weight_decay", math.nan, "weight_decay"),
        ("weight_decay", math.inf, "weight_decay"),
        ("weight_decay", "0.1", "weight_decay"),
        ("max_grad_norm", math.inf, "max_grad_norm"),
        ("warmup_ratio", "0.1", "warmup_ratio"),
        ("gate_lr", "0.5", "gate_lr must"),
        ("lr", True, "lr must"),
        ("alpha", True, "alpha must"),
        ("temperature", True, "temperature must"),
        ("hidden_weight", True, "hidden_weight must"),
        ("seed", 2**70, "seed must"),
        ("seed", 1.5, "seed must"),
    ],
)
def test_float_options_must_be_finite_numbers_in_range(field, value, needle):
    for cls in (FinetuneConfig, DistillOptions):
        if field not in {f.name for f in dataclasses.fields(cls)}:
            continue
        with pytest.raises(HeadcutError, match=needle) as info:
            cls(**{field: value}).validate()
        assert "\n" not in str(info.value) and repr(value) in str(info.value)


def test_a_nan_weight_decay_through_the_api_is_refused_before_any_work(model_dir, train_csv, tmp_path):
    ckpt = tmp_path / "ck"
    with pytest.raises(HeadcutError, match="weight_decay must be .*finite.*nan"):
        headcut.finetune(str(model_dir), str(train_csv), weight_decay=float("nan"), max_steps=2, checkpoint_dir=ckpt)
    assert not ckpt.exists()
    res = run("finetune", model_dir, "--data", train_csv, "--out", tmp_path / "o", "--lr", "nan")
    one_line_error(res, "lr must be", "finite", "nan")


# ---- damaged resume checkpoints ------------------------------------------------------------------------


def _nan_weight(state: dict[str, Any]) -> None:
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name][0] = math.nan


def _nan_moment(state: dict[str, Any]) -> None:
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"].view(-1)[0] = math.inf


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_nan_weight, "non-finite values (nan or inf) in its weights, at bert."),
        (_nan_moment, "non-finite values (nan or inf) in its optimizer state, at state."),
        (lambda s: s.update(step=-1), "its step -1 is not a whole number"),
        (lambda s: s.update(step="1"), "its step '1' is not a whole number"),
        (lambda s: s.update(position=99), "its position 99"),
        (lambda s: s.update(order=torch.tensor([9, 9, 9, 9])), "its batch order"),
    ],
)
def test_a_damaged_resume_checkpoint_is_refused(model_dir, train_csv, tmp_path, edit, needle):
    out = tmp_path / "tuned"
    ckpt = checkpoint_dir_for(out)
    settings = dict(max_steps=3, checkpoint_every=1, data_options=SMALL)
    headcut.finetune(str(model_dir), str(train_csv), checkpoint_dir=ckpt, **settings)
    path = ckpt / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    with pytest.raises(HeadcutError, match="is damaged") as info:
        headcut.finetune(str(model_dir), str(train_csv), checkpoint_dir=ckpt, resume=True, **settings)
    assert needle in str(info.value) and "\n" not in str(info.value)
    res = run(
        "finetune",
        model_dir,
        "--data",
        train_csv,
        "--out",
        out,
        "--max-steps",
        "3",
        "--checkpoint-every",
        "1",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--resume",
    )
    one_line_error(res, f"--resume: the checkpoint in {ckpt} is damaged: ", needle)
    assert not out.exists()


def test_a_damaged_lottery_state_is_refused(model_dir, train_csv, tmp_path):
    ckpt = tmp_path / "ck"
    kwargs = dict(
        keep=6, data=str(train_csv), reset_at=1, prune_every=1, max_steps=1, data_options=SMALL, checkpoint_dir=ckpt
    )
    headcut.prune(str(model_dir), "lottery", **kwargs)
    path = ckpt / lottery.STATE_NAME
    state = torch.load(path, weights_only=True)
    good = {k: v.clone() for k, v in state["reset"]["model"].items()}
    _nan_weight(state["reset"])
    torch.save(state, path)
    with pytest.raises(HeadcutError, match="damaged: its late-resetting checkpoint holds non-finite values"):
        headcut.prune(str(model_dir), "lottery", resume=True, **kwargs)
    state["reset"]["model"] = good
    state["reset"]["step"] = -3
    torch.save(state, path)
    with pytest.raises(HeadcutError, match="at step -3, not at --reset-at 1"):
        headcut.prune(str(model_dir), "lottery", resume=True, **kwargs)


def test_a_model_with_a_block_cut_to_zero_heads_trains(model_dir, train_csv, tmp_path):
    """Its empty projections (zero-size weights) are no reason to stop: finiteness is checked on the rest."""
    from headcut.training.finite import all_finite

    assert all_finite([torch.zeros(0, 4), torch.ones(3)])
    assert not all_finite([torch.zeros(0, 4), torch.tensor([1.0, float("nan")])])
    slim = tmp_path / "slim"
    assert (
        run("export", model_dir, "--mask", _mask(tmp_path, {"drop": {"self.0": [0, 1, 2, 3]}}), "--out", slim).exit_code
        == 0
    )
    out = tmp_path / "tuned"
    result = run("finetune", slim, "--data", train_csv, "--max-steps", "2", "--out", out, "--seq-len", "16")
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file()


def _mask(folder: Path, mask: dict) -> Path:
    path = folder / "mask.json"
    path.write_text(json.dumps(mask))
    return path
