"""Malformed values are one-line errors (exit 2 on the command line, a HeadcutError in Python), never a
traceback: numbers written in other scripts' digits (``²`` passes ``str.isdigit``) or too long for ``int()``
or for torch, integers past 64 bits, encoding names Python cannot decode with, device names torch misreads,
resume checkpoints whose optimizer or LR-schedule state does not fit the run (refused before training starts),
and optional packages that are installed but fail on import.

The module-wide fixture ``root`` holds a tiny BERT classifier (models/m), a tiny GPT-2 (models/g) and the
classifier's training rows (train.csv); an autouse fixture checks that the two models are unchanged."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import cls_rows, digest, one_line_error, run, save_tiny, write_rows

import headcut
from headcut.errors import HeadcutError
from headcut.training import CHECKPOINT_NAME
from headcut.training.checkpoint import checkpoint_dir_for

CLS = "BertForSequenceClassification"
SMALL = {"seq_len": 16, "batch_size": 4}
LONG = "1" * 5000  # more digits than int() reads (4300)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("values")
    save_tiny(folder / "models" / "m", "bert", CLS)
    save_tiny(folder / "models" / "g", "gpt2", "GPT2LMHeadModel")
    write_rows(folder / "train.csv", cls_rows(16, seed=0))
    return folder


@pytest.fixture(scope="module")
def model_dir(root) -> Path:
    return root / "models" / "m"


@pytest.fixture(scope="module")
def lm_dir(root) -> Path:
    return root / "models" / "g"


@pytest.fixture(scope="module")
def train_csv(root) -> Path:
    return root / "train.csv"


@pytest.fixture(autouse=True)
def models_untouched(root):
    before = {name: digest(root / "models" / name) for name in ("m", "g")}
    yield
    assert {name: digest(root / "models" / name) for name in ("m", "g")} == before


def refused(call: Callable[[], Any], *needles: str) -> str:
    """``call()`` raises a one-line HeadcutError naming every needle; its message."""
    with pytest.raises(HeadcutError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text, text
    for needle in needles:
        assert needle in text, text
    return text


# ---- numbers written as text: --windows ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "windows",
    ["²", "128,²", "٣٢", "１２８", LONG, f"128,{LONG}"],
    ids=["sup", "128-sup", "arabic", "fullwidth", "long", "128-long"],
)
def test_window_lengths_take_ascii_digits_only(lm_dir, train_csv, windows):
    """``"²".isdigit()`` holds but int() refuses it; ``"٣٢"`` and ``"１２８"`` are digits int() reads (32, 128),
    which no one types for a window length; 5000 digits are more than int() reads."""
    one_line_error(run("eval", lm_dir, "--data", train_csv, "--windows", windows), "--windows takes window lengths")
    refused(lambda: headcut.evaluate(str(lm_dir), str(train_csv), windows=windows), "windows takes window lengths")


@pytest.mark.parametrize("windows", [10**5000, [128, 10**5000], -(10**5000)], ids=["long", "in-a-list", "negative"])
def test_window_lengths_given_as_integers_out_of_range(lm_dir, train_csv, windows):
    refused(lambda: headcut.evaluate(str(lm_dir), str(train_csv), windows=windows), "windows takes window lengths")


# ---- numbers written as text: labels in the data ---------------------------------------------------------


@pytest.mark.parametrize("label", ["²", "-²", LONG], ids=["sup", "minus-sup", "long"])
def test_a_label_that_is_no_ascii_number_is_an_unknown_label(model_dir, tmp_path, label):
    data = write_rows(
        tmp_path / "labels.csv",
        [{"text": "the movie was good", "label": label}, {"text": "the movie was bad", "label": "1"}],
    )
    one_line_error(run("eval", model_dir, "--data", data), "is not among the model's labels")
    refused(lambda: headcut.evaluate(str(model_dir), str(data)), "is not among the model's labels")


# ---- encodings ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding", ["utf\x008", "utf-8\x00", "\udc80", "undefined"], ids=["nul", "nul-end", "surrogate", "undefined"]
)
def test_an_encoding_python_cannot_decode_with_is_refused_up_front(model_dir, train_csv, encoding):
    """A NUL or a lone surrogate makes codecs.lookup raise ValueError; ``undefined`` is a codec that refuses
    to decode anything (UnicodeError when the data is read)."""
    one_line_error(
        run("eval", model_dir, "--data", train_csv, "--encoding", encoding), "is not a text encoding Python knows"
    )
    refused(
        lambda: headcut.evaluate(str(model_dir), str(train_csv), data_options={"encoding": encoding}),
        "is not a text encoding Python knows",
    )
    refused(
        lambda: headcut.finetune(str(model_dir), str(train_csv), max_steps=1, data_options={"encoding": encoding}),
        "is not a text encoding",
    )


# ---- devices --------------------------------------------------------------------------------------------


@pytest.fixture
def one_gpu(monkeypatch):
    """torch sees one CUDA device (none is used: every case is refused before a model is loaded)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.parametrize(
    ("device", "needle"),
    [
        ("cuda:٣", "unknown --device"),
        ("cuda:99999999999999999999", "unknown --device"),
        ("cuda:0012", "unknown --device"),
        ("cuda:128", "this machine has 1 CUDA device"),  # torch reads cuda:128 as cuda:-128
    ],
)
def test_a_device_index_torch_misreads_is_refused(model_dir, train_csv, one_gpu, device, needle):
    one_line_error(run("eval", model_dir, "--data", train_csv, "--device", device), needle)
    refused(
        lambda: headcut.evaluate(str(model_dir), str(train_csv), device=device), needle.replace("--device", "device")
    )


