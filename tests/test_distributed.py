"""Data-parallel runs on PyTorch's engines (headcut.training.parallel): 2 CPU processes (gloo) under
``accelerate launch`` and ``torchrun``, with DistributedDataParallel and FSDP2.

The check is the one a user relies on: two processes with batches of 8 train the same model as one process
with batches of 16 (the same global batch: each process takes every other batch of 8, in the same shuffled
order), up to floating-point rounding; with gradient accumulation, batches of 4 two at a time in each
process as batches of 8 two at a time in one. Dropout is off in the tiny model, so the runs draw the same random
numbers. The attention's key biases are left out of the weight comparison: their gradient is zero in exact
arithmetic (a key bias adds the same amount to every score of a query, which the softmax cancels), so
AdamW turns rounding noise of about 1e-10 into steps of about the learning rate; the logits, which the key
bias cannot change, are compared instead. Skipped when the optional ``accelerate`` is not installed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import cls_rows, save_tiny, write_rows
from safetensors.torch import load_file

import headcut
from headcut.data.tasks import load_tokenizer

pytest.importorskip("accelerate")

ENGINES = ("ddp", "fsdp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: PYTHONFAULTHANDLER: a worker that crashes prints where (a crash in a rank otherwise shows only its signal)
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")


def launch(*args: str, cwd: Path, fsdp_config: bool = False) -> subprocess.CompletedProcess:
    """``accelerate launch`` with 2 processes on CPU (--multi_gpu is accelerate's multi-process launcher;
    with no GPU visible headcut joins the group with gloo); ``fsdp_config``: accelerate's --use_fsdp, which
    headcut's ``--engine auto`` follows."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *(["--use_fsdp"] if fsdp_config else ["--multi_gpu"]),
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "headcut",
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def torchrun(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(script),
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def crashed(res: subprocess.CompletedProcess) -> bool:
    """Whether a rank of a ``torchrun`` died of a signal a Python program cannot raise (a crash in native code)."""
    return res.returncode != 0 and re.search(r"exitcode\s*:\s*-(11|7|6)\b", res.stderr) is not None


def one_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "headcut", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dist")
    save_tiny(
        d / "model", "bert", "BertForSequenceClassification", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    write_rows(d / "train.csv", cls_rows(64, seed=0))
    write_rows(d / "dev.csv", cls_rows(16, seed=1))
    return d


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def assert_same_model(a: Path, b: Path, dev: Path, atol: float = 2e-6) -> None:
    """The same weights (all but the key biases, see the module doc) and the same logits on ``dev``."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    compared = [k for k in wa if not k.endswith("key.bias")]
    worst = max((wa[k] - wb[k]).abs().max().item() for k in compared)
    assert worst < atol, worst
    ma, mb = headcut.load(a).eval(), headcut.load(b).eval()
    tok = load_tokenizer(a)
    import csv

    texts = [row["text"] for row in csv.DictReader(dev.open())]
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        gap = (ma(**enc).logits - mb(**enc).logits).abs().max().item()
    assert gap < atol, gap


@pytest.fixture(scope="module")
def finetuned_once(tiny) -> Path:
    out = tiny / "ft-one"
    res = one_process(
        "finetune",
        str(tiny / "model"),
        "--data",
        str(tiny / "train.csv"),
        "--max-steps",
        "4",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
        "--grad-accum",
        "2",
        "--out",
        str(out),
        "-q",
        cwd=tiny,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_finetune_two_processes_equal_one(tiny, finetuned_once, engine):
    out = tiny / f"ft-{engine}"
    # batches of 4, two per step, in each of 2 processes: the one-process run's two batches of 8 a step (each
    # process takes every other batch of 4 and the same shuffled order of its 8, so a step sees the same rows)
    res = launch(
        "finetune",
        str(tiny / "model"),
        "--data",
        str(tiny / "train.csv"),
        "--max-steps",
        "4",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--grad-accum",
        "2",
        "--engine",
        engine,
        "--out",
        str(out),
        "--json",
        str(tiny / f"ft-{engine}.json"),
        cwd=tiny,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tiny / f"ft-{engine}.json").read_text())
    assert report["distributed"] == {"processes": 2, "engine": engine, "model_max_difference": 0.0}
    assert report["steps"] == 4
    assert_same_model(finetuned_once, out, tiny / "dev.csv")
    assert "Warning" not in res.stderr.replace("UserWarning: Dropout", "")  # the engines run quietly


@pytest.fixture(scope="module")
def pruned_once(tiny) -> Path:
    out = tiny / "pass-one"
    res = one_process(
        "prune",
        str(tiny / "model"),
        "--method",
        "pass",
        "--keep",
        "3",
        "--data",
        str(tiny / "train.csv"),
        "--max-steps",
        "8",
        "--lambda-step",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "16",
        "--out",
        str(out),
        "--json",
        str(tiny / "pass-one.json"),
        "-q",
        cwd=tiny,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_prune_pass_two_processes_equal_one(tiny, pruned_once, engine):
    out = tiny / f"pass-{engine}"
    res = launch(
        "prune",
        str(tiny / "model"),
        "--method",
        "pass",
        "--keep",
        "3",
        "--data",
        str(tiny / "train.csv"),
        "--eval-data",
        str(tiny / "dev.csv"),
        "--max-steps",
        "8",
        "--lambda-step",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
        "--engine",
        engine,
        "--out",
        str(out),
        "--json",
        str(tiny / f"pass-{engine}.json"),
        cwd=tiny,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tiny / f"pass-{engine}.json").read_text())
    one = json.loads((tiny / "pass-one.json").read_text())
    dist = report["training"]["distributed"]
    assert dist == {"processes": 2, "engine": engine, "gate_max_difference": 0.0, "model_max_difference": 0.0}
    assert report["training"]["steps"] == 8
    assert report["mask"] == one["mask"]
    for a, b in zip(report["training"]["curve"], one["training"]["curve"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert sum(b.heads for b in headcut.model_blocks(headcut.load(out))) == 3
    assert_same_model(pruned_once, out, tiny / "dev.csv")


def test_accelerate_fsdp_config_selects_fsdp(tiny, finetuned_once):
    """``accelerate launch --use_fsdp`` with headcut's default ``--engine auto`` trains with FSDP."""
    out = tiny / "ft-accelerate-fsdp"
    res = launch(
        "finetune",
        str(tiny / "model"),
        "--data",
        str(tiny / "train.csv"),
        "--max-steps",
        "4",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--grad-accum",
        "2",
        "--out",
        str(out),
        "--json",
        str(tiny / "ft-acc.json"),
        cwd=tiny,
        fsdp_config=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tiny / "ft-acc.json").read_text())["distributed"]["engine"] == "fsdp"
    assert_same_model(finetuned_once, out, tiny / "dev.csv")


RESUME = """
import csv, sys, torch, headcut
from dataclasses import replace
from headcut.config import TrainConfig
from headcut.data.tasks import load_tokenizer
from headcut.training.distributed import from_env
from headcut.training.engine import Trainer

first, then, model_dir, data, work = sys.argv[1:6]
dist = from_env()
tok = load_tokenizer(model_dir)
rows = list(csv.DictReader(open(data)))
batches = []
for i in range(0, len(rows), 8):
    chunk = rows[i:i + 8]
    enc = tok([r["text"] for r in chunk], padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    batches.append({**enc, "labels": torch.tensor([int(r["label"]) for r in chunk])})
config = TrainConfig(max_steps=4, checkpoint_every=2, lr=1e-3, engine=first)

class Stop(Exception):
    pass

def stop_at_3(entry):
    if entry["step"] == 3:
        raise Stop

def trained(folder, interrupt):
    model = headcut.load(model_dir)
    t = Trainer(model, None, batches, config, checkpoint_dir=folder, dist=dist, on_step=stop_at_3 if interrupt else None)
    try:
        t.train()
        assert t.engine_name == first
    except Stop:  # as if the run were killed after step 3: its checkpoint at step 2 is on disk
        model = headcut.load(model_dir)
        t = Trainer(model, None, batches, replace(config, engine=then), checkpoint_dir=folder, dist=dist)
        t.resume()
        assert t.step == 2, t.step
        t.train()
        assert t.engine_name == then
    return {k: v.detach().clone() for k, v in model.state_dict().items()}

resumed = trained(work + "/a", True)
straight = trained(work + "/b", False)
worst = max((resumed[k] - straight[k]).abs().max().item() for k in resumed)
if dist.main:
    print("WORST", worst)
"""


@pytest.mark.parametrize("first,then", [("ddp", "ddp"), ("fsdp", "fsdp"), ("ddp", "fsdp")])
def test_resume_under_engine(tiny, tmp_path, first, then):
    """Interrupted under ``first``, resumed under ``then`` (the checkpoint layout is the same)."""
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    for attempt in range(2):
        work = tmp_path / f"attempt{attempt}"
        work.mkdir()
        res = torchrun(script, first, then, str(tiny / "model"), str(tiny / "train.csv"), str(work), cwd=tmp_path)
        if not (attempt == 0 and crashed(res)):
            break
        # once in some hundred runs under CI's load a gloo rank died of SIGSEGV inside torch (the other rank then
        # saw "Connection reset by peer"); a crash is run again once, in a fresh folder, and shown in the summary
        warnings.warn(f"a torchrun rank crashed; run again once:\n{res.stderr[-3000:]}", stacklevel=1)
    assert res.returncode == 0, res.stderr[-3000:]
    worst = float(res.stdout.split("WORST")[1].split()[0])
    # a run resumed under its own engine ends exactly where an uninterrupted one ends; under the other
    # engine up to rounding (FSDP's reduce-scatter adds the gradients in another order than DDP's all-reduce)
    assert worst == 0.0 if first == then else worst < 1e-6


def test_lottery_two_processes_equal_one(tiny):
    """The lottery's training phases (late resetting, rewinds) run data-parallel: the same heads and model."""
    common = [
        "prune",
        str(tiny / "model"),
        "--method",
        "lottery",
        "--keep",
        "4",
        "--data",
        str(tiny / "train.csv"),
        "--seq-len",
        "16",
        "-q",
    ]
    one = one_process(
        *common, "--batch-size", "16", "--out", str(tiny / "lt-one"), "--json", str(tiny / "lt-one.json"), cwd=tiny
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch(
        *common, "--batch-size", "8", "--out", str(tiny / "lt-two"), "--json", str(tiny / "lt-two.json"), cwd=tiny
    )
    assert two.returncode == 0, two.stderr[-3000:]
    reports = [json.loads((tiny / f"lt-{n}.json").read_text()) for n in ("one", "two")]
    assert reports[0]["mask"] == reports[1]["mask"]
    assert reports[0]["lottery"]["reset_loss"] == pytest.approx(reports[1]["lottery"]["reset_loss"], rel=1e-6)
    assert_same_model(tiny / "lt-one", tiny / "lt-two", tiny / "dev.csv", atol=1e-5)


def test_fsdp_refuses_shared_layers(tmp_path):
    save_tiny(tmp_path / "albert", "albert", "AlbertForSequenceClassification")
    write_rows(tmp_path / "train.csv", cls_rows(32, seed=0))
    res = launch(
        "finetune",
        str(tmp_path / "albert"),
        "--data",
        str(tmp_path / "train.csv"),
        "--max-steps",
        "1",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
        "--engine",
        "fsdp",
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "--engine fsdp cannot shard a layer that runs several times in one forward" in res.stderr
    assert "use --engine ddp" in res.stderr
    assert not (tmp_path / "out").exists()


def test_engine_in_one_process_is_a_note(tiny):
    """``--engine`` in a single process changes nothing, and says so (in words, with no option markers)."""
    done = headcut.finetune(
        tiny / "model", tiny / "train.csv", max_steps=1, engine="fsdp", data_options={"seq_len": 16, "batch_size": 8}
    )
    notes = done.report["notes"]
    assert "the fsdp engine applies to several processes (accelerate launch, torchrun); this run has one" in notes
    assert done.report["distributed"] is None
    assert not any("\x00" in n for n in notes)
