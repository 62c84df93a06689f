"""Data-parallel runs under ``accelerate launch``: 2 CPU processes (gloo) run prune with a learned-gate
method and finetune unchanged; the processes' gates and weights stay identical and the output is a
valid slimmed model. Skipped when the optional ``accelerate`` is not installed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cls_rows, save_tiny, write_rows

import headcut

pytest.importorskip("accelerate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``accelerate launch`` with 2 processes on CPU (--multi_gpu is accelerate's multi-process launcher;
    with no GPU visible headcut joins the group with gloo)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "headcut", *args]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dist")
    save_tiny(d / "model", "bert", "BertForSequenceClassification")
    write_rows(d / "train.csv", cls_rows(64, seed=0))
    write_rows(d / "dev.csv", cls_rows(16, seed=1))
    return d


def test_prune_pass_with_two_processes(tiny):
    out = tiny / "slim"
    res = launch("prune", str(tiny / "model"), "--method", "pass", "--keep", "3", "--data", str(tiny / "train.csv"),
                 "--eval-data", str(tiny / "dev.csv"), "--max-steps", "8", "--lambda-step", "2", "--seq-len", "16",
                 "--batch-size", "8", "--out", str(out), "--json", str(tiny / "prune.json"), cwd=tiny)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tiny / "prune.json").read_text())
    dist = report["training"]["distributed"]
    assert dist == {"processes": 2, "gate_max_difference": 0.0, "model_max_difference": 0.0}
    assert report["training"]["steps"] == 8
    model = headcut.load(out)
    assert sum(b.heads for b in headcut.model_blocks(model)) == 3
    # each process trained on its half of the 8 batches: 4 batches per epoch, 2 epochs in 8 steps
    assert report["training"]["curve"][-1]["step"] == 8


def test_finetune_with_two_processes(tiny):
    out = tiny / "ft"
    res = launch("finetune", str(tiny / "model"), "--data", str(tiny / "train.csv"), "--max-steps", "4",
                 "--seq-len", "16", "--batch-size", "8", "--out", str(out), "--json", str(tiny / "ft.json"), cwd=tiny)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tiny / "ft.json").read_text())
    assert report["distributed"] == {"processes": 2, "model_max_difference": 0.0}
    assert report["steps"] == 4
    headcut.load(out)