# ---- integers beyond torch's (and past 4300 digits) --------------------------------------------------------

BIG = str(10**20)  # more than a seed torch takes (2**64) and than a C long long


@pytest.mark.parametrize("command", ["eval", "score"])
def test_a_seed_torch_cannot_take_is_refused(model_dir, train_csv, command):
    one_line_error(
        run(command, model_dir, "--data", train_csv, "--seed", BIG),
        f"--seed {BIG} is out of range: integers here fit in 64 bits",
    )
    call = headcut.evaluate if command == "eval" else headcut.score
    refused(
        lambda: call(str(model_dir), data=str(train_csv), seed=10**20), "seed 100000000000000000000 is out of range"
    )
    refused(lambda: call(str(model_dir), data=str(train_csv), seed=-(10**5000)), "seed -<an integer of", "bits")


@pytest.mark.parametrize(
    ("flag", "needle"),
    [("--threads", "threads must be at most"), ("--batch-size", "batch_size must be at most 2**63 - 1")],
)
def test_bench_counts_torch_cannot_take_are_refused(model_dir, flag, needle):
    """torch unpacks them into a C long long (or abort in OpenMP: more threads than it can make)."""
    one_line_error(run("bench", model_dir, flag, BIG), f"{flag} {BIG} is out of range: integers here fit in 64 bits")
    refused(lambda: headcut.bench([str(model_dir)], **{flag[2:].replace("-", "_"): 2**63}), needle)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda m, d: headcut.finetune(m, d, max_steps=1, lr=10**400), "lr must be a finite number"),
        (
            lambda m, d: headcut.finetune(m, d, max_steps=-(10**5000)),
            "max_steps -<an integer of 16610 bits> is out of range",
        ),
        (lambda m, d: headcut.evaluate(m, d, data_options={"seq_len": 10**5000}), "out of range"),
        (lambda m, d: headcut.evaluate(m, d, lm_eval="boolq", lm_eval_limit=-(10**5000)), "lm_eval_limit must be"),
        (lambda m, d: headcut.prune(m, "random", sparsity=10**400), "sparsity must be a finite number"),
    ],
    ids=["lr", "max_steps", "seq_len", "lm_eval_limit", "sparsity"],
)
def test_integers_too_long_to_print_or_to_be_floats_are_refused(model_dir, train_csv, call, needle):
    refused(lambda: call(str(model_dir), str(train_csv)), needle)


def test_a_seed_at_the_end_of_the_range_works_where_a_method_derives_others(model_dir, train_csv, tmp_path):
    """The lottery trains each iteration with seed + i: past 2**64 - 1 it wraps round, as torch does."""
    out = tmp_path / "pruned"
    result = run(
        "prune",
        model_dir,
        "--method",
        "lottery",
        "--keep",
        "6",
        "--data",
        train_csv,
        "--seed",
        str(2**64 - 1),
        "--reset-at",
        "1",
        "--prune-every",
        "1",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file()


def test_a_stale_temporary_folder_named_with_an_impossible_pid_is_kept(model_dir, train_csv, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    odd = tmp_path / f"headcut-data-{'9' * 30}-x"
    odd.mkdir()
    assert run("eval", model_dir, "--data", train_csv, "--max-examples", "4").exit_code == 0
    assert odd.is_dir()


# ---- resume checkpoints that do not fit the run ----------------------------------------------------------


@pytest.fixture(scope="module")
def good_checkpoint(root, model_dir, train_csv) -> Path:
    """The checkpoint folder of a 3-step fine-tuning run (checkpointed every step)."""
    ckpt = root / "good.headcut-checkpoint"
    headcut.finetune(
        str(model_dir), str(train_csv), checkpoint_dir=ckpt, max_steps=3, checkpoint_every=1, data_options=SMALL
    )
    return ckpt


def _first_state(state: dict[str, Any]) -> dict[str, Any]:
    return next(iter(state["optimizer"]["state"].values()))


def _moments(shape: tuple[int, ...]) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        for entry in state["optimizer"]["state"].values():
            entry["exp_avg"] = torch.zeros(shape)

    return edit


def _scheduler(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda state: state["scheduler"].update(fields)


def _group(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda state: state["optimizer"]["param_groups"][0].update(fields)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_moments((3,)), "its optimizer state does not fit this run's parameters: exp_avg of parameter 0"),
        (_moments((2, 3, 4)), "exp_avg of parameter 0 is a tensor of float32, shape (2, 3, 4)"),
        (lambda s: _first_state(s).pop("exp_avg_sq"), "lacks AdamW's step, exp_avg, exp_avg_sq"),
        (lambda s: _first_state(s).update(exp_avg=torch.zeros(99, 32, dtype=torch.int64)), "a tensor of int64"),
        (lambda s: _first_state(s).update(step=torch.tensor([1.0, 2.0])), "its optimizer step"),
        (lambda s: _first_state(s).update(step=torch.tensor(-2.0)), "its optimizer step -2.0 of parameter 0"),
        (lambda s: _first_state(s).update(step=torch.tensor(9.0)), "is not a whole number in [1, 3]"),
        (lambda s: s["optimizer"]["state"].update({999: dict(_first_state(s))}), "names a parameter 999"),
        (_group(eps="1e-8"), "its optimizer's eps '1e-8' (group 0)"),
        (_group(betas=(0.9, float("nan"))), "its optimizer's betas"),
        (_scheduler(last_epoch=-5, _step_count=-4), "its LR schedule is at step -5, not at its step 3"),
        (_scheduler(last_epoch=1, _step_count=2), "its LR schedule is at step 1, not at its step 3"),
        (_scheduler(_step_count=-1), "step count -1 is not 4"),
        (_scheduler(optimizer={}), "its LR schedule has a field 'optimizer'"),
        (_scheduler(base_lrs=["x", 1.0]), "base learning rates"),
        (_scheduler(lr_lambdas=[{"x": 1}, None]), "its LR schedule's functions are not this run's"),
        (lambda s: s["history"].append(5), "its history entry 3 is not a training step's"),
        (lambda s: s["history"][0].pop("loss"), "its history entry 0"),
    ],
    ids=[
        "moments-1d",
        "moments-3d",
        "no-exp-avg-sq",
        "int-moments",
        "step-vector",
        "step-negative",
        "step-ahead",
        "unknown-param",
        "eps-str",
        "betas-nan",
        "schedule-negative",
        "schedule-behind",
        "step-count",
        "schedule-optimizer",
        "base-lrs",
        "lambdas",
        "history-int",
        "history-no-loss",
    ],
)
def test_a_checkpoint_that_does_not_fit_the_run_is_refused_before_training(
    model_dir, train_csv, tmp_path, good_checkpoint, edit, needle
):
    """PyTorch's ``load_state_dict`` checks only the optimizer's group sizes and takes any LR-schedule fields:
    these states used to fail inside the first training step (a RuntimeError, ZeroDivisionError, KeyError),
    after the model and optimizer were already overwritten, or resume on a schedule of another step."""
    out = tmp_path / "tuned"
    ckpt = checkpoint_dir_for(out)
    shutil.copytree(good_checkpoint, ckpt)
    path = ckpt / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    written = path.read_bytes()
    settings = dict(max_steps=5, checkpoint_every=1, data_options=SMALL)
    refused(
        lambda: headcut.finetune(str(model_dir), str(train_csv), checkpoint_dir=ckpt, resume=True, **settings),
        f"the checkpoint in {ckpt}",
        needle,
    )
    res = run(
        "finetune",
        model_dir,
        "--data",
        train_csv,
        "--out",
        out,
        "--max-steps",
        "5",
        "--checkpoint-every",
        "1",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--resume",
    )
    one_line_error(res, f"--resume: the checkpoint in {ckpt}", needle)
    assert path.read_bytes() == written  # no step ran, no checkpoint was written over it
    assert not out.exists()


def test_a_checkpoint_refused_for_its_schedule_resumes_once_put_right(model_dir, train_csv, tmp_path, good_checkpoint):
    """The checks refuse what does not fit, not a checkpoint of this run: the same file, its LR schedule put
    back, resumes where it stopped."""
    ckpt = tmp_path / "ck"
    shutil.copytree(good_checkpoint, ckpt)
    path = ckpt / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    schedule = dict(state["scheduler"])
    state["scheduler"].update(last_epoch=2, _step_count=3)
    torch.save(state, path)
    settings = dict(checkpoint_dir=ckpt, resume=True, max_steps=5, checkpoint_every=1, data_options=SMALL)
    refused(lambda: headcut.finetune(str(model_dir), str(train_csv), **settings), "its LR schedule is at step 2")
    state["scheduler"] = schedule
    torch.save(state, path)
    tuned = headcut.finetune(str(model_dir), str(train_csv), **settings)
    assert tuned.result.resumed_from == 3 and tuned.result.steps == 5


def test_a_lottery_reset_checkpoint_that_does_not_fit_is_refused(model_dir, train_csv, tmp_path):
    from headcut.pruning import lottery

    ckpt = tmp_path / "ck"
    kwargs = dict(
        keep=6, data=str(train_csv), reset_at=1, prune_every=1, max_steps=1, data_options=SMALL, checkpoint_dir=ckpt
    )
    headcut.prune(str(model_dir), "lottery", **kwargs)
    path = ckpt / lottery.STATE_NAME
    state = torch.load(path, weights_only=True)
    for entry in state["reset"]["optimizer"]["state"].values():
        entry["exp_avg"] = torch.zeros(3)
    torch.save(state, path)
    refused(
        lambda: headcut.prune(str(model_dir), "lottery", resume=True, **kwargs),
        "its late-resetting checkpoint: its optimizer state does not fit this run's parameters",
    )
    state["reset"]["optimizer"] = torch.load(path, weights_only=True)["reset"]["optimizer"]
    state["reset"]["scheduler"]["last_epoch"] = -1
    for entry in state["reset"]["optimizer"]["state"].values():
        entry["exp_avg"] = torch.zeros_like(entry["exp_avg_sq"])
    torch.save(state, path)
    refused(
        lambda: headcut.prune(str(model_dir), "lottery", resume=True, **kwargs),
        "its LR schedule is at step -1, not at its step 1",
    )
    state["reset"]["scheduler"]["last_epoch"] = 1
    state["iterations"] = [{"heads": "x"}]
    torch.save(state, path)
    refused(
        lambda: headcut.prune(str(model_dir), "lottery", resume=True, **kwargs),
        "its iterations entry 0 is not one of the lottery's",
    )


# ---- optional packages installed but failing on import ------------------------------------------------------


def broken_package(
    folder: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str, submodule: str | None = None
) -> None:
    """A package ``name`` in ``folder``, first on sys.path, whose ``__init__`` (or ``submodule``) runs
    ``body``; the real one's modules are out of sys.modules for the test (and back after it)."""
    package = folder / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body if submodule is None else "")
    if submodule is not None:
        (package / f"{submodule}.py").write_text(body)
    for key in list(sys.modules):
        if key == name or key.startswith(name + "."):
            monkeypatch.delitem(sys.modules, key)
    monkeypatch.syspath_prepend(str(folder))


BROKEN = [
    ("raise RuntimeError('broken on purpose')", None, "RuntimeError: broken on purpose"),
    ("raise ImportError('cannot import name x from y')", None, "ImportError: cannot import name x"),
    ("import sys\nsys.exit(3)", None, "SystemExit: 3"),
    ("raise OSError('libfoo.so: cannot open shared object file')", "tasks", "OSError: libfoo.so"),
]


@pytest.mark.parametrize(("body", "submodule", "needle"), BROKEN)
def test_an_lm_eval_that_fails_on_import_is_one_line(lm_dir, train_csv, tmp_path, monkeypatch, body, submodule, needle):
    broken_package(tmp_path / "site", monkeypatch, "lm_eval", body, submodule)
    one_line_error(run("eval", lm_dir, "--lm-eval", "boolq"), "--lm-eval needs lm_eval", "fails on import", needle)
    refused(lambda: headcut.evaluate(str(lm_dir), lm_eval="boolq"), "lm_eval needs lm_eval", needle)


def test_a_zstandard_that_fails_on_import_is_one_line(model_dir, tmp_path, monkeypatch):
    broken_package(tmp_path / "site", monkeypatch, "zstandard", "raise RuntimeError('broken on purpose')")
    data = tmp_path / "train.csv.zst"
    data.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 16)
    one_line_error(run("eval", model_dir, "--data", data), "reading .zst data needs zstandard", "broken on purpose")
    refused(lambda: headcut.evaluate(str(model_dir), str(data)), "needs zstandard", "fails on import")


def test_a_matplotlib_that_fails_on_import_refuses_plot_before_scoring(model_dir, train_csv, tmp_path, monkeypatch):
    broken_package(tmp_path / "site", monkeypatch, "matplotlib", "raise RuntimeError('broken on purpose')")
    plot = tmp_path / "heads.png"
    one_line_error(
        run("score", model_dir, "--data", train_csv, "--scorer", "magnitude", "--plot", plot),
        "--plot needs matplotlib",
        "broken on purpose",
    )
    assert not plot.exists()


def test_an_onnxruntime_that_fails_on_import_is_one_line(model_dir, tmp_path, monkeypatch):
    broken_package(tmp_path / "site", monkeypatch, "onnxruntime", "raise RuntimeError('broken on purpose')")
    one_line_error(
        run("bench", model_dir, "--runtime", "onnxruntime", "--runs", "1", "--warmup", "0"),
        "--runtime onnxruntime needs onnxruntime",
        "broken on purpose",
    )
    refused(lambda: headcut.bench([str(model_dir)], runtime="onnxruntime"), "fails on import")
